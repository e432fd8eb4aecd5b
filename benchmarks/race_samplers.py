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
* ``chees``: BlackJAX's ChEES-HMC (``chees_adaptation`` with Adam, learning rate
  0.025, then ``dynamic_hmc`` with the adapted jittered trajectory length).
* ``meads``: BlackJAX's MEADS (``meads_adaptation``, then ``ghmc``).
* ``adjusted_mclmc``: BlackJAX's adjusted MCLMC, tuned per chain.

NumPyro competitors run through ``numpyro.infer.MCMC`` (``numpyro_deer.MCMC``
for DEER); the BlackJAX ones through a jitted ``lax.scan`` of the vmapped step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.flatten_util import ravel_pytree

import numpyro_deer


def flatten_sites(samples: dict, sites: list[str], lead: int) -> jax.Array:
    """Concatenate the sites' values into ``(*lead_shape, D)`` in ``sites`` order."""
    return jnp.concatenate(
        [jnp.reshape(samples[k], samples[k].shape[:lead] + (-1,)) for k in sites],
        axis=-1,
    )


# ------------------------------------------------------------- NumPyro ones
def _numpyro_competitor(
    target,
    chains,
    settings,
    tracker,
    kernel,
    driver,
    seg,
    warmup,
    extra,
    warmup_grads=None,
):
    args, kwargs = target.args, target.kwargs
    sites = list(target.truth)
    if chains == 1:
        method = "sequential"
    elif (
        settings["platform"] == "cpu"
        and driver is numpyro.infer.MCMC
        and jax.local_device_count() >= chains
    ):
        method = "parallel"  # one chain per core (the caller sets the device count)
    else:
        method = "vectorized"
    mcmc = driver(
        kernel,
        num_warmup=warmup,
        num_samples=seg,
        num_chains=chains,
        chain_method=method,
        progress_bar=False,
    )
    key = jax.random.PRNGKey(settings["seed"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nuts_steps = "num_steps" in extra
        mcmc.warmup(key, *args, extra_fields=extra, collect_warmup=nuts_steps, **kwargs)
        if warmup_grads is None:
            warmup_grads = _grads(mcmc, extra, chains, warmup)
        tracker.warmup_done(warmup_grads)
        if driver is numpyro.infer.MCMC:
            return _kernel_segments(mcmc, target, chains, method, seg, tracker)
        while not tracker.done():
            mcmc.run(
                mcmc.post_warmup_state.rng_key, *args, extra_fields=extra, **kwargs
            )
            draws = flatten_sites(mcmc.get_samples(group_by_chain=True), sites, 2)
            s1, s2 = draws.sum(0), (draws**2).sum(0)
            tracker.segment(
                np.asarray(s1), np.asarray(s2), chains, _grads(mcmc, extra, chains, seg)
            )
            mcmc.post_warmup_state = mcmc.last_state


def _kernel_segments(mcmc, target, chains, method, seg, tracker):
    """Sample after ``mcmc.warmup`` in segments of one compiled ``lax.scan``.

    ``numpyro.infer.MCMC.run`` compiles its sampling loop anew on every call
    (``fori_collect`` jits a fresh closure), which a user sampling once pays
    once; this loop over the kernel's own ``sample`` compiles once (``pmap``
    over the chains for ``"parallel"``, ``vmap`` for ``"vectorized"``).
    """
    sampler, (args, kwargs) = mcmc.sampler, (target.args, target.kwargs)
    constrain = sampler.postprocess_fn(args, kwargs)
    sites = list(target.truth)

    def one_chain(state):
        def body(state, _):
            state = sampler.sample(state, args, kwargs)
            x = flatten_sites(constrain(state.z), sites, 0)
            return state, (x, x**2, state.num_steps)

        state, (x, x2, n) = jax.lax.scan(body, state, None, length=seg)
        return state, x, x2, jnp.sum(n)

    if method == "parallel":
        fn = jax.pmap(one_chain)
    elif method == "vectorized":
        fn = jax.jit(jax.vmap(one_chain))
    else:
        fn = jax.jit(lambda st: jax.tree.map(lambda v: v[None], one_chain(st)))
    state = mcmc.post_warmup_state
    while not tracker.done():
        state, x, x2, n = fn(state)
        s1, s2 = np.asarray(x).sum(0), np.asarray(x2).sum(0)
        tracker.segment(s1, s2, chains, float(np.asarray(n).sum()))


def _grads(mcmc, extra, chains, steps):
    """Gradient evaluations of the last warmup/run, all chains."""
    if "num_steps" in extra:
        return float(np.asarray(mcmc.get_extra_fields()["num_steps"]).sum())
    if "newton_iterations" in extra:
        # one gradient per state per Newton iteration (JVPs of the Jacobian
        # estimate not counted); iterations are reported once per draw, so
        # sum them over the first draw of each block
        its = np.asarray(
            mcmc.get_extra_fields(group_by_chain=True)["newton_iterations"]
        )
        block = (
            mcmc.sampler.block_size
            if hasattr(mcmc.sampler, "block_size")
            else its.shape[1]
        )
        return float(its[:, ::block].sum() * block)
    return float(chains * steps)  # one gradient per MALA step


def nuts(dense: bool) -> Callable:
    def run(target, chains, settings, tracker):
        kernel = numpyro.infer.NUTS(target.model, dense_mass=dense)
        _numpyro_competitor(
            target, chains, settings, tracker, kernel, numpyro.infer.MCMC,
            settings["nuts_segment"], settings["nuts_warmup"], ("num_steps",),
        )  # fmt: skip

    return run


def mala(method: str) -> Callable:
    def run(target, chains, settings, tracker):
        block = settings["block_size"]
        kernel = numpyro_deer.DEERMALA(target.model, block_size=block, method=method)
        extra = ("newton_iterations",) if method == "deer" else ()
        _numpyro_competitor(
            target, chains, settings, tracker, kernel, numpyro_deer.MCMC,
            block, settings["mala_warmup"], extra,
            # warmup is sequential MALA: one gradient per step and chain
            warmup_grads=float(chains * settings["mala_warmup"]),
        )  # fmt: skip

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
            n = getattr(info, "num_integration_steps", jnp.ones(chains))
            return states, (x.sum(0), (x**2).sum(0), jnp.sum(n))

        return jax.lax.scan(one, states, jax.random.split(key, seg))

    while not tracker.done():
        key, sub = jax.random.split(key)
        states, (s1, s2, n) = segment(states, sub)
        tracker.segment(
            np.asarray(s1), np.asarray(s2), chains, float(np.asarray(n).sum())
        )


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
    grads = np.asarray(
        getattr(info.info, "num_integration_steps", np.full(warm, np.nan))
    )
    tracker.warmup_done(float(np.nansum(grads)))
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
    tracker.warmup_done(float(chains * warm))  # GHMC: one leapfrog step per transition
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
    tracker.warmup_done(float(np.asarray(n).sum()))

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
    "chees": chees,
    "meads": meads,
    "adjusted_mclmc": adjusted_mclmc,
}
BLACKJAX_SAMPLERS = ("chees", "meads", "adjusted_mclmc")
