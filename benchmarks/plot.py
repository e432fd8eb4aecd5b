"""Plot the suite's results: DEER's speed-up over the sequential chain against T.

    python3 benchmarks/plot.py [suite.json ...] [-o speedup.png]

Left: sequential time / DEER time (both through ``numpyro_deer.MCMC``, same
chain), one line per model, against the chain length T, each point labelled
with the median Newton iterations per block. Right: min ESS per second
relative to NUTS for DEER (solid, circles) and the sequential chain (dashed,
squares). Hollow markers: some block's DEER solve did not converge (that block
was computed sequentially). Needs matplotlib only (Agg backend, no display).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "json",
        nargs="*",
        default=[str(HERE / "results" / "suite.json")],
        help="suite JSON files; the rows of several are merged "
        "(e.g. one suite run per model)",
    )
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help="PNG path (default: the first JSON's path with .png)",
    )
    return parser.parse_args(argv)


def _series(rows, method, key):
    """model -> sorted [(T, value, all blocks converged, median Newton its)]."""
    out = defaultdict(list)
    for row in rows:
        if row.get("method") != method or row.get(key) is None or row.get("error"):
            continue
        converged = row.get("blocks_converged_fraction")
        out[row["model"]].append(
            (
                row["T"],
                row[key],
                converged is None or converged >= 1.0,
                row.get("newton_its_median"),
            )
        )
    return {model: sorted(points) for model, points in out.items()}


def _draw(
    ax, series, colors, linestyle="-", marker="o", label_suffix="", annotate=False
):
    for model, points in sorted(series.items()):
        color = colors.setdefault(model, f"C{len(colors) % 10}")
        ts = [p[0] for p in points]
        ys = [p[1] for p in points]
        ax.plot(
            ts,
            ys,
            linestyle=linestyle,
            marker=marker,
            color=color,
            markerfacecolor="none",
            markersize=0,
            label=model + label_suffix,
        )
        for t, y, converged, its in points:
            ax.plot(
                [t],
                [y],
                marker,
                color=color,
                markerfacecolor=color if converged else "white",
            )
            if annotate and its is not None:
                ax.annotate(
                    f"{its:g}",
                    (t, y),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize="x-small",
                    color=color,
                )


def _fill_speedups(rows):
    """``speedup_vs_sequential`` of DEER rows from a run cut short before it
    was written: the sequential row's time over DEER's, same model and T."""
    seq = {
        (r["model"], r["T"]): r["time_s"]
        for r in rows
        if r.get("method") == "sequential" and r.get("time_s")
    }
    for row in rows:
        key = (row.get("model"), row.get("T"))
        if (
            row.get("method") == "deer"
            and row.get("speedup_vs_sequential") is None
            and row.get("time_s")
            and key in seq
        ):
            row["speedup_vs_sequential"] = seq[key] / row["time_s"]
    return rows


def plot(results: dict, output: Path) -> Path:
    rows = _fill_speedups(results.get("rows", []))
    fig, (ax_speed, ax_nuts) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors: dict[str, str] = {}

    speed = _series(rows, "deer", "speedup_vs_sequential")
    _draw(ax_speed, speed, colors, annotate=True)
    ax_speed.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax_speed.set_xscale("log", base=2)
    ax_speed.set_yscale("log")
    ax_speed.set_xlabel("chain length T (draws)")
    ax_speed.set_ylabel("speed-up: sequential time / DEER time")
    ax_speed.set_title(
        "DEERMALA vs the same chain computed sequentially\n"
        "(numbers: median Newton iterations per block)",
        fontsize="medium",
    )
    if not speed:
        ax_speed.text(
            0.5,
            0.5,
            "no DEER rows with a sequential reference",
            ha="center",
            transform=ax_speed.transAxes,
        )

    vs_nuts = _series(rows, "deer", "ess_per_s_vs_nuts")
    _draw(ax_nuts, vs_nuts, colors)
    _draw(
        ax_nuts,
        _series(rows, "sequential", "ess_per_s_vs_nuts"),
        colors,
        linestyle="--",
        marker="s",
        label_suffix=" (sequential)",
    )
    ax_nuts.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax_nuts.set_xscale("log", base=2)
    ax_nuts.set_yscale("log")
    ax_nuts.set_xlabel("chain length T (draws)")
    ax_nuts.set_ylabel("min ESS per second / NUTS's")
    ax_nuts.set_title(
        "min ESS/s relative to NUTS\n"
        "(solid, circles: DEER; dashed, squares: sequential)",
        fontsize="medium",
    )
    # one legend of colours (models) for both panels; line styles are in titles
    if colors:
        ax_speed.legend(
            handles=[
                plt.Line2D([], [], color=color, marker="o", label=model)
                for model, color in colors.items()
            ],
            fontsize="small",
        )

    machine = results.get("machine", {})
    config = results.get("config", {})
    block = config.get("block_size") or (
        f"min(T, {config['max_block_size']})"
        if config.get("max_block_size")
        else "per model (benchmarks/results/LOG.md)"
    )
    fig.suptitle(
        f"{machine.get('device_kind')} ({machine.get('backend')}), jax "
        f"{machine.get('jax')}, numpyro {machine.get('numpyro')}; block size {block}; "
        "hollow marker: a block did not converge",
        fontsize="medium",
    )
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def _block_setting(results: dict) -> tuple:
    config = results.get("config", {})
    return config.get("block_size"), config.get("max_block_size")


def main(argv=None):
    args = parse_args(argv)
    paths = [Path(p) for p in args.json]
    results = None
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        if results is None:
            results = part
        else:
            results["rows"] = results.get("rows", []) + part.get("rows", [])
            if _block_setting(part) != _block_setting(results):
                unset = {"block_size": None, "max_block_size": None}
                results["config"] = {**results.get("config", {}), **unset}
    output = Path(args.output) if args.output else paths[0].with_suffix(".png")
    plot(results, output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
