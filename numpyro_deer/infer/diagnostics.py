r"""The check after a run: enough effective draws, and chains that agree.

After each :meth:`numpyro_deer.MCMC.run` (not after ``MCMC.warmup``) the
collected draws of every latent site are checked once, and a
:class:`ConvergenceDiagnosticWarning` names the worst site when

* the smallest **bulk effective sample size** of a scalar component is below
  400 (Vehtari et al., 2021: the ESS of the rank-normalised, split chains;
  400 in all, 100 per chain for the 4 chains they recommend; at most
  :math:`S \log_{10} S` of ``S`` draws, as Stan and ArviZ bound it, which
  keeps antithetic chains from a negative estimate), or
* the chains **disagree**: the rank-normalised R-hat exceeds 1.01. With
  fewer than 8 chains this is the split R-hat of Vehtari et al. (2021). With
  8 chains or more it is the nested R-hat of Margossian et al. (2024) over 4
  superchains of consecutive chains (sizes differing by at most one).

Why two R-hats: at stationarity the split R-hat of ``C`` chains is about
:math:`1 + C / \mathrm{ESS}` (each of the ``2C`` half chains holds
:math:`\mathrm{ESS} / 2C` effective draws), so with many short chains it
exceeds 1.01 on every run whose total ESS is below ``100 C``, however well
the chains mix. The nested R-hat compares ``K`` superchains,
:math:`\widehat{nR} = \sqrt{1 + \hat B_\nu / \hat W_\nu}`, with
:math:`\hat B_\nu` the variance of the superchain means and
:math:`\hat W_\nu` the mean over superchains of the variance of their chain
means plus their chains' mean within-chain variance; at stationarity it is
about :math:`1 + K / (2\,\mathrm{ESS})`, about 1.005 at the ESS threshold of
400 with ``K = 4``, for any number of chains. Below 8 chains the split R-hat
asks for at most 800 effective draws, near the ESS rule.

Everything is computed on the host with :mod:`numpyro.diagnostics`
(``effective_sample_size``, ``split_gelman_rubin``) on rank-normalised draws.
To bound the cost (about half a microsecond per value on a CPU core), each
chain is thinned evenly to at most :data:`MAX_DRAWS` draws, and to fewer
(down to :data:`MIN_DRAWS`) where chains times scalar components times draws
would exceed :data:`MAX_VALUES` (about a million: a fraction of a second):
thinning keeps the mean and the variance, and an ESS below 400 after
thinning is that of the whole chain to within the thinning's loss, which is
small where the ESS is small. Where even :data:`MIN_DRAWS` of every chain
exceed it (many vectorized chains), evenly spaced chains stand for all
(:data:`MIN_CHAINS` at least, so every superchain keeps several), their ESS
scaled by the ratio of the chain counts. On a 2-core CPU
(``benchmarks/convergence_check.py``), 1,024 stationary AR(1) chains
(coefficient 0.95) of 512 draws of 100 components are checked in 0.16 s (1.4 s
with every chain), against 16 s for every draw of every chain, with the
smallest ESS within 2 % of that computation's and the largest nested R-hat
1.003 against 1.001. Components that are constant or not finite are left
out. The message also gives the number of divergent
transitions (the ``diverging`` field, when collected). Silence the check with
``warnings.simplefilter("ignore", numpyro_deer.ConvergenceDiagnosticWarning)``.

References: A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner,
"Rank-normalization, folding, and localization: an improved R-hat for
assessing convergence of MCMC", Bayesian Analysis 16(2), 2021. C. C.
Margossian, M. D. Hoffman, P. Sountsov, L. Riou-Durand, A. Vehtari, A. Gelman,
"Nested R-hat: assessing the convergence of Markov chain Monte Carlo when
running many short chains", Bayesian Analysis, 2024.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from scipy.special import ndtri
from scipy.stats import rankdata

MIN_ESS = 400.0
MAX_RHAT = 1.01
# from this many chains on, the nested R-hat over SUPERCHAINS superchains
NESTED_CHAINS = 8
SUPERCHAINS = 4
# draws per chain kept for the check (evenly thinned), the number of values
# (chains x draws x components) it looks at, at most about, and the chains
# kept at least where MIN_DRAWS of every chain exceed it
MAX_DRAWS = 4096
MIN_DRAWS = 64
MAX_VALUES = 2**20
MIN_CHAINS = 4 * SUPERCHAINS
# components per numpy batch (bounds the FFT's memory)
_BATCH_VALUES = 2**21


class ConvergenceDiagnosticWarning(UserWarning):
    """A run's draws have a small effective sample size or chains that
    disagree (see :mod:`numpyro_deer.infer.diagnostics`)."""


class RunDiagnostics(NamedTuple):
    """The worst components of a run's draws.

    Attributes:
        num_chains, num_draws: the draws checked (``num_draws`` per chain,
            before any thinning for the check).
        min_ess: the smallest bulk ESS, and ``ess_site`` its component
            (e.g. ``"theta[3]"``).
        max_rhat: the largest R-hat, ``rhat_site`` its component and
            ``rhat_kind`` ``"split"`` or ``"nested"``.
    """

    num_chains: int
    num_draws: int
    min_ess: float
    ess_site: str
    max_rhat: float
    rhat_site: str
    rhat_kind: str

    @property
    def converged(self) -> bool:
        return self.min_ess >= MIN_ESS and self.max_rhat <= MAX_RHAT


def rank_normalize(x: np.ndarray) -> np.ndarray:
    """Rank-normalised draws (Vehtari et al., 2021, eq. 14): the normal
    quantile ``Phi^-1((r - 3/8) / (S + 1/4))`` of each draw's rank ``r``
    among all ``S`` draws of its component (average ranks for ties).
    ``x`` is ``(chains, draws, components)``."""
    chains, draws = x.shape[:2]
    # each component's draws contiguous: the sort is 1.2-1.4 times faster
    flat = np.ascontiguousarray(x.reshape(chains * draws, -1).T)
    ranks = rankdata(flat, axis=1).T
    return ndtri((ranks - 0.375) / (chains * draws + 0.25)).reshape(x.shape)


def nested_rhat(z: np.ndarray, superchains: int = SUPERCHAINS) -> np.ndarray:
    """The nested R-hat (Margossian et al., 2024) of ``z`` (``(chains, draws,
    components)``) over ``superchains`` groups of consecutive chains."""
    chain_mean = z.mean(axis=1)
    chain_var = z.var(axis=1, ddof=1)
    groups = np.array_split(np.arange(z.shape[0]), superchains)
    means = np.stack([chain_mean[g].mean(axis=0) for g in groups])
    within = np.stack(
        [
            chain_var[g].mean(axis=0)
            + (chain_mean[g].var(axis=0, ddof=1) if len(g) > 1 else 0.0)
            for g in groups
        ]
    )
    between = means.var(axis=0, ddof=1)
    return np.sqrt(1.0 + between / within.mean(axis=0))


def _component_names(site: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [site]
    return [f"{site}[{', '.join(map(str, index))}]" for index in np.ndindex(*shape)]


def _check_batch(x: np.ndarray, nested: bool) -> tuple[np.ndarray, np.ndarray]:
    """Bulk ESS and R-hat of each component of ``x`` (chains, draws, n)."""
    z = rank_normalize(x)
    half = z.shape[1] // 2
    split = np.concatenate([z[:, :half], z[:, -half:]], axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ess = bounded_ess(effective_sample_size(split), split.shape[0] * half)
        rhat = nested_rhat(z) if nested else split_gelman_rubin(z)
    return ess, np.asarray(rhat, float)


def bounded_ess(ess, size: int) -> np.ndarray:
    r"""NumPyro's ESS estimate ``size / tau`` of ``size`` draws with the
    autocorrelation time bounded below as Stan and ArviZ bound it,
    :math:`\tau \ge 1 / \log_{10} S`: at most :math:`S \log_{10} S`.
    Without the bound, antithetic chains (negative autocorrelations, as HMC
    with a fixed trajectory gives) can sum to :math:`\tau < 0`, a negative
    ESS that would read as no effective draws."""
    tau = size / np.asarray(ess, float)
    return size / np.maximum(tau, 1 / np.log10(size))


def diagnose(samples: dict, max_values: int = MAX_VALUES) -> RunDiagnostics | None:
    """The bulk ESS and R-hat of every component of ``samples`` (site ->
    draws of shape ``(chains, draws, ...)``), or ``None`` if there are fewer
    than 4 draws per chain or no component varies; from about
    ``max_values`` of the draws (evenly thinned, then evenly spaced chains,
    their ESS scaled to all chains)."""
    arrays = {k: v for k, v in samples.items() if np.ndim(v) >= 2}
    if not arrays:
        return None
    chains, draws = np.shape(next(iter(arrays.values())))[:2]
    if draws < 4:
        return None
    size = sum(int(np.prod(np.shape(v)[2:], dtype=int)) for v in arrays.values())
    keep = min(draws, MAX_DRAWS, max(MIN_DRAWS, max_values // max(chains * size, 1)))
    # spaced by at least one (keep <= draws, kept <= chains): distinct
    index = np.linspace(0, draws - 1, keep).round().astype(int)
    kept = min(chains, max(MIN_CHAINS, max_values // max(len(index) * size, 1)))
    rows = np.linspace(0, chains - 1, kept).round().astype(int)
    nested = chains >= NESTED_CHAINS
    ess_all, rhat_all, names = [], [], []
    for site, value in arrays.items():
        x = np.asarray(np.asarray(value)[rows[:, None], index], dtype=np.float64)
        x = x.reshape(len(rows), len(index), -1)
        names += _component_names(site, np.shape(value)[2:])
        step = max(1, _BATCH_VALUES // (len(rows) * len(index)))
        for start in range(0, x.shape[2], step):
            batch = x[:, :, start : start + step]
            ess, rhat = _check_batch(batch, nested)
            ess = ess * (chains / len(rows))
            usable = np.isfinite(batch).all(axis=(0, 1)) & (np.ptp(batch, (0, 1)) > 0)
            ess_all.append(np.where(usable & np.isfinite(ess), ess, np.inf))
            rhat_all.append(np.where(usable & np.isfinite(rhat), rhat, -np.inf))
    ess, rhat = np.concatenate(ess_all), np.concatenate(rhat_all)
    if not np.isfinite(ess).any() and not np.isfinite(rhat).any():
        return None
    worst_ess, worst_rhat = int(np.argmin(ess)), int(np.argmax(rhat))
    return RunDiagnostics(
        int(chains),
        int(draws),
        float(ess[worst_ess]),
        names[worst_ess],
        float(rhat[worst_rhat]),
        names[worst_rhat],
        "nested" if nested else "split",
    )


def convergence_message(
    diagnostics: RunDiagnostics, divergences: int | None, kernel: str
) -> str:
    """What the run's draws lack, the worst site, and what to do."""
    d = diagnostics
    chains = f"{d.num_chains} chain{'s' if d.num_chains > 1 else ''}"
    found = []
    if d.min_ess < MIN_ESS:
        found.append(
            f"the smallest bulk effective sample size is {d.min_ess:.0f}, at "
            f"'{d.ess_site}', below {MIN_ESS:.0f}"
        )
    if d.max_rhat > MAX_RHAT:
        which = (
            f"nested R-hat over {SUPERCHAINS} superchains"
            if d.rhat_kind == "nested"
            else "split R-hat"
        )
        found.append(
            f"the {which} reaches {d.max_rhat:.3f}, at '{d.rhat_site}', above "
            f"{MAX_RHAT}"
        )
    diverged = (
        ""
        if divergences is None
        else f" {divergences} divergent transition{'s' * (divergences != 1)}."
    )
    hmc = (
        " use DEERHMC(model) (it moves much further per draw on hierarchical models),"
        if kernel == "DEERMALA"
        else ""
    )
    return (
        f"The draws of this run ({chains} of {d.num_draws} draws) may not "
        f"represent the posterior: {'; '.join(found)}.{diverged} Estimates from "
        f"these draws are unreliable. Run more draws (num_samples),{hmc} or run "
        "more chains (num_chains); a longer num_warmup where R-hat is large. "
        "See 'Short runs' on the limitations page of the docs. To silence "
        "this: warnings.simplefilter('ignore', "
        "numpyro_deer.ConvergenceDiagnosticWarning)."
    )


def warn_if_unconverged(mcmc, stacklevel: int = 3) -> None:
    """Check a finished run of ``mcmc`` (an ``MCMC`` object) and warn once.

    The latent sites are those of the last state's sample field (its keys,
    for a model); the constrained draws of those sites are checked.
    """
    # the draws by chain as the run stored them, copied to the host (the flat
    # draws would cost an eager reshape per site, a compile each)
    samples = jax.device_get(mcmc.get_samples(group_by_chain=True))
    if not isinstance(samples, dict):
        samples = {"params": samples} if not isinstance(samples, list | tuple) else {}
    chains = mcmc.num_chains
    samples = {
        k: v for k, v in samples.items() if np.ndim(v) >= 2 and np.shape(v)[0] == chains
    }
    field = getattr(mcmc.sampler, "sample_field", "z")
    latent = getattr(mcmc.last_state, field, None)
    if isinstance(latent, dict):
        samples = {k: v for k, v in samples.items() if k in latent}
    samples = {
        k: v
        for k, v in samples.items()
        if hasattr(v, "dtype") and np.issubdtype(v.dtype, np.floating)
    }
    diagnostics = diagnose(samples)
    if diagnostics is None or diagnostics.converged:
        return
    diverging = mcmc.get_extra_fields(group_by_chain=True).get("diverging")
    divergences = None if diverging is None else int(np.sum(np.asarray(diverging)))
    warnings.warn(
        convergence_message(diagnostics, divergences, type(mcmc.sampler).__name__),
        ConvergenceDiagnosticWarning,
        stacklevel=stacklevel,
    )
