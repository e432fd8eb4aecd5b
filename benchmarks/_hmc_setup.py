"""Shared set-up of the HMC transition benchmarks (pure-JAX level).

:func:`warmed_up` runs ``DEERMALA``'s own sequential warmup on a benchmark
model (Hessian mass matrix, step size for its target acceptance) and returns
the potential in the coordinates the kernel solves in: whitened by the mass
matrix and rotated to the eigenvectors of the mean Hessian (``solve_basis=
"hessian"``). MALA and HMC chains are then run there with the identity
preconditioner, as the kernel runs them. :func:`tune_step_size` is a short
sequential dual-averaging run (NumPyro's ``dual_averaging``) toward a target
acceptance; :func:`ess_per_draw` runs a few sequential chains and returns the
smallest effective sample size per draw over the unconstrained coordinates.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import _setup  # noqa: F401  (puts the repository root on sys.path)
import jax  # noqa: E402
import jax.flatten_util  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.diagnostics import effective_sample_size  # noqa: E402
from numpyro.infer.hmc_util import dual_averaging  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402

import numpyro_deer  # noqa: E402
from benchmarks.models import BENCHMARK_MODELS  # noqa: E402


class Target(NamedTuple):
    name: str
    potential: Any  # potential of u, the solve coordinates
    u0: jax.Array  # the post-warmup state
    to_x: Any  # u -> unconstrained flat x
    mala_step_size: float  # DEERMALA's adapted step size (target 0.9)
    dim: int


def warmed_up(name: str, num_warmup: int = 1000, seed: int = 0) -> Target:
    """``DEERMALA``'s warmup on model ``name``; the target in its solve basis."""
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    kernel = numpyro_deer.DEERMALA(bench.model, method="sequential", block_size=16)
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=16, progress_bar=False
    )
    mcmc.warmup(jax.random.PRNGKey(seed), *args, **kwargs)
    state = mcmc.post_warmup_state
    _, potential_fn, _, _ = initialize_model(
        jax.random.PRNGKey(seed), bench.model, model_args=args, model_kwargs=kwargs
    )
    x0, unravel = jax.flatten_util.ravel_pytree(state.z)

    def potential_flat(x):
        return potential_fn(unravel(x))

    inv_mass = state.adapt_state.inverse_mass_matrix
    if inv_mass.ndim == 1:
        inv_mass = jnp.diag(inv_mass)
    chol = jnp.linalg.cholesky(inv_mass)

    def to_w(x):
        return jax.scipy.linalg.solve_triangular(chol, x, lower=True)

    def potential_w(w):
        return potential_flat(chol @ w)

    points = jax.vmap(to_w)(state.curvature_points)
    hessian = jnp.mean(jax.vmap(jax.hessian(potential_w))(points), axis=0)
    _, basis = jnp.linalg.eigh(0.5 * (hessian + hessian.T))

    def potential_u(u):
        return potential_w(basis @ u)

    def to_x(u):
        return chol @ (basis @ u)

    u0 = basis.T @ to_w(x0)
    return Target(
        name,
        potential_u,
        u0,
        to_x,
        float(state.adapt_state.step_size),
        int(x0.shape[0]),
    )


def tune_step_size(
    make_step, make_tape, u0, eps0: float, target: float, num: int, key
) -> float:
    """Dual averaging of ``log eps`` over ``num`` sequential transitions.

    ``make_step(eps)`` gives a step function ``(u, tape_t) -> (u, info)``.
    """
    da_init, da_update = dual_averaging()
    tape = make_tape(key, num, u0.shape[0], u0.dtype)

    def body(carry, tape_t):
        u, da = carry
        eps = jnp.exp(da[0])
        u, info = make_step(eps)(u, tape_t)
        prob = jnp.where(jnp.isfinite(info.accept_prob), info.accept_prob, 0.0)
        return (u, da_update(target - prob, da)), prob

    da = da_init(jnp.log(10.0 * eps0))
    (u, da), probs = jax.jit(lambda c, t: jax.lax.scan(body, c, t))((u0, da), tape)
    return float(jnp.exp(da[1]))


def ess_per_draw(chain_fn, target: Target, num_draws: int, num_chains: int, key):
    """Smallest ESS per draw over the unconstrained coordinates.

    ``chain_fn(u0, key, num_draws) -> (states (N, D), infos)``: a sequential
    chain. Runs ``num_chains`` chains from the warmed-up state.
    """
    keys = jax.random.split(key, num_chains)
    states, infos = jax.jit(jax.vmap(lambda k: chain_fn(target.u0, k, num_draws)))(keys)
    x = jax.vmap(jax.vmap(target.to_x))(states)
    ess = effective_sample_size(np.asarray(x, np.float64))
    total = num_chains * num_draws
    return {
        "min_ess_per_draw": float(np.min(ess)) / total,
        "median_ess_per_draw": float(np.median(ess)) / total,
        "accept": float(jnp.mean(infos.accept_prob)),
        "end_states": states[:, -1],
    }
