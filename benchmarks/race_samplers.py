"""The race's competitors: each sampler with its own recommended warmup, in segments.

Every competitor is a function ``run(target, chains, settings, tracker)`` that
warms up, then samples segment after segment until ``tracker.done()`` (target
accuracy reached or the wall-time budget spent), handing each segment's draws to
the :class:`Tracker` of ``benchmarks/race.py`` as per-draw sums over chains of
``x`` and ``x**2`` (constrained values, flattened in the truth's site order).
The clock starts before anything is traced, so compilation and warmup count.

* ``nuts_diag`` / ``nuts_dense``: NumPyro's NUTS (target acceptance 0.8, its
  default windowed adaptation), diagonal or dense metric; several chains run
  ``"parallel"`` (one per CPU core) on the CPU, ``"vectorized"`` on a GPU.
* ``mala_seq``: ``DEERMALA(method="sequential")``, the same MALA chain as DEER
  computed one step after the other, vectorized chains.
* ``deer``: ``DEERMALA`` (DEER), its defaults, vectorized chains.
* ``hmc_seq`` / ``deerhmc`` / ``deerhmc_auto``: ``DEERHMC`` (``num_steps``
  ``settings["hmc_leapfrog"]``: ``"auto"`` by default, as the kernel's, or a
  count; the ``_pw`` rows take 4 unless a count is given) computed
  sequentially / by DEER / by its default ``method="auto"`` (what a user of
  ``DEERHMC(model)`` gets: the sequential scan while DEER's program compiles,
  then the faster of the two), vectorized chains (up to 1,024 and more:
  ``--samplers deerhmc:16,256,1024``).
  ``settings["deer_warmup"]`` (``--deer-warmup``) is forwarded to the DEER
  kernels as ``warmup=`` where their constructor takes it (a parallel warmup),
  an error where it does not.
* ``deer_pw`` / ``deerhmc_pw``: the parallel warmup of the pure-JAX core
  (``numpyro_deer.core.parallel_warmup``: windows of all chains solved by
  DEER at a fixed kernel, pooled metric and step size; for HMC the number of
  leapfrog steps chosen by ChEES) from the initial positions of the ``deer``
  rows, then sampling blocks that are more windows of the same solve at the
  adapted kernel (``sample_window``: iteration cap, front-stall stop and
  sequential completion, so the draws are the chains of that kernel). The
  counts: the warmup's own report, then every block's per-chain Newton
  iterations and fronts (``_counts.deer_blocks``).
* ``chees``: BlackJAX's ChEES-HMC (``chees_adaptation`` with Adam, learning rate
  0.025, then ``dynamic_hmc`` with the adapted jittered trajectory length).
* ``meads``: BlackJAX's MEADS (``meads_adaptation``, then ``ghmc``).
* ``adjusted_mclmc``: BlackJAX's adjusted MCLMC, tuned per chain.

NumPyro competitors run through ``numpyro.infer.MCMC`` (``numpyro_deer.MCMC``
for DEER); the BlackJAX ones through a jitted ``lax.scan`` of the vmapped step.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.flatten_util import ravel_pytree

import numpyro_deer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _counts  # noqa: E402


def flatten_sites(samples: dict, sites: list[str], lead: int) -> jax.Array:
    """Concatenate the sites' values into ``(*lead_shape, D)`` in ``sites`` order."""
    return jnp.concatenate(
        [jnp.reshape(samples[k], samples[k].shape[:lead] + (-1,)) for k in sites],
        axis=-1,
    )


# ------------------------------------------------------------- NumPyro ones
def _chain_method(settings, chains, driver) -> str:
    if chains == 1:
        return "sequential"
    if (
        settings["platform"] == "cpu"
        and driver is numpyro.infer.MCMC
        and jax.local_device_count() >= chains
    ):
        return "parallel"  # one chain per core (the caller sets the device count)
    return "vectorized"


def _nuts_competitor(target, chains, settings, tracker, kernel):
    """NumPyro's own warmup, then :func:`_kernel_segments`."""
    args, kwargs = target.args, target.kwargs
    method = _chain_method(settings, chains, numpyro.infer.MCMC)
    mcmc = numpyro.infer.MCMC(
        kernel,
        num_warmup=settings["nuts_warmup"],
        num_samples=settings["nuts_segment"],
        num_chains=chains,
        chain_method=method,
        progress_bar=False,
    )
    counter = _counts.StepsCounter(lockstep=method == "vectorized")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.warmup(
            jax.random.PRNGKey(settings["seed"]), *args,
            extra_fields=("num_steps",), collect_warmup=True, **kwargs,
        )  # fmt: skip
        steps = mcmc.get_extra_fields(group_by_chain=True)["num_steps"]
        tracker.warmup_done(counter.add(steps))
        _kernel_segments(
            mcmc, target, chains, method, settings["nuts_segment"], tracker, counter
        )


def _kernel_segments(mcmc, target, chains, method, seg, tracker, counter):
    """Sample after ``mcmc.warmup`` in segments of one compiled ``lax.scan``.

    ``numpyro.infer.MCMC.run`` compiles its sampling loop anew on every call
    (``fori_collect`` jits a fresh closure), which a user sampling once pays
    once; this loop over the kernel's own ``sample`` compiles once: ``pmap``
    over the chains for ``"parallel"``; for ``"vectorized"`` the kernel's
    ``sample`` already maps over the chains (NumPyro's ``HMC.init`` wraps it in
    ``vmap`` when its key is batched), so the scan runs on the batched state
    and only the constraining map is vmapped.
    """
    sampler, (args, kwargs) = mcmc.sampler, (target.args, target.kwargs)
    constrain = sampler.postprocess_fn(args, kwargs)
    sites = list(target.truth)

    def draw(z):
        return flatten_sites(constrain(z), sites, 0)

    def scan(state, batched):
        def body(state, _):
            state = sampler.sample(state, args, kwargs)
            x = jax.vmap(draw)(state.z) if batched else draw(state.z)
            return state, (x, state.num_steps)

        # x: (seg, [chains,] D); steps: (seg, [chains])
        return jax.lax.scan(body, state, None, length=seg)

    if method == "parallel":
        pmapped = jax.pmap(lambda st: scan(st, False))

        def fn(state):
            state, (x, n) = pmapped(state)  # (chains, seg, ...)
            return state, x.sum(0), (x**2).sum(0), n

    else:
        batched = method == "vectorized"

        @jax.jit
        def fn(state):
            state, (x, n) = scan(state, batched)
            if not batched:
                x, n = x[:, None], n[:, None]
            return state, x.sum(1), (x**2).sum(1), n.T

    state = mcmc.post_warmup_state
    while not tracker.done():
        state, s1, s2, n = fn(state)
        tracker.segment(np.asarray(s1), np.asarray(s2), chains, counter.add(n))


def _flat_dim(z, chains: int) -> int:
    return sum(int(np.size(v)) for v in jax.tree.leaves(z)) // chains


def _deer_competitor(target, chains, settings, tracker, kernel, warmup):
    """A ``DEERMALA``/``DEERHMC`` through ``numpyro_deer.MCMC``, a block per segment."""
    args, kwargs = target.args, target.kwargs
    sites = list(target.truth)
    block = kernel.block_size
    mcmc = numpyro_deer.MCMC(
        kernel,
        num_warmup=warmup,
        num_samples=block,
        num_chains=chains,
        chain_method=_chain_method(settings, chains, numpyro_deer.MCMC),
        progress_bar=False,
    )
    extra = ("newton_iterations", "block.info.front")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the first segment is the user's first run: warmup and one block in
        # one call (the block programs compile while the warmup runs)
        tracker.warmup_done(_counts.deer_warmup(kernel, chains, warmup), True)
        key = jax.random.PRNGKey(settings["seed"])
        while not tracker.done():
            mcmc.run(key, *args, extra_fields=extra, **kwargs)
            dim = _flat_dim(mcmc.last_state.z, chains)
            draws = flatten_sites(mcmc.get_samples(group_by_chain=True), sites, 2)
            s1, s2 = draws.sum(0), (draws**2).sum(0)
            counts = _counts.deer_run_blocks(mcmc, dim)
            tracker.segment(np.asarray(s1), np.asarray(s2), chains, counts)
            mcmc.post_warmup_state = mcmc.last_state
            key = mcmc.post_warmup_state.rng_key


def nuts(dense: bool) -> Callable:
    def run(target, chains, settings, tracker):
        kernel = numpyro.infer.NUTS(target.model, dense_mass=dense)
        _nuts_competitor(target, chains, settings, tracker, kernel)

    return run


def _with_warmup_hook(cls, settings, options: dict) -> dict:
    """``options`` plus ``warmup=settings["deer_warmup"]`` when one is asked
    for, and ``adapt_mass_matrix=settings["deer_mass"]`` (``--deer-mass``).

    The hook for a warmup other than NumPyro's sequential adaptation (e.g. one
    in parallel windows): forwarded to the kernel only if its constructor
    takes ``warmup``; asked for and not taken is an error, never ignored.
    """
    if settings.get("deer_mass") is not None:
        options = {**options, "adapt_mass_matrix": settings["deer_mass"]}
    choice = settings.get("deer_warmup")
    if choice is None:
        return options
    if "warmup" not in inspect.signature(cls.__init__).parameters:
        raise ValueError(
            f"--deer-warmup {choice!r}: {cls.__name__} takes no `warmup` "
            "argument in this version of numpyro_deer; leave the option out "
            "for NumPyro's sequential warmup."
        )
    return {**options, "warmup": choice}


def mala(method: str) -> Callable:
    def run(target, chains, settings, tracker):
        options = {"block_size": settings["block_size"], "method": method}
        options = _with_warmup_hook(numpyro_deer.DEERMALA, settings, options)
        kernel = numpyro_deer.DEERMALA(target.model, **options)
        warmup = settings["mala_warmup"]
        _deer_competitor(target, chains, settings, tracker, kernel, warmup)

    return run


def hmc(method: str) -> Callable:
    """``DEERHMC`` (its defaults but ``num_steps``: ``settings["hmc_leapfrog"]``,
    ``"auto"`` by default)."""

    def run(target, chains, settings, tracker):
        options = {
            "block_size": settings["block_size"],
            "method": method,
            "num_steps": settings.get("hmc_leapfrog", "auto"),
        }
        options = _with_warmup_hook(numpyro_deer.DEERHMC, settings, options)
        kernel = numpyro_deer.DEERHMC(target.model, **options)
        warmup = settings.get("deerhmc_warmup", settings["mala_warmup"])
        _deer_competitor(target, chains, settings, tracker, kernel, warmup)

    return run


# ------------------------------------------------------ the parallel warmup
PW_BLOCK = 256
"""Transitions per sampling block of the ``_pw`` rows (``settings["pw_block"]``)."""
PW_STEPS = (1, 2, 4, 8)
"""Leapfrog step counts ``deerhmc_pw``'s warmup chooses from by ChEES."""


def deer_initial_positions(target, chains: int, seed: int) -> jax.Array:
    """The flat unconstrained initial positions of the ``deer`` rows: NumPyro's
    search (``init_to_uniform``) from the key each chain's initial program
    splits off its key (``numpyro_deer.infer.program``), ``(chains, D)``."""
    from numpyro.infer.initialization import init_to_uniform

    from numpyro_deer.infer.initial import find_initial_params

    search = find_initial_params(target.model, init_to_uniform)
    keys = jax.random.split(jax.random.PRNGKey(seed), chains)
    model_keys = jax.vmap(lambda k: jax.random.split(k)[1])(keys)
    params, _ = jax.vmap(lambda k: search(k, target.args, target.kwargs))(model_keys)
    return jax.vmap(lambda p: ravel_pytree(p)[0])(params)


def parallel_warmup_row(leapfrog: bool) -> Callable:
    """``deer_pw`` (MALA) or ``deerhmc_pw`` (HMC)."""

    def run(target, chains, settings, tracker):
        from numpyro_deer.core import HMC, MALA, DEERSolver
        from numpyro_deer.core.parallel_warmup import (
            WarmupSchedule,
            parallel_warmup,
            sample_window,
            stall_iterations,
            window_solver,
        )
        from numpyro_deer.core.warmup_cost import gradients_per_transition

        logdensity, constrained, _ = _flat_problem(target, chains, settings["seed"])

        def potential(x):
            return -logdensity(x)

        x = deer_initial_positions(target, chains, settings["seed"])
        dim = x.shape[1]
        if leapfrog:
            count = settings.get("hmc_leapfrog")
            transition = HMC(num_steps=count if isinstance(count, int) else 4)
            choices = tuple(settings.get("pw_steps") or PW_STEPS)
        else:
            transition, choices = MALA(), None
        solver = DEERSolver(sweep=0)
        default = WarmupSchedule()  # windows (64, 256, 1024), the first sequential
        schedule = WarmupSchedule(
            windows=tuple(settings.get("pw_windows") or default.windows),
            num_sequential=settings.get("pw_sequential", default.num_sequential),
        )
        key_warm, key = jax.random.split(jax.random.PRNGKey(settings["seed"]))
        result = parallel_warmup(
            transition, potential, x, key_warm, schedule=schedule, solver=solver,
            num_steps_choices=choices,
        )  # fmt: skip
        info = jax.block_until_ready(result.info)
        tracker.warmup_done(
            _counts.Counts(
                float(info.total_gradients),
                float(info.critical_path_gradients),
                float(np.sum(info.windows.scan_levels)),
            )
        )
        if leapfrog:
            transition = HMC(num_steps=info.final_num_steps)
        block = settings.get("pw_block") or PW_BLOCK
        capped = window_solver(solver, transition, block, True)
        stall = stall_iterations(capped, 0.5)
        g = int(gradients_per_transition(transition))

        @jax.jit
        def segment(x, key):
            draws, _, its, fronts = sample_window(
                transition, potential, capped, block, x, result.step_size,
                result.mass_matrix_sqrt, key, stall=stall,
            )  # fmt: skip
            values = jax.vmap(jax.vmap(constrained))(draws)  # (C, W, Dc)
            return draws[:, -1], values.sum(0), (values**2).sum(0), its, fronts

        x = result.positions
        while not tracker.done():
            key, sub = jax.random.split(key)
            x, s1, s2, its, fronts = segment(x, sub)
            counts = _counts.deer_blocks(
                np.asarray(its)[:, None], np.asarray(fronts)[:, None],
                block_size=block, dim=dim, g=g, solver=capped,
            )  # fmt: skip
            tracker.segment(np.asarray(s1), np.asarray(s2), chains, counts)

    return run


# ------------------------------------------------------------ BlackJAX ones
def _flat_problem(target, chains, seed):
    """Log density on the flat unconstrained vector, constrained flattener, inits."""
    from numpyro.infer.util import initialize_model

    info = initialize_model(
        jax.random.PRNGKey(seed),
        target.model,
        model_args=target.args,
        model_kwargs=target.kwargs,
    )
    flat0, unravel = ravel_pytree(info.param_info.z)
    sites = list(target.truth)

    def logdensity(x):
        return -info.potential_fn(unravel(x))

    def constrained(x):
        return flatten_sites(info.postprocess_fn(unravel(x)), sites, 0)

    # NumPyro's default init (uniform in (-2, 2) on the unconstrained scale)
    inits = jax.random.uniform(
        jax.random.PRNGKey(seed + 1), (chains, flat0.size), flat0.dtype, -2.0, 2.0
    )
    return logdensity, constrained, inits


def _blackjax_sampling(
    step, constrained, states, chains, seg, key, tracker, position=None
):
    """Run vmapped ``step`` in jitted segments of ``seg`` steps."""

    @jax.jit
    def segment(states, key):
        def one(states, k):
            keys = jax.random.split(k, chains)
            states, info = jax.vmap(step)(keys, states)
            pos = position(states) if position else states.position
            x = jax.vmap(constrained)(pos)
            # integration steps per chain (GHMC: one leapfrog step)
            n = getattr(info, "num_integration_steps", jnp.ones(chains))
            return states, (x.sum(0), (x**2).sum(0), jnp.broadcast_to(n, (chains,)))

        return jax.lax.scan(one, states, jax.random.split(key, seg))

    while not tracker.done():
        key, sub = jax.random.split(key)
        states, (s1, s2, n) = segment(states, sub)
        counts = _counts.from_steps(np.asarray(n).T, lockstep=True)
        tracker.segment(np.asarray(s1), np.asarray(s2), chains, counts)


def chees(target, chains, settings, tracker):
    import blackjax
    import optax

    logdensity, constrained, inits = _flat_problem(target, chains, settings["seed"])
    warm = settings["hmc_warmup"]
    adapt = blackjax.chees_adaptation(logdensity, chains)
    key = jax.random.PRNGKey(settings["seed"])
    (states, params), info = adapt.run(
        key, inits, step_size=0.1, optim=optax.adam(0.025), num_steps=warm,
        max_sampling_steps=10**7,
    )  # fmt: skip
    # integration steps per adaptation step and chain, (warm, chains)
    steps = np.asarray(info.info.num_integration_steps).reshape(warm, -1)
    tracker.warmup_done(_counts.from_steps(steps.T, lockstep=True))
    step = blackjax.dynamic_hmc(logdensity, **params).step
    _blackjax_sampling(
        step, constrained, states, chains, settings["hmc_segment"], key, tracker
    )


def meads(target, chains, settings, tracker):
    import blackjax

    logdensity, constrained, inits = _flat_problem(target, chains, settings["seed"])
    warm = settings["hmc_warmup"]
    adapt = blackjax.meads_adaptation(logdensity, chains)
    key = jax.random.PRNGKey(settings["seed"])
    (states, params), _ = adapt.run(key, inits, num_steps=warm)
    # GHMC: one leapfrog step per transition
    tracker.warmup_done(_counts.sequential(chains, warm, 1))
    step = blackjax.ghmc(logdensity, **params).step
    _blackjax_sampling(
        step, constrained, states, chains, settings["hmc_segment"], key, tracker
    )


def adjusted_mclmc(target, chains, settings, tracker):
    """Adjusted MCLMC, a random number of steps per proposal (mean L / step size).

    Tuned per chain by ``adjusted_mclmc_find_L_and_step_size`` (target acceptance
    0.9).
    """
    import blackjax
    from blackjax.mcmc import adjusted_mclmc_dynamic as dyn

    logdensity, constrained, inits = _flat_problem(target, chains, settings["seed"])
    warm = settings["hmc_warmup"]

    # BlackJAX's random trajectory length (uniform, mean the tuned L / step size)
    kern = dyn.build_kernel(
        integration_steps_fn=dyn.make_random_trajectory_length_fn(True)
    )

    def tuning_kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix,
                      integration_steps_params):  # fmt: skip
        return kern(
            rng_key, state, logdensity_fn, step_size,
            inverse_mass_matrix=inverse_mass_matrix,
            integration_steps_params=integration_steps_params,
        )  # fmt: skip

    def tune(key, x0):
        k1, k2 = jax.random.split(key)
        state = dyn.init(x0, logdensity, k1)
        # the tuner spends 20 % of `num_steps` (frac_tune1 + frac_tune2)
        state, params, n = blackjax.adjusted_mclmc_find_L_and_step_size(
            tuning_kernel, logdensity, 5 * warm, state, k2, target=0.9
        )
        return state, params, n

    keys = jax.random.split(jax.random.PRNGKey(settings["seed"]), chains)
    states, params, n = jax.jit(jax.vmap(tune))(keys, inits)
    # totals per chain only: the largest is a lower bound of the lockstep path
    n = np.asarray(n, np.float64)
    tracker.warmup_done(_counts.Counts(float(n.sum()), float(n.max())))

    def step(key, state_params):
        state, p = state_params
        state, info = kern(
            key, state, logdensity, p.step_size,
            inverse_mass_matrix=p.inverse_mass_matrix,
            integration_steps_params=(p.L / p.step_size,),
        )  # fmt: skip
        return (state, p), info

    _blackjax_sampling(
        step, constrained, (states, params), chains, settings["hmc_segment"],
        jax.random.PRNGKey(settings["seed"] + 2), tracker,
        position=lambda sp: sp[0].position,
    )  # fmt: skip


def blackjax_available() -> bool:
    try:
        import blackjax  # noqa: F401
        import optax  # noqa: F401
    except ImportError:
        return False
    return True


SAMPLERS: dict[str, Callable] = {
    "nuts_diag": nuts(False),
    "nuts_dense": nuts(True),
    "mala_seq": mala("sequential"),
    "deer": mala("deer"),
    "hmc_seq": hmc("sequential"),
    "deerhmc": hmc("deer"),
    "deerhmc_auto": hmc("auto"),
    "deer_pw": parallel_warmup_row(False),
    "deerhmc_pw": parallel_warmup_row(True),
    "chees": chees,
    "meads": meads,
    "adjusted_mclmc": adjusted_mclmc,
}
BLACKJAX_SAMPLERS = ("chees", "meads", "adjusted_mclmc")
