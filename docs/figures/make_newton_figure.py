"""Draw ``newton_iterates.png``: DEER's Newton iterates converge onto the chain.

A MALA chain of ``T`` steps on a correlated 2-D Gaussian is computed twice from
the same tape: one step after the other (:func:`numpyro_deer.sequential_chain`)
and by parallel Newton iterations (:func:`numpyro_deer.newton_iterates`, the
iterates of the default stochastic quasi-DEER solver). The left panel shows the
first coordinate of a few iterates against the step index; the right panel the
largest distance of each iterate from the sequential chain and the front (the
number of leading steps that are already exact).

Run from the repository root::

    python docs/figures/make_newton_figure.py

It writes ``docs/figures/newton_iterates.png`` (float64, fixed keys, a few
seconds on a CPU).
"""

from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from numpyro_deer import (  # noqa: E402
    DEERSolver,
    make_step_fn,
    make_tape,
    newton_iterates,
    sequential_chain,
)

NUM_STEPS = 64
NUM_ITERATIONS = 30
STEP_SIZE = 0.2
SHOWN = (1, 3, 6, 10, 15)
EXACT = 1e-6  # distance below which a state counts as exact (float64)
OUTPUT = Path(__file__).with_name("newton_iterates.png")

# A correlated 2-D Gaussian target: U(x) = x^T P x / 2.
COVARIANCE = jnp.array([[1.0, 0.8], [0.8, 1.0]])
PRECISION = jnp.linalg.inv(COVARIANCE)


def potential(x):
    return 0.5 * x @ PRECISION @ x


def main() -> None:
    key_tape, key_probe = jax.random.split(jax.random.PRNGKey(1))
    x0 = jnp.array([2.5, -1.5])
    tape = make_tape(key_tape, NUM_STEPS, 2)
    chain, _ = sequential_chain(potential, x0, tape, STEP_SIZE)
    step_fn = make_step_fn(potential, STEP_SIZE)
    iterates = newton_iterates(
        step_fn, x0, tape, key_probe, NUM_ITERATIONS, DEERSolver()
    )

    error = jnp.max(jnp.abs(iterates - chain), axis=-1)  # (iterations, steps)
    exact = error <= EXACT
    front = jnp.sum(jnp.cumprod(exact, axis=1), axis=1)
    max_error = jnp.max(error, axis=1)
    converged = int(jnp.argmax(max_error <= EXACT)) + 1

    steps = jnp.arange(NUM_STEPS + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    cmap = plt.get_cmap("viridis")
    for n, k in enumerate(SHOWN):
        path = jnp.concatenate([x0[None, 0], iterates[k - 1, :, 0]])
        left.plot(
            steps,
            path,
            color=cmap(n / len(SHOWN)),
            lw=1.2,
            alpha=0.9,
            label=f"Newton iterate {k}",
        )
    left.plot(
        steps,
        jnp.concatenate([x0[None, 0], chain[:, 0]]),
        "k--",
        lw=1.5,
        label="sequential chain",
    )
    left.set_xlabel("MALA step t")
    left.set_ylabel("first coordinate of $s_t$")
    left.set_title("Iterates converge onto the sequential chain")
    left.legend(fontsize=8, loc="best")

    iters = jnp.arange(1, NUM_ITERATIONS + 1)
    right.semilogy(iters, jnp.maximum(max_error, 1e-16), "o-", ms=3, color="C0")
    right.set_xlabel("Newton iteration")
    right.set_ylabel("max$_t$ |iterate - chain|", color="C0")
    right.set_title(f"Error and front (all {NUM_STEPS} steps exact at {converged})")
    twin = right.twinx()
    twin.plot(iters, front, "s-", ms=3, color="C1", label="front")
    twin.plot(
        iters, iters, ":", color="C1", alpha=0.6, label="guaranteed: one per iteration"
    )
    twin.set_ylabel("front (exact leading steps)", color="C1")
    twin.legend(fontsize=8, loc="center right")
    twin.set_ylim(0, NUM_STEPS + 2)

    fig.savefig(OUTPUT, dpi=110)
    print(f"wrote {OUTPUT} (converged after {converged} iterations)")


if __name__ == "__main__":
    main()
