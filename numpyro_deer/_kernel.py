"""``DEERMALA``: the NumPyro kernel."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.infer.util import initialize_model
from numpyro.util import identity, is_prng_key

from ._block import (
    NUM_CURVATURE_POINTS,
    DEERMALAState,
    emit_draw,
    empty_block,
    needs_refill,
    refill_block,
)
from ._checks import (
    UnsupportedModelError,
    check_model,
    non_finite_sites_message,
    translate_tracer_errors,
)
from ._convergence import warn_unconverged
from ._hessian_mass import resolve_mass_adaptation
from ._jacobian import JacobianStrategy, jacobian_from_name
from ._mala import Gate, HardGate, SigmoidGate
from ._memory import check_buffer_memory
from ._newton import DEERSolver
from ._warmup import (
    batched_hessian_window_end,
    build_adapter,
    find_reasonable_step_size,
    warmup_step,
)

_GATES = {"hard": HardGate, "sigmoid": SigmoidGate}

# what jax.default_matmul_precision accepts (JAX 0.10), and None for JAX's own
MATMUL_PRECISIONS = (
    None,
    "default",
    "high",
    "highest",
    "bfloat16",
    "tensorfloat32",
    "float32",
)


def _gate_from_name(gate: str | Gate) -> Gate:
    if not isinstance(gate, str):
        if not hasattr(gate, "tangent"):
            raise ValueError(
                f"gate={gate!r} is not a gate treatment: use 'hard', 'sigmoid' "
                "or SigmoidGate(temperature=...)."
            )
        return gate
    if gate not in _GATES:
        raise ValueError(
            f"gate={gate!r} is not a gate treatment: use 'hard', 'sigmoid' or "
            "SigmoidGate(temperature=...)."
        )
    return _GATES[gate]()


class DEERMALA(MCMCKernel):
    r"""Metropolis-adjusted Langevin algorithm, parallel across the chain length.

    After warmup, ``DEERMALA`` computes blocks of ``block_size`` MALA transitions
    at once: all randomness of a block is drawn first, the block is the solution
    of the fixed-point problem ``s_t = f_t(s_{t-1})``, and DEER finds it with
    parallel Newton iterations whose linear step is an associative scan (Lim et
    al., 2024; Gonzalez et al., 2024; Zoltowski et al., 2025). The result is the
    chain a sequential MALA would produce from the same randomness, up to the
    solver tolerance, which each block certifies by its residual. On a GPU the
    ``B`` latency-bound steps become a few dozen throughput-bound passes.

    One MALA step with step size :math:`\epsilon` and inverse mass matrix
    :math:`M` (Roberts and Tweedie, 1996) proposes
    :math:`y = x - \epsilon M \nabla U(x) + \sqrt{2\epsilon} M^{1/2}\xi` and
    accepts it with probability
    :math:`\min(1, e^{U(x) - U(y)} q(x \mid y) / q(y \mid x))`.

    Warmup runs sequentially (one step per draw) with NumPyro's
    ``warmup_adapter``: dual averaging of the step size toward
    ``target_accept_prob`` and windowed Welford estimates of a diagonal or dense
    mass matrix. Then step size and mass matrix are fixed and blocks are solved.

    Inside ``numpyro.infer.MCMC`` the kernel hands out one buffered draw per
    ``sample`` call; that is correct but the per-draw loop costs more than a
    MALA step on a GPU. Use :class:`numpyro_deer.MCMC`, a drop-in driver that
    advances a whole block per iteration, for speed: it gives the same draws.

    Args:
        model: a NumPyro model with continuous latent sites.
        potential_fn: instead of a model, a potential energy (negative log
            density) on a pytree of unconstrained values; ``init_params`` must
            then be given to ``MCMC.run``.
        step_size: initial step size (adapted in warmup when
            ``adapt_step_size``).
        block_size: transitions per DEER solve.
        jacobian: ``"stochastic"`` (Hutchinson diagonal), ``"diag"`` (exact
            diagonal), ``"full"`` (dense; on ill-conditioned posteriors of a
            few dozen dimensions it converges where the diagonal does not) or
            a strategy object.
        num_probes: Rademacher probes per step for ``"stochastic"``.
        clip: bound of the Jacobian approximation (``None`` for none): the
            diagonal is clipped to ``[-clip, clip]``; a dense Jacobian is
            scaled down to spectral norm ``clip`` (``FullJacobian``), which
            makes ``"full"`` converge where accepted steps expand (eight
            schools). ``jacobian=FullJacobian()`` is the unclipped one.
        gate: derivative of the accept decision: ``"hard"``, ``"sigmoid"`` or a
            gate object such as ``SigmoidGate(temperature=0.5)``.
        adapt_step_size: adapt the step size in warmup (dual averaging).
        adapt_mass_matrix: how warmup adapts the mass matrix. ``"hessian"``:
            at each window end the inverse of the potential's Hessian averaged
            over 16 recent warmup draws (eigenvalues in absolute value, floored
            at 1e-4 of the largest), a dense matrix whatever ``dense_mass``
            says. It needs no more effective draws than there are points, and
            in it every direction has the same mean curvature: on the H200
            benchmarks it raised the effective sample size per draw 2.4x to
            400x on all six benchmark models at about the same cost per block
            (see the ablation page). Costs ``16 D`` Hessian-vector products per
            window end, and the dense matrix ``D^2`` per step. ``True``:
            windowed Welford estimates of the draws' covariance (NumPyro's
            scheme; diagonal unless ``dense_mass``). ``False``: the identity.
            ``"auto"`` (the default): ``"hessian"`` up to ``D = 512`` latent
            dimensions unless ``dense_mass=True``, ``True`` otherwise; the
            choice made is :attr:`mass_adaptation` after ``init``.
        dense_mass: with ``adapt_mass_matrix=True``, a dense rather than
            diagonal sample covariance (and ``"auto"`` then means ``True``).
        target_accept_prob: acceptance rate the step size is adapted to.
            ``0.574`` is the optimal rate of sequential MALA (Roberts and
            Rosenthal, 1998), but with DEER a smaller step converges in far
            fewer Newton iterations (on eight schools the blocks converge
            only with it), so the default is
            ``0.9``; see the ablation page of the docs for the trade-off.
        init_strategy: NumPyro initialization strategy.
        atol: absolute tolerance of the solver (see ``DEERSolver``).
        rtol: relative tolerance of the solver.
        max_iter: Newton iterations per solve.
        max_solves: solves per block (each restarts at the front); a block
            not done after ``max_iter * max_solves`` iterations is finished
            sequentially from its front and reported as not converged.
        damping: the Jacobian is scaled by ``1 - damping``.
        window: steps per Newton iteration (``None``: the whole block).
        sweep: sequential steps computed at the start of each Newton
            iteration (after the first ``sweep_after``) from the front and
            from every local front (a failing step after a passing one), side
            by side, carrying the gradient. They are tested like every other
            step, so the chain is the same; a stretch the Jacobian estimate
            cannot follow (a funnel's neck) then shrinks by up to
            ``sweep + 1`` steps per iteration instead of a few. ``0``: no
            sweep. The default ``8`` (after 20 iterations) comes from the
            eighth ablation run: on the H200 it halves the iterations of eight
            schools and the hierarchical model and makes stochastic
            volatility 2x faster, and blocks that converge within 20
            iterations never run it.
        sweep_segments: how many segments a sweep runs side by side
            (``None``: ``block_size // sweep``).
        sweep_after: Newton iterations of a block before its sweeps start.
        coupled_segments: ``n > 0`` replaces each block's initial guess by
            ``n`` segments of ``block_size / n`` steps computed one step
            after the other, side by side, each pass starting a segment from
            where its predecessor ended in the pass before, until the starts
            stop moving, then repairing from the steps that fail the batched
            test (at most 6 passes in all). Chains driven by the same tape
            from different states meet, so a segment longer than that meeting
            time is the chain itself after two passes, and the Newton solve
            has little left to do. The segments are tested like every other step
            (the chain is the same); they cost ``block_size / n`` sequential
            steps per pass. ``0`` (the default): none. For posteriors whose
            blocks need hundreds of iterations (stochastic volatility); see
            the choosing-options page of the docs.
        initial_guess: the iterate each solve starts from: ``"start"`` (the
            block's first state repeated) or ``"previous"`` (the previous
            block's draws; the first block after warmup uses the start). It
            changes the iteration count, not the chain.
        solve_basis: coordinates of the Newton solve. ``"whitened"``:
            ``w = L^{-1} x`` with ``M = L L^T`` the adapted inverse mass
            matrix. ``"hessian"``: ``w`` rotated to the eigenvectors of the
            Hessian of the potential averaged over 16 draws (from the later
            warmup for the first block, then from the previous block), where a
            step's Jacobian ``I - eps H`` is nearly diagonal, so the diagonal
            Jacobian strategies converge in far fewer iterations on correlated
            posteriors. Costs ``16 D`` Hessian-vector products and a ``D x D``
            eigendecomposition per block and a ``D x D`` product per gradient,
            for moderate ``D`` (hundreds). ``"auto"`` (the default) is
            ``"hessian"`` up to ``D = 512`` and ``"whitened"`` above. On the
            H200 ablation (B=16,384) the Hessian basis took logistic
            regression from 26 to 11 iterations, the D=100 one from 37 to 20
            and the ill-conditioned Gaussian from 300 (unconverged) to 7,
            and left eight schools unchanged. The chain is the same in either
            basis (a rotation commutes with MALA of identity mass).
        matmul_precision: precision of matrix products inside the kernel
            (``jax.default_matmul_precision``), ``"highest"`` by default so
            that float32 products are not computed in TF32 on GPUs, which
            would make the batched and the sequential chain differ; ``None``
            keeps JAX's setting.
        method: ``"deer"`` (parallel Newton) or ``"sequential"``: the same
            taped chain computed by :func:`jax.lax.scan`, one step after the
            other (the reference; useful on CPU and for checking).
        validate_model: check the model for unsupported features at init.
    """

    sample_field = "z"

    def __init__(
        self,
        model: Callable | None = None,
        potential_fn: Callable | None = None,
        *,
        step_size: float = 1.0,
        block_size: int = 4096,
        jacobian: str | JacobianStrategy = "stochastic",
        num_probes: int = 1,
        clip: float | None = 1.0,
        gate: str | Gate = "hard",
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool | str = "auto",
        dense_mass: bool = False,
        target_accept_prob: float = 0.9,
        init_strategy: Callable = init_to_uniform,
        atol: float | None = None,
        rtol: float | None = None,
        max_iter: int = 100,
        max_solves: int = 3,
        damping: float = 0.0,
        window: int | None = None,
        sweep: int = 8,
        sweep_segments: int | None = None,
        sweep_after: int = 20,
        coupled_segments: int = 0,
        initial_guess: str = "start",
        solve_basis: str = "auto",
        method: str = "deer",
        matmul_precision: str | None = "highest",
        validate_model: bool = True,
    ):
        if (model is None) == (potential_fn is None):
            raise ValueError("DEERMALA needs exactly one of `model` or `potential_fn`.")
        if not (
            isinstance(block_size, numbers.Integral)
            and not isinstance(block_size, bool)
            and block_size >= 1
        ):
            raise ValueError(f"block_size={block_size!r}: use an integer >= 1.")
        block_size = int(block_size)
        if not (
            isinstance(step_size, numbers.Real)
            and math.isfinite(step_size)
            and step_size > 0
        ):
            raise ValueError(f"step_size={step_size!r}: use a finite positive number.")
        if clip is not None and not (
            isinstance(clip, numbers.Real) and math.isfinite(clip) and clip > 0
        ):
            raise ValueError(
                f"clip={clip!r}: use a finite positive number, or None for no clipping."
            )
        if not isinstance(adapt_step_size, bool):
            raise ValueError(f"adapt_step_size={adapt_step_size!r}: use True or False.")
        if matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"matmul_precision={matmul_precision!r}: use one of "
                f"{list(MATMUL_PRECISIONS)}."
            )
        if not (isinstance(jacobian, str) or hasattr(jacobian, "linearize")):
            raise ValueError(
                f"jacobian={jacobian!r} is not a Jacobian strategy: use 'stochastic', "
                "'diag', 'full' or a strategy object such as "
                "StochasticDiagonalJacobian(num_probes=2)."
            )
        if not 0 < target_accept_prob < 1:
            raise ValueError(
                f"target_accept_prob={target_accept_prob!r}: use a value in (0, 1)."
            )
        if adapt_mass_matrix not in (True, False, "hessian", "auto"):
            raise ValueError(
                f"adapt_mass_matrix={adapt_mass_matrix!r}: use 'auto' (the "
                "default), True (the draws' covariance), False or 'hessian' (the "
                "inverse mean Hessian)."
            )
        if not isinstance(dense_mass, bool):
            raise ValueError(
                "DEERMALA supports dense_mass=True or False, not a list of site groups."
            )
        options = {}
        if jacobian == "stochastic":
            options = {"num_probes": num_probes, "clip": clip}
        elif jacobian in ("diag", "full"):
            options = {"clip": clip}
        self._solver = DEERSolver(
            jacobian=jacobian_from_name(jacobian, **options),
            atol=atol,
            rtol=rtol,
            max_iter=max_iter,
            max_solves=max_solves,
            damping=damping,
            window=window,
            sweep=sweep,
            segments=sweep_segments,
            sweep_after=sweep_after,
            coupled_segments=coupled_segments,
        )
        if method not in ("deer", "sequential"):
            raise ValueError(
                f"method={method!r}: use 'deer' (parallel Newton) or 'sequential'."
            )
        if initial_guess not in ("start", "previous"):
            raise ValueError(
                f"initial_guess={initial_guess!r}: use 'start' (repeat the first "
                "state) or 'previous' (the previous block's draws)."
            )
        if solve_basis not in ("auto", "whitened", "hessian"):
            raise ValueError(
                f"solve_basis={solve_basis!r}: use 'auto', 'whitened' (the "
                "mass-matrix coordinates) or 'hessian' (their rotation to the "
                "eigenvectors of the mean Hessian)."
            )
        self._initial_guess = initial_guess
        self._solve_basis = solve_basis
        self._method = method
        self._matmul_precision = matmul_precision
        self._gate = _gate_from_name(gate)
        self._model = model
        self._potential_fn = potential_fn
        self._step_size = float(step_size)
        self._block_size = block_size
        self._adapt_step_size = adapt_step_size
        self._adapt_mass_matrix = adapt_mass_matrix
        # "auto" resolved against the latent dimension at init
        self._mass_adaptation = adapt_mass_matrix
        self._dense_mass = dense_mass
        self._target_accept_prob = target_accept_prob
        self._init_strategy = init_strategy
        self._validate_model = validate_model
        self._num_warmup = 0
        self._potential_fn_gen = None
        self._postprocess_fn = None
        self._unravel = None
        self._sample_fn = None
        self._warned_unconverged = False

    # ------------------------------------------------------------------ props
    @property
    def model(self):
        return self._model

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def solver(self) -> DEERSolver:
        return self._solver

    @property
    def default_fields(self):
        return (
            "z",
            "diverging",
            "potential_energy",
            "accept_prob",
            "adapt_state.step_size",
        )

    def get_diagnostics_str(self, state):
        return f"acc. prob={state.mean_accept_prob:.2f}"

    # --------------------------------------------------------------- potential
    def _potential(self, model_args, model_kwargs) -> Callable:
        if self._potential_fn_gen is not None:
            model_kwargs = {} if model_kwargs is None else model_kwargs
            return self._potential_fn_gen(*model_args, **model_kwargs)
        return self._potential_fn

    def _potential_flat(self, model_args, model_kwargs) -> Callable:
        potential = self._potential(model_args, model_kwargs)
        unravel = self._unravel
        return lambda x: potential(unravel(x))

    @property
    def mass_adaptation(self) -> bool | str:
        """How warmup adapts the mass matrix: ``"hessian"``, ``True`` (NumPyro's
        windowed covariance) or ``False``; ``"auto"`` until :meth:`init`."""
        return self._mass_adaptation

    def _adapter(self, potential_flat, window_end=True):
        return build_adapter(
            potential_flat,
            self._num_warmup,
            mass_adaptation=self._mass_adaptation,
            dense_mass=self._dense_mass,
            adapt_step_size=self._adapt_step_size,
            target_accept_prob=self._target_accept_prob,
            window_end=window_end,
        )

    # -------------------------------------------------------------------- init
    def _init_model(self, rng_key, model_args, model_kwargs, init_params):
        if self._model is None:
            if init_params is None:
                raise ValueError(
                    "DEERMALA(potential_fn=...) needs `init_params`: pass them to "
                    "MCMC.run(rng_key, init_params=...)."
                )
            return init_params
        if self._validate_model:
            check_model(self._model, model_args, model_kwargs, rng_key)
        try:
            with translate_tracer_errors():
                params_info, self._potential_fn_gen, self._postprocess_fn, _ = (
                    initialize_model(
                        rng_key,
                        self._model,
                        dynamic_args=True,
                        init_strategy=self._init_strategy,
                        model_args=model_args,
                        model_kwargs=model_kwargs,
                    )
                )
        except RuntimeError as err:
            if "Cannot find valid initial parameters" not in str(err):
                raise
            raise RuntimeError(
                str(err)
                + " "
                + non_finite_sites_message(
                    self._model, model_args, model_kwargs, rng_key
                )
            ) from err
        return params_info[0] if init_params is None else init_params

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        self._num_warmup = num_warmup
        self._warned_unconverged = False
        vectorized = not is_prng_key(rng_key)
        if vectorized:
            # the chain axis comes from where the parameters came from: the
            # user's init_params carry one (as for NumPyro's kernels), the
            # kernel's own initialization is vmapped over the chains' keys
            num_chains = rng_key.shape[0]
            rng_key, key_model = jnp.swapaxes(jax.vmap(jax.random.split)(rng_key), 0, 1)
            user_params = init_params
            init_params = self._init_model(
                key_model[0], model_args, model_kwargs, init_params
            )
            if user_params is None:
                params = self._init_model
                init_params = jax.vmap(
                    lambda k: params(k, model_args, model_kwargs, None)
                )(key_model)
            elif not _has_chain_axis(init_params, num_chains):
                raise ValueError(
                    "init_params for vectorized chains need a leading axis of "
                    f"length num_chains={num_chains} on every site."
                )
        else:
            rng_key, key_model = jax.random.split(rng_key)
            init_params = self._init_model(
                key_model, model_args, model_kwargs, init_params
            )
        init_params = _float_params(init_params)
        one = jax.tree.map(lambda x: x[0], init_params) if vectorized else init_params
        flat, self._unravel = ravel_pytree(one)
        if flat.size == 0:
            raise UnsupportedModelError(
                "DEERMALA: the model has no latent sample sites (nothing to "
                "sample): every numpyro.sample site is observed or the model has "
                "none. Use numpyro.infer.Predictive to draw from it."
            )
        self._mass_adaptation = resolve_mass_adaptation(
            self._adapt_mass_matrix, self._dense_mass, flat.size
        )
        check_buffer_memory(
            self._block_size,
            flat.size,
            flat.dtype,
            num_chains=rng_key.shape[0] if vectorized else 1,
        )
        potential_flat = self._potential_flat(model_args, model_kwargs)
        wa_init, _ = self._adapter(potential_flat)

        def init_one(params, key):
            key, key_wa = jax.random.split(key)
            z_flat = ravel_pytree(params)[0]
            with translate_tracer_errors():
                pe = potential_flat(z_flat)
            adapt = wa_init(
                (z_flat,), key_wa, self._step_size, mass_matrix_size=z_flat.size
            )
            zero = jnp.zeros((), z_flat.dtype)
            return DEERMALAState(
                i=jnp.zeros((), jnp.int32),
                z=params,
                potential_energy=pe,
                accept_prob=zero,
                mean_accept_prob=zero,
                diverging=jnp.zeros((), bool),
                newton_iterations=jnp.zeros((), jnp.int32),
                deer_converged=jnp.ones((), bool),
                adapt_state=adapt,
                rng_key=key,
                block=empty_block(self._block_size, z_flat, key),
                curvature_points=jnp.broadcast_to(
                    z_flat, (NUM_CURVATURE_POINTS,) + z_flat.shape
                ),
            )

        with self._precision():
            state = (jax.jit(jax.vmap(init_one)) if vectorized else jax.jit(init_one))(
                init_params, rng_key
            )
        self._sample_fn = partial(self._sample, batched=vectorized)
        _check_initial_potential(state.potential_energy)
        return state

    # ------------------------------------------------------------------ sample
    def _precision(self):
        if self._matmul_precision is None:
            return contextlib.nullcontext()
        return jax.default_matmul_precision(self._matmul_precision)

    def block_warmup(self, state, model_args, model_kwargs, batched=False):
        """One warmup step (the driver calls this while ``i < num_warmup``)."""
        with self._precision(), translate_tracer_errors():
            return self._block_warmup(state, model_args, model_kwargs, batched)

    def _block_warmup(self, state, model_args, model_kwargs, batched):
        potential_flat = self._potential_flat(model_args, model_kwargs)
        # vectorized chains take the Hessian metric once for all (see
        # batched_hessian_window_end), not inside vmap; on the CPU the chains
        # are mapped one after the other (see _map_chains), so each chain's
        # window end is a plain cond
        shared_end = batched and self._mass_adaptation == "hessian" and not _on_cpu()
        _, wa_update = self._adapter(potential_flat, window_end=not shared_end)
        step = partial(
            warmup_step,
            potential_flat=potential_flat,
            adapter_update=wa_update,
            num_warmup=self._num_warmup,
            unravel=self._unravel,
        )
        if not batched:
            return step(state)
        new = _map_chains(step, state)
        if not shared_end:
            return new
        find_step_size = None
        if self._adapt_step_size:
            find_step_size = partial(
                find_reasonable_step_size, potential_flat, self._target_accept_prob
            )
        adapt = batched_hessian_window_end(
            state.adapt_state,
            new.adapt_state,
            potential_flat,
            new.curvature_points,
            jax.vmap(lambda z: ravel_pytree(z)[0])(new.z),
            self._num_warmup,
            find_step_size,
        )
        return new._replace(adapt_state=adapt)

    def block_refill(self, state, model_args, model_kwargs, batched=False):
        """Solve a new block where the buffer is used up or the key was replaced."""
        with self._precision(), translate_tracer_errors():
            return self._block_refill(state, model_args, model_kwargs, batched)

    def _block_refill(self, state, model_args, model_kwargs, batched):
        potential_flat = self._potential_flat(model_args, model_kwargs)
        ravel = lambda z: ravel_pytree(z)[0]  # noqa: E731

        # None: the sequential method. Chains solved together: the solver is
        # told so (see DEERSolver.vmapped).
        solver = None
        if self._method == "deer":
            solver = dataclasses.replace(
                self._solver, vmapped=batched and not _on_cpu()
            )

        def refill(s):
            return refill_block(
                s,
                potential_flat,
                ravel,
                solver,
                self._gate,
                self._initial_guess,
                self._solve_basis,
            )

        if batched:
            need = jnp.any(jax.vmap(needs_refill)(state))
            return jax.lax.cond(need, lambda s: _map_chains(refill, s), identity, state)
        return jax.lax.cond(needs_refill(state), refill, identity, state)

    def block_emit(self, state, k, batched=False):
        """The state after handing out buffer entry ``k`` (all chains if batched)."""
        emit = partial(emit_draw, unravel=self._unravel, num_warmup=self._num_warmup)
        if batched:
            return jax.vmap(emit, in_axes=(0, None))(state, k)
        return emit(state, k)

    def _sample(self, state, model_args, model_kwargs, batched):
        """One draw: a warmup step, or the next entry of the (refilled) block.

        With ``batched`` (vectorized chains) the chains share one iteration
        count and one block index, so both branches are chosen once for all.
        """

        def warmup(s):
            return self._block_warmup(s, model_args, model_kwargs, batched)

        def sampling(s):
            s = self._block_refill(s, model_args, model_kwargs, batched)
            index = s.block.index[0] if batched else s.block.index
            # a block just solved (index 0) that did not converge is reported
            # from the host; the driver counts blocks itself instead
            failed = jnp.sum((index == 0) & ~s.block.info.converged, dtype=jnp.int32)
            jax.lax.cond(
                failed > 0,
                lambda: jax.debug.callback(self._report_unconverged, failed),
                lambda: None,
            )
            return self.block_emit(s, index, batched=batched)

        i = state.i[0] if batched else state.i
        return jax.lax.cond(i < self._num_warmup, warmup, sampling, state)

    def _report_unconverged(self, failed) -> None:
        """Warn, once per ``init``, that a block's solve did not converge."""
        if self._warned_unconverged:
            return
        self._warned_unconverged = True
        warn_unconverged(int(failed), None)

    def sample(self, state, model_args, model_kwargs):
        with self._precision(), translate_tracer_errors():
            return self._sample_fn(state, model_args, model_kwargs)

    def postprocess_fn(self, model_args, model_kwargs):
        if self._postprocess_fn is None:
            return identity
        model_kwargs = {} if model_kwargs is None else model_kwargs
        return self._postprocess_fn(*model_args, **model_kwargs)

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in ("_sample_fn", "_potential_fn_gen", "_postprocess_fn", "_unravel"):
            state[name] = None
        return state


def _on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def _map_chains(fn: Callable, state: Any) -> Any:
    """``fn`` over the leading chain axis: ``vmap``, or ``lax.map`` on the CPU.

    On the CPU, batched LAPACK kernels (Cholesky, ``eigh``, triangular solves
    of a dense mass matrix, one per chain) split their batch over XLA's
    intra-op thread pool and wait for it from a thread of that pool; two such
    kernels running at once can wait on each other forever when the pool is
    small (observed: 4 chains, ``D = 64``, 2 cores, every thread asleep in
    ``ParallelBatchMap``). Mapping the chains one after the other keeps each
    kernel unbatched; on the CPU it costs about what sequential chains do.
    """
    if _on_cpu():
        return jax.lax.map(fn, state)
    return jax.vmap(fn)(state)


def _has_chain_axis(params: Any, num_chains: int) -> bool:
    leaves = jax.tree.leaves(params)
    return bool(leaves) and all(
        jnp.ndim(x) >= 1 and jnp.shape(x)[0] == num_chains for x in leaves
    )


def _float_params(params: Any) -> Any:
    """Integer or boolean initial values as floats (the latent space is real)."""

    def to_float(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(jnp.result_type(float))

    return jax.tree.map(to_float, params)


def _check_initial_potential(potential_energy) -> None:
    if isinstance(potential_energy, jax.core.Tracer):
        return
    if not bool(jnp.all(jnp.isfinite(potential_energy))):
        raise ValueError(
            "DEERMALA: the potential energy at the initial parameters is not "
            "finite. Check the model's data and priors, or pass valid "
            "`init_params` (unconstrained values) or another `init_strategy`."
        )
