"""The figures of docs/benchmarks.md, drawn from the measured figures in benchmarks/results/*.json.

Each JSON file holds what a benchmark printed, with the date, commit, machine and command of the
run; nothing here measures anything. Every figure says in its footer which files and commits it
was drawn from.

Run: ``python benchmarks/plots.py [--results benchmarks/results] [--out docs/figures]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _load(results: Path, name: str) -> dict:
    return json.loads((results / f"{name}.json").read_text())


def _footer(fig, text: str) -> None:
    text += "; drawn by python benchmarks/plots.py"
    fig.text(0.01, 0.01, text, fontsize=6.5, color="0.35", ha="left", va="bottom", wrap=True)


def _commits(runs: list[dict]) -> str:
    seen = []
    for run in runs:
        tag = f"{run['commit']} ({run['date']})"
        if tag not in seen:
            seen.append(tag)
    return ", ".join(seen)


def chain_scaling(results: Path, out: Path) -> Path:
    """Wall time and peak memory of the chain against the number of points, per scheduler."""
    runs = _load(results, "scale")["runs"]
    series: dict[str, list[dict]] = {}
    for run in runs:
        series.setdefault(run["series"], []).append(run)
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, points in series.items():
        points = sorted(points, key=lambda r: r["points"])
        ax_time.plot([r["points"] for r in points], [r["wall_s"] for r in points], "o-",
                     label=name)
        with_memory = [r for r in points if r.get("peak_gb") is not None]
        ax_mem.plot([r["points"] for r in with_memory], [r["peak_gb"] for r in with_memory],
                    "o-", label=name)
    reference = [1e5, 1e7]
    ax_time.plot(reference, [10.0, 1000.0], ":", color="0.6", label="linear growth")
    ax_time.set(xscale="log", yscale="log", xlabel="points", ylabel="wall time (s)",
                title="PS chain, 60 epochs, 2 cores")
    ax_mem.axhline(4.0, color="0.6", ls=":", label="4 GB driver target")
    ax_mem.set(xscale="log", yscale="log", xlabel="points",
               ylabel="peak RSS (GB = 2^30 B; driver for clusters)", title="peak memory")
    for ax in (ax_time, ax_mem):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    _footer(fig, "benchmarks/results/scale.json: bench_scale.py and bench_capacity.py; runs at "
            + _commits(runs))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out / "bench_chain_scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def peers(results: Path, out: Path) -> Path:
    """Wall time of depsi and of the peer on each comparison, as bars."""
    comparisons = _load(results, "peers")["comparisons"]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    positions = range(len(comparisons))
    width = 0.38
    ours = [c["depsi"] for c in comparisons]
    theirs = [c["peer_value"] for c in comparisons]
    ax.bar([p - width / 2 for p in positions], ours, width, label="depsi")
    ax.bar([p + width / 2 for p in positions], theirs, width, label="peer (named below)")
    for p, c in zip(positions, comparisons, strict=True):
        # the ratio as the benchmark printed it (from unrounded times) where it is recorded
        ratio = c.get("ratio", c["peer_value"] / c["depsi"])
        ax.text(p, max(c["depsi"], c["peer_value"]) * 1.15, f"{ratio:.1f}x", ha="center",
                fontsize=8)
    ax.set_xticks(list(positions))
    ax.set_xticklabels([c["label"] for c in comparisons], fontsize=7.5)
    ax.set(yscale="log", ylabel="wall time (s)",
           title="depsi beside its peers, same run, same input")
    ax.set_ylim(top=max(theirs) * 3)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    _footer(fig, "benchmarks/results/peers.json: bench_peer.py, bench_real_stack.py, "
            "bench_phase_linking.py; runs at " + _commits(comparisons))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out / "bench_peers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy(results: Path, out: Path) -> Path:
    """Height and velocity RMSE of each scene family against its floors."""
    sets = _load(results, "accuracy")["sets"]
    rows = [(s["name"], r) for s in sets for r in s["rows"]]
    fig, (ax_h, ax_v) = plt.subplots(1, 2, figsize=(11, 4.6))
    positions = list(range(len(rows)))
    labels = [r["family"] for _, r in rows]
    for ax, key, floors, unit in ((ax_h, "height_m", ("noise", "kriging", "no_correction"), "m"),
                                  (ax_v, "velocity_mm_yr", ("noise", "no_correction"), "mm/yr")):
        floor_key = key.split("_")[0] + "_floors_" + key.split("_", 1)[1]
        ax.bar(positions, [r[key] for _, r in rows], 0.6, color="C0", alpha=0.55, label="depsi")
        markers = {"noise": ("v", "C2"), "kriging": ("_", "k"), "no_correction": ("^", "C1")}
        for floor in floors:
            marker, colour = markers[floor]
            ax.plot(positions, [r[floor_key][floor] for _, r in rows], marker, color=colour,
                    ls="none", ms=9, mew=2, label=f"{floor.replace('_', ' ')} floor")
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set(ylabel=f"RMSE ({unit})")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    ax_h.set_title("height error")
    ax_v.set_title("velocity")
    _footer(fig, "benchmarks/results/accuracy.json: tests/test_scene_families.py (first nine) and "
            "tests/test_atmosphere_families.py (last five); runs at " + _commits(sets))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out / "bench_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gpu_kernels(results: Path, out: Path) -> Path:
    """Each kernel's CuPy speed-up over NumPy, with and without the transfers."""
    doc = _load(results, "gpu_kernels")
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(10, 4.6))
    positions = list(range(len(rows)))
    width = 0.38
    ax.bar([p - width / 2 for p in positions], [r["numpy_ms"] / r["cupy_ms"] for r in rows],
           width, label="on the device")
    ax.bar([p + width / 2 for p in positions],
           [r["numpy_ms"] / r["cupy_with_transfers_ms"] for r in rows], width,
           label="with the transfers")
    ax.axhline(1.0, color="0.4", lw=0.8)
    ax.set_xticks(positions)
    ax.set_xticklabels([r["kernel"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set(yscale="log", ylabel="NumPy time / CuPy time", title="kernels on the GPU")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    _footer(fig, f"benchmarks/results/gpu_kernels.json: {doc['machine']}; {doc['commit']} "
            f"({doc['date']}); {doc['command']}")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out / "bench_gpu_kernels.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FIGURES = (chain_scaling, peers, accuracy, gpu_kernels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for figure in FIGURES:
        print(figure(args.results, args.out))


if __name__ == "__main__":
    main()
