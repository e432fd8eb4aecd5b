"""``DEERMALA``: MALA as a NumPyro kernel whose blocks DEER solves."""

from __future__ import annotations

from collections.abc import Callable

from jax.sharding import Mesh
from numpyro.infer.initialization import init_to_uniform

from ..core.mala import MALA
from ..core.newton import DEERSolver
from .kernel import DEERKernel


class DEERMALA(DEERKernel):
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
    ``target_accept_prob`` and, at each window end, the mass matrix. Then step
    size and mass matrix are fixed and blocks are solved. Matrix products run
    at full precision (``jax.default_matmul_precision("highest")``), so float32
    products are not computed in TF32 on GPUs.

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
        adapt_step_size: adapt the step size in warmup (dual averaging).
        adapt_mass_matrix: how warmup adapts the mass matrix. ``"hessian"``:
            at each window end the inverse of the potential's Hessian averaged
            over 16 recent warmup draws (eigenvalues in absolute value, floored
            at 1e-4 of the largest), a dense matrix whatever ``dense_mass``
            says: it needs no more effective draws than there are points, and
            in its metric every direction has the same mean curvature. Costs
            ``16 D`` Hessian-vector products per window end (above
            ``D = 256`` fewer points: at most 4,096 products), and the dense
            matrix ``D^2`` per step. ``True``: windowed Welford estimates of
            the draws' covariance (NumPyro's scheme; diagonal unless
            ``dense_mass``). ``False``: the identity. ``"auto"`` (the default):
            ``"hessian"`` up to ``D = 512`` latent dimensions and, with
            ``C`` vectorized chains, ``C D^3 <= 2^32`` (each chain decomposes
            its own Hessian), unless ``dense_mass=True``; ``True`` otherwise.
            The choice made is :attr:`mass_adaptation` after ``init``.
        dense_mass: with ``adapt_mass_matrix=True``, a dense rather than
            diagonal sample covariance (and ``"auto"`` then means ``True``).
        target_accept_prob: acceptance rate the step size is adapted to.
            ``0.574`` is the optimal rate of sequential MALA (Roberts and
            Rosenthal, 1998), but a smaller step converges in far fewer Newton
            iterations, so the default is ``0.9`` (see the choosing-options
            page of the docs).
        init_strategy: NumPyro initialization strategy.
        block_size: transitions per DEER solve, at most: with
            :class:`~numpyro_deer.MCMC` the blocks are fitted to the run,
            ``ceil(N / ceil(N / block_size))`` for ``N = num_samples`` steps
            per chain (thinning included), so that no block computes steps the
            run does not use (:attr:`block_size` after ``init`` is that size).
        method: how blocks are computed: ``"deer"`` (parallel Newton),
            ``"sequential"`` (the same taped chain by :func:`jax.lax.scan`, one
            step after the other; the reference) or ``"auto"`` (the default):
            the sequential scan on a CPU, and on an accelerator the faster of
            the two, measured by :class:`~numpyro_deer.MCMC` on a block each
            (sequential blocks until DEER's program, compiling in the
            background, is ready; a run that ends first keeps the sequential
            scan provisionally). The choice is :attr:`method_chosen`, its
            reason and timings :attr:`method_choice`.
        solver: how each block is solved: a :class:`~numpyro_deer.DEERSolver`
            (Jacobian strategy, accept gate, solve basis, tolerances, iteration
            limits, sweep). ``DEERSolver()`` holds the defaults.
        on_failure: what a block whose solve does not converge becomes.
            ``"sequential"`` (default): it is finished one step after the other
            from the solve's front with the same tape, so its draws are the
            chain, and a :class:`~numpyro_deer.DEERConvergenceWarning` says so
            (after the run with :class:`~numpyro_deer.MCMC`, once per run from
            the compiled sampler with ``numpyro.infer.MCMC``). ``"warn"``: the
            solve's last iterate is kept (except a non-finite one, which is
            finished sequentially): the draws before its front are the chain,
            those after it are not, and the warning says so; for runs where a
            slow block costs more than an approximate one. ``"raise"``: a
            :class:`~numpyro_deer.DEERConvergenceError` at the first such block
            (a ``jax.errors.JaxRuntimeError`` naming it under
            ``numpyro.infer.MCMC``). ``state.block.info.result`` says why a
            solve stopped (:class:`numpyro_deer.core.RESULTS`).
        validate_model: check the model for unsupported features at init.
        mesh: a :class:`jax.sharding.Mesh` (e.g.
            :func:`numpyro_deer.core.time_mesh`) to split each block's solve
            over: device ``d`` of the mesh's time axis (its only axis, or the
            one named ``"time"``) solves steps ``d B / n + 1 .. (d + 1) B / n``
            with :func:`~numpyro_deer.core.sharded_deer_solve`, the same chain
            as on one device. Warmup runs replicated on every device and the
            solved block is gathered to all of them. ``block_size`` must be a
            multiple of the device count and ``method`` is ``"deer"``
            (``"auto"`` means it). A mesh of two axes, ``"time"`` and a chain
            axis, runs ``chain_method="vectorized"`` chains split over the
            chain axis (``num_chains`` a multiple of its device count), each
            chain's blocks over the time axis; otherwise one chain runs at a
            time (``chain_method="sequential"`` for several). See the scaling
            page of the docs.
    """

    def __init__(
        self,
        model: Callable | None = None,
        potential_fn: Callable | None = None,
        *,
        step_size: float = 1.0,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool | str = "auto",
        dense_mass: bool = False,
        target_accept_prob: float = 0.9,
        init_strategy: Callable = init_to_uniform,
        block_size: int = 4096,
        method: str = "auto",
        solver: DEERSolver = DEERSolver(),
        on_failure: str = "sequential",
        validate_model: bool = True,
        mesh: Mesh | None = None,
    ):
        super().__init__(
            MALA(),
            model,
            potential_fn,
            step_size=step_size,
            adapt_step_size=adapt_step_size,
            adapt_mass_matrix=adapt_mass_matrix,
            dense_mass=dense_mass,
            target_accept_prob=target_accept_prob,
            init_strategy=init_strategy,
            block_size=block_size,
            method=method,
            solver=solver,
            on_failure=on_failure,
            validate_model=validate_model,
            mesh=mesh,
        )
