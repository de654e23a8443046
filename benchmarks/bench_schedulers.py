"""Wall time of the same pipeline config on threads, a LocalCluster and a SLURMCluster.

Runs ``run_pipeline`` (stack, selection, chain, export) on one simulated config per scheduler,
each in its own workspace, and prints the time per step and the ratio to the threads run
measured in the same run. SLURM is used when ``sbatch`` works (start it with
``scripts/slurm-up.sh``; its environment is read from ``$DEPSI_SLURM_DIR/env``).

    python benchmarks/bench_schedulers.py [--size 120] [--epochs 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from depsi.pipeline import parse_config, run_pipeline


def _slurm_available() -> bool:
    env_file = Path(os.environ.get("DEPSI_SLURM_DIR", "/tmp/depsi-slurm")) / "env"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            if key.strip():
                os.environ[key.strip()] = value.strip()
    if shutil.which("sinfo") is None:
        return False
    return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=120)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-schedulers-"))
    computes = {"threads": {"scheduler": "threads", "threads": 2},
                "local": {"scheduler": "local", "workers": 2, "threads": 1}}
    if _slurm_available():
        computes["slurm"] = {"scheduler": "slurm", "worker_timeout": 90, "slurm": {
            "cores": 1, "memory": "1GB", "walltime": "00:10:00", "interface": "lo", "jobs": 2,
            "local_directory": str(root / "scratch"), "log_directory": str(root / "logs")}}
    rows = {}
    for name, compute in computes.items():
        config = parse_config({
            "input": {"simulate": {"shape": [args.size, args.size], "n_epochs": args.epochs,
                                   "seed": 7, "ps_fraction": 0.03}},
            "output": {"workspace": str(root / name), "exports": ["csv"]},
            "compute": compute})
        summary = run_pipeline(config, progress=False)
        rows[name] = summary
    print(f"pipeline {args.size}x{args.size} px, {args.epochs} epochs "
          f"({rows['threads'].steps['chain'].counts.get('points')} result points), 2 cores")
    print(f"{'scheduler':<10} {'total s':>8} {'x threads':>9}  per step (s)")
    base = rows["threads"].seconds
    for name, summary in rows.items():
        steps = ", ".join(f"{s} {r.seconds:.1f}" for s, r in summary.steps.items())
        print(f"{name:<10} {summary.seconds:8.1f} {summary.seconds / base:9.2f}  {steps}")
    if "slurm" not in rows:
        print("slurm: not measured (no working sbatch; run scripts/slurm-up.sh)")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
