"""The race's targets: Inference Gym posteriors as NumPyro models; benchmark models.

Each target of the race (``benchmarks/race.py``) is a plain NumPyro model with
data and a ground truth: per latent site the posterior mean and standard
deviation of every component, on the site's own (constrained) scale.

* **Inference Gym targets** (Sountsov, Radul and contributors, 2020; PyPI
  ``inference-gym`` with ``tfp-nightly`` for its JAX substrate), those whose
  data ship in the wheel. Each is written here as an ordinary NumPyro model with
  the Gym's parameterisation and site names, and its data and ground truth are
  read from the Gym object at run time (``sample_transformations["identity"]``),
  never copied by hand. :func:`gym_log_density_gap` compares the model's log
  density with the Gym's ``unnormalized_log_prob`` at random points.
* **The project's benchmark models** (``BENCHMARK_MODELS``), against long NUTS
  references stored by ``benchmarks/make_references.py`` in
  ``benchmarks/results/references/<model>.json`` (the ill-conditioned Gaussian's
  reference is its closed form).

Nothing here needs the Gym or BlackJAX at import; :func:`available_targets`
lists the targets whose truth can be had on this machine.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.models import BENCHMARK_MODELS  # noqa: E402

REFERENCE_DIR = Path(__file__).resolve().parent / "results" / "references"


class Truth(NamedTuple):
    """Ground truth of one site: posterior mean and sd of every component."""

    mean: np.ndarray
    sd: np.ndarray


class RaceTarget(NamedTuple):
    """A target of the race.

    Attributes:
        name: key in :func:`available_targets`.
        model: the NumPyro model.
        args, kwargs: its data, for ``mcmc.run(key, *args, **kwargs)``.
        truth: ``{site: Truth}`` for every latent site.
        source: where the truth comes from (Gym target, or reference method
            and its smallest bulk ESS).
        reference_ess: smallest ESS of the reference (``None``: exact or the
            Gym's own ground truth); a mean error below ``1/reference_ess``
            cannot be resolved against it.
        gym: the Gym target object (``None`` for the benchmark models).
    """

    name: str
    model: Callable[..., None]
    args: tuple
    kwargs: dict
    truth: dict[str, Truth]
    source: str
    reference_ess: float | None = None
    gym: Any = None


# ------------------------------------------------------------ Gym models
def eight_schools_centered(sigma, y=None):
    """Eight schools, centred, the Gym's parameterisation (``log_stddev``)."""
    avg_effect = numpyro.sample("avg_effect", dist.Normal(0.0, 10.0))
    log_stddev = numpyro.sample("log_stddev", dist.Normal(5.0, 1.0))
    n = jnp.shape(sigma)[-1]
    with numpyro.plate("schools", n):
        effects = numpyro.sample(
            "school_effects", dist.Normal(avg_effect, jnp.exp(log_stddev))
        )
        numpyro.sample("y", dist.Normal(effects, sigma), obs=y)


def brownian_motion_fixed_scales(observed_locs, innovation_scale, observation_scale):
    """Brownian motion ``x_t ~ N(x_{t-1}, innovation)``, ``x_0 ~ N(0, innovation)``,
    observed with noise where ``observed_locs`` is not NaN."""
    n = jnp.shape(observed_locs)[-1]
    x = numpyro.sample("x", dist.GaussianRandomWalk(innovation_scale, num_steps=n))
    observed = ~jnp.isnan(observed_locs)
    numpyro.sample(
        "y",
        dist.Normal(x, observation_scale).mask(observed).to_event(1),
        obs=jnp.where(observed, observed_locs, 0.0),
    )


def item_response_theory(
    student_ids, question_ids, correct, num_students, num_questions
):
    """One-parameter item response theory (Rasch), the Gym's parameterisation."""
    mean = numpyro.sample("mean_student_ability", dist.Normal(0.75, 1.0))
    ability = numpyro.sample(
        "centered_student_ability",
        dist.Normal(0.0, 1.0).expand([num_students.shape[0]]).to_event(1),
    )
    difficulty = numpyro.sample(
        "question_difficulty",
        dist.Normal(0.0, 1.0).expand([num_questions.shape[0]]).to_event(1),
    )
    logits = mean + ability[student_ids] - difficulty[question_ids]
    numpyro.sample("correct", dist.Bernoulli(logits=logits).to_event(1), obs=correct)


def gaussian_tril(scale_tril):
    """``x ~ MultivariateNormal(0, L L^T)``."""
    dim = jnp.shape(scale_tril)[-1]
    numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(dim), scale_tril=scale_tril))


def _gym():
    from inference_gym import using_jax as gym  # heavy: imported when asked for

    return gym


def _identity_truth(target) -> Any:
    st = target.sample_transformations["identity"]
    return st.ground_truth_mean, st.ground_truth_standard_deviation


def _gym_eight_schools():
    t = _gym().targets.EightSchools()
    mean, sd = _identity_truth(t)
    # the Gym keeps its data inside the likelihood closure; the values are those
    # of its docstring and of `benchmarks.models.EIGHT_SCHOOLS_*`, checked
    # against its log density by `gym_log_density_gap`
    from benchmarks.models import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y

    args = (jnp.asarray(EIGHT_SCHOOLS_SIGMA), jnp.asarray(EIGHT_SCHOOLS_Y))
    truth = {k: Truth(np.atleast_1d(mean[k]), np.atleast_1d(sd[k])) for k in mean}
    return eight_schools_centered, args, truth, t


def _gym_brownian():
    t = _gym().targets.BrownianMotionMissingMiddleObservations()
    data = _gym().targets.brownian_motion.data
    data = data.brownian_motion_missing_middle_observations()
    mean, sd = _identity_truth(t)
    args = (
        jnp.asarray(data["observed_locs"]),
        float(data["innovation_noise_scale"]),
        float(data["observation_noise_scale"]),
    )
    return brownian_motion_fixed_scales, args, {"x": Truth(mean, sd)}, t


def _gym_irt():
    t = _gym().targets.SyntheticItemResponseTheory()
    data = _gym().targets.item_response_theory.data.synthetic_item_response_theory()
    mean, sd = _identity_truth(t)
    sid, qid = (
        np.asarray(data["train_student_ids"]),
        np.asarray(data["train_question_ids"]),
    )
    args = (
        jnp.asarray(sid, jnp.int32),
        jnp.asarray(qid, jnp.int32),
        jnp.asarray(data["train_correct"], jnp.int32),
        # plate sizes travel as array shapes (works with jit_model_args)
        jnp.zeros(int(sid.max()) + 1),
        jnp.zeros(int(qid.max()) + 1),
    )
    truth = {k: Truth(np.atleast_1d(mean[k]), np.atleast_1d(sd[k])) for k in mean}
    return item_response_theory, args, truth, t


def _gym_ill_conditioned():
    t = _gym().targets.IllConditionedGaussian()
    mean, sd = _identity_truth(t)
    # the Gym's own Cholesky factor (float32), so the density is the Gym's
    scale_tril = jnp.asarray(np.asarray(t._gaussian.scale.to_dense()))
    return gaussian_tril, (scale_tril,), {"x": Truth(mean, sd)}, t


GYM_TARGETS: dict[str, Callable] = {
    "gym_eight_schools": _gym_eight_schools,
    "gym_brownian_motion_missing_middle": _gym_brownian,
    "gym_synthetic_irt": _gym_irt,
    "gym_ill_conditioned_gaussian": _gym_ill_conditioned,
}


def gym_available() -> bool:
    """Whether the Inference Gym's JAX substrate imports here."""
    try:
        _gym()
    except ImportError:
        return False
    return True


def to_gym_value(target: RaceTarget, params: dict) -> Any:
    """The Gym's value structure for a dict of site values (no batch axis)."""
    dtype = target.gym.dtype
    if isinstance(dtype, dict):
        return {
            k: jnp.asarray(params[k]).reshape(target.gym.event_shape[k]) for k in dtype
        }
    if hasattr(dtype, "_fields"):  # a StructTuple of scalars x_0, x_1, ...
        return type(dtype)(*[params["x"][i] for i in range(len(dtype._fields))])
    return params["x"]


def gym_log_density_gap(
    target: RaceTarget, num_points: int = 5, seed: int = 0
) -> np.ndarray:
    """``log p_numpyro(z) - log p_gym(z)`` at points ``z = truth mean + sd * N(0, 1)``.

    Both densities are unnormalised; the gaps must be equal (up to float32
    rounding) for the two to be the same posterior.
    """
    from numpyro.infer.util import log_density

    rng = np.random.default_rng(seed)
    gaps = []
    for _ in range(num_points):
        params = {
            k: jnp.asarray(
                v.mean + v.sd * rng.standard_normal(v.mean.shape), jnp.float32
            )
            for k, v in target.truth.items()
        }
        params = {
            k: p.reshape(target.gym.event_shape[k])
            if isinstance(target.gym.dtype, dict)
            else p
            for k, p in params.items()
        }
        ours, _ = log_density(target.model, target.args, target.kwargs, params)
        theirs = target.gym.unnormalized_log_prob(to_gym_value(target, params))
        gaps.append(float(ours) - float(theirs))
    return np.asarray(gaps)


# ------------------------------------------------------ benchmark models
def load_reference(name: str, directory: Path = REFERENCE_DIR) -> dict | None:
    """The stored reference of a benchmark model, or ``None`` if not made yet."""
    path = Path(directory) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _benchmark_target(name: str, ref: dict) -> RaceTarget:
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    truth = {
        k: Truth(
            np.asarray(s["mean"], np.float64).reshape(-1),
            np.asarray(s["sd"], np.float64).reshape(-1),
        )
        for k, s in ref["sites"].items()
    }
    ess = ref.get("min_ess")
    source = ref["method"] + (f"; min bulk ESS {ess:.0f}" if ess else "")
    return RaceTarget(name, bench.model, args, kwargs, truth, source, ess)


def available_targets() -> list[str]:
    """Names of the targets whose truth is available here, Gym ones first."""
    names = list(GYM_TARGETS) if gym_available() else []
    return names + [n for n in BENCHMARK_MODELS if load_reference(n) is not None]


def get_target(name: str) -> RaceTarget:
    """The race target ``name`` (see :func:`available_targets`)."""
    if name in GYM_TARGETS:
        model, args, truth, t = GYM_TARGETS[name]()
        truth = {
            k: Truth(
                np.asarray(v.mean, np.float64).reshape(-1),
                np.asarray(v.sd, np.float64).reshape(-1),
            )
            for k, v in truth.items()
        }
        return RaceTarget(
            name, model, args, {}, truth, f"Inference Gym {type(t).__name__}", None, t
        )
    ref = load_reference(name)
    if ref is None:
        raise ValueError(
            f"target {name!r}: no reference in {REFERENCE_DIR}; make it with "
            f"`python benchmarks/make_references.py --models {name}`"
        )
    return _benchmark_target(name, ref)
