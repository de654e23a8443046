"""The report of ``scripts/gpu-check.sh``: its parts' outcomes and figures as ``summary.json``,
``chain.json`` and a short markdown table, ``summary.md``: per chain size, each device's run,
the time of each chain step on every device, and how far the results agree.

Run by the script as ``python benchmarks/_gpu_check_report.py WORK OUTDIR``; every input is
optional (a part that did not run leaves none), so a report is always written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parts(work: Path) -> list[dict]:
    try:
        lines = (work / "parts.tsv").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        name, status, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        out.append({"part": name, "status": status, "seconds": int(seconds or 0), "note": note})
    return out


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _worst(differences) -> str:
    if not differences:
        return "-"
    scored = [(d.get("max_rel_diff", d.get("fraction_differing")), name)
              for name, d in differences.items()]
    scored = [(value, name) for value, name in scored if value is not None]
    if not scored:
        return "-"
    value, name = max(scored)
    return f"{value:.1e} ({name})"


def markdown(summary: dict) -> str:
    env = summary.get("environment") or {}
    rows = [f"# GPU check, commit {env.get('commit', '?')}", "",
            f"GPU: {env.get('gpu', '?')}; nvidia-smi: {env.get('nvidia_smi', '?')}; "
            f"{env.get('cpus', '?')} CPUs, Python {env.get('python', '?')}, "
            f"NumPy {env.get('numpy', '?')}.", "",
            "| part | status | s | note |", "|---|---|---|---|"]
    rows += [f"| {p['part']} | {p['status']} | {p['seconds']} | {p['note']} |"
             for p in summary["parts"]]
    kernels = summary.get("kernels")
    if kernels:
        rows += ["", f"## Kernels (scale {kernels.get('scale')}, NumPy at "
                 f"{kernels.get('blas_threads')} BLAS thread(s); GPU {kernels.get('gpu')})", "",
                 "| kernel | items | NumPy ms | CuPy ms | CuPy ms with transfers | speed-up | "
                 "largest relative difference |", "|---|---|---|---|---|---|---|"]
        for case in kernels["cases"]:
            speedup = "-" if case["speedup"] is None else f"{case['speedup']:.1f}x"
            worst = _worst(case["differences"])
            if "error" in case:
                speedup, worst = "FAILED", case["error"][:120].replace("|", "/")
            rows.append(f"| {case['name']} | {case['items']:,} | {_ms(case['numpy_s'])} | "
                        f"{_ms(case['cupy_s'])} | {_ms(case['cupy_with_transfers_s'])} | "
                        f"{speedup} | {worst} |")
    for chain in summary.get("chains") or [summary.get("chain") or {}]:
        rows += chain_markdown(chain)
    return "\n".join(rows) + "\n"


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def steps_markdown(runs: list[dict]) -> list[str]:
    """Wall and CPU seconds of each chain step on every device that ran, side by side, and
    the first device's wall time over each other's (the steps as bench_scale.py times them)."""
    runs = [run for run in runs if run.get("steps")]
    if not runs:
        return []
    header = "| step | " + " | ".join(f"{run['device']} wall s | {run['device']} CPU s"
                                      for run in runs)
    ratios = [f"{runs[0]['device']} / {run['device']}" for run in runs[1:]]
    rows = ["", "### Chain steps", "", header + "".join(f" | {r}" for r in ratios) + " |",
            "|---|" + "---|---|" * len(runs) + "---|" * len(ratios)]
    by_device = [{step["step"]: step for step in run["steps"]} for run in runs]
    names = list(dict.fromkeys(step["step"] for run in runs for step in run["steps"]))
    for name in names:
        cells = []
        for steps in by_device:
            step = steps.get(name, {})
            cells += [_seconds(step.get("wall_s")), _seconds(step.get("cpu_s"))]
        first = by_device[0].get(name, {}).get("wall_s")
        for steps in by_device[1:]:
            other = steps.get(name, {}).get("wall_s")
            cells.append(f"{first / other:.2f}x" if first and other else "-")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def chain_markdown(chain: dict) -> list[str]:
    """One size's chain: the runs, their steps and their agreement (or why it was skipped)."""
    rows: list[str] = []
    if chain.get("skipped"):
        return ["", f"## Chain ({chain.get('n_points', 0):,} PS): skipped, {chain['skipped']}"]
    runs = [run for run in (chain.get("cpu"), chain.get("second")) if run]
    if runs:
        scene = chain.get("scene") or {}
        rows += ["", f"## Chain ({scene.get('n_points', '?'):,} PS, "
                 f"{scene.get('n_epochs', '?')} epochs)", "",
                 "| device | wall s | CPU s | points/s | peak RSS GiB | velocity RMSE mm/yr | "
                 "in result |", "|---|---|---|---|---|---|---|"]
        for run in runs:
            acc = run.get("accuracy", {})
            rows.append(f"| {run['device']} | {run['wall_s']:.1f} | {run['cpu_s']:.1f} | "
                        f"{run['points_per_s']:,.0f} | {run['peak_rss_gib']:.2f} | "
                        f"{acc.get('velocity_rmse', float('nan')) * 1e3:.3f} | "
                        f"{acc.get('n_result', '-')} |")
        rows += steps_markdown(runs)
    compare = chain.get("compare")
    if compare:
        second = (chain.get("second") or {}).get("device", "second")
        rows += ["", f"### Agreement, cpu against {second}", "",
                 f"{compare['n_common']:,} points in both, {compare['only_cpu']} only on the "
                 f"CPU, {compare['only_gpu']} only on {second}; ambiguities differing: "
                 f"{compare.get('ambiguity_fraction_differing', float('nan')):.2e}.", "",
                 "| variable | unit | max abs diff | RMS diff | finiteness differs |",
                 "|---|---|---|---|---|"]
        for name, d in compare.items():
            if isinstance(d, dict):
                rows.append(f"| {name} | {d['unit']} | {d['max_abs_diff']:.3g} | "
                            f"{d['rms_diff']:.3g} | {d['finite_mismatch']} |")
    return rows


def chains(work: Path) -> list[dict]:
    """Each size of the chain part in the order it came (``chain-sizes.txt``: ``N ran`` or
    ``N skipped WHY``), the first size's files without its size in their names."""
    try:
        lines = (work / "chain-sizes.txt").read_text().splitlines()
    except OSError:
        lines = []
    out, first = [], True
    for line in lines:
        size, status, *why = line.split(" ", 2) + [""]
        if status == "skipped":
            out.append({"n_points": int(size), "skipped": " ".join(why).strip()})
            continue
        tag = "" if first else f"-{size}"
        first = False
        out.append({"n_points": int(size), **{
            part: _load(work / f"chain{tag}-{part}.json")
            for part in ("scene", "cpu", "second", "compare")}})
    return out or [{part: _load(work / f"chain-{part}.json")
                    for part in ("scene", "cpu", "second", "compare")}]


def main(work: Path, outdir: Path) -> int:
    sizes = chains(work)
    # "chain": the first size, as before a list of sizes could be asked for; "chains": all
    chain = {**sizes[0], "sizes": sizes}
    summary = {"environment": _load(work / "env.json"), "parts": parts(work),
               "kernels": _load(outdir / "kernels.json"), "chain": sizes[0], "chains": sizes}
    (outdir / "chain.json").write_text(json.dumps(chain, indent=1))
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1))
    (outdir / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
