"""``benchmarks/scaling.py`` through the kernel: ``DEERMALA(model, mesh=...)``.

Where ``scaling.py``'s core rows time one ``sharded_deer_solve`` of a given
potential, step size and start, these rows time what a NumPyro user runs:
``numpyro_deer.MCMC(DEERMALA(model, block_size=T, mesh=mesh))``. Per
configuration, warmup runs once (``mcmc.warmup``; its cost is not timed), then
``mcmc.run`` samples ``blocks`` blocks of ``T`` draws from the warmed-up state:
the first run compiles the sampler, the next ``repeats`` runs are timed
(median), each computing the same blocks again. The time includes what the
kernel adds to the solve: the tape, the whitening by the adapted mass matrix,
the certificate, NumPyro's postprocessing of every draw and gathering the
draws into the collection.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_deer import DEERMALA, MCMC, DEERSolver


def gaussian_model(precision: np.ndarray):
    """``x ~ N(0, precision^-1)``: the potential ``0.5 x^T P x`` of the core rows."""
    precision = jnp.asarray(precision)
    loc = jnp.zeros(precision.shape[0], precision.dtype)

    def model():
        numpyro.sample("x", dist.MultivariateNormal(loc, precision_matrix=precision))

    return model


def logistic_model(X: np.ndarray, y: np.ndarray):
    """Logistic regression, ``w ~ N(0, 1)``, labels ``y`` in ``{-1, 1}``."""
    X, labels = jnp.asarray(X), jnp.asarray((y + 1) / 2)

    def model():
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=labels)

    return model


class KernelBench:
    """Times ``numpyro_deer.MCMC`` with ``DEERMALA(model, mesh=...)``.

    Args:
        model: a NumPyro model without arguments.
        jacobian: the solver's Jacobian strategy (``"full"``, ``"diag"``,
            ``"stochastic"``).
        num_warmup: warmup draws before the timed blocks.
        blocks: blocks per timed run.
        repeats: timed runs (after the one that compiles).
        seed: the run's key.
        mesh_of: ``n -> Mesh`` of ``n`` devices.
    """

    def __init__(self, model, jacobian, num_warmup, blocks, repeats, seed, mesh_of):
        self.model = model
        self.solver = DEERSolver(jacobian=jacobian, sweep=0)
        self.num_warmup, self.blocks, self.repeats = num_warmup, blocks, repeats
        self.key = jax.random.PRNGKey(seed)
        self.mesh_of = mesh_of

    def run(self, num_steps: int, num_devices: int | None) -> dict:
        """One configuration; ``num_devices=None``: the kernel without a mesh."""
        mesh = None if num_devices is None else self.mesh_of(num_devices)
        kernel = DEERMALA(
            self.model,
            block_size=num_steps,
            method="deer",
            solver=self.solver,
            mesh=mesh,
        )
        mcmc = MCMC(
            kernel,
            num_warmup=self.num_warmup,
            num_samples=num_steps * self.blocks,
            progress_bar=False,
        )
        fields = ("newton_iterations", "deer_converged", "accept_prob")
        start = time.perf_counter()
        mcmc.warmup(self.key)
        warmup_s = time.perf_counter() - start
        times = []
        for _ in range(self.repeats + 1):
            start = time.perf_counter()
            mcmc.run(self.key, extra_fields=fields)
            jax.block_until_ready(mcmc.last_state)
            times.append(time.perf_counter() - start)
        extra = mcmc.get_extra_fields()
        first_of_block = np.arange(self.blocks) * num_steps
        iterations = np.asarray(extra["newton_iterations"])[first_of_block]
        wall = float(np.median(times[1:]))
        return {
            "num_steps": num_steps,
            "devices": 1 if num_devices is None else num_devices,
            "sharded": num_devices is not None,
            "status": "ok",
            "warmup_s": warmup_s,
            "compile_s": max(times[0] - wall, 0.0),
            "wall_s": wall,
            "times_s": times[1:],
            "blocks": self.blocks,
            "iterations": float(np.mean(iterations)),
            "iterations_per_block": iterations.tolist(),
            "converged": bool(np.all(np.asarray(extra["deer_converged"]))),
            "s_per_iteration": wall / max(float(np.sum(iterations)), 1.0),
            "draws_per_s": num_steps * self.blocks / wall,
            "accept_rate": float(np.mean(np.asarray(extra["accept_prob"]))),
            "step_size": float(mcmc.last_state.adapt_state.step_size),
        }
