"""Side by side with the peer: dolphin 0.42.9's SHP selection and phase
linking and ours on the same simulated DS stack, phase RMSE against the truth and the
Cramér-Rao bound, and wall time, in one run.

dolphin must never be installed in our environment: this script creates (once, then reuses) a
virtual environment of its own, by default ``~/.cache/depsi-bench/dolphin``, installs
``dolphin==0.42.9`` there and runs it in a subprocess with that venv's python
(``_dolphin_driver.py``, which puts an inert stand-in for GDAL in place: dolphin imports it for
raster IO only, and it has no wheel).

1. Stack: :func:`depsi.simulate.simulate_ds_stack` (default coherence model, three stripes 6 dB
   apart with their own phase histories), saved once as ``.npy`` for both sides.
2. dolphin: ``shp.estimate_neighbors`` (GLRT, alpha as ours) and ``run_phase_linking`` (EMI or
   EVD, its defaults otherwise: no regularisation, ``beta=0``), same 11 x 11 window.
   The whole scene in one call, with ``PJRT_NPROC`` set to more XLA threads than cores:
   jaxlib's default pool of one thread per core deadlocks on 2 cores (``_dolphin_driver.py``
   says where).
3. Ours: ``select_shp`` then ``phase_linking`` (defaults), Dask threads, BLAS at one thread per
   task; with ``--ministack K`` also the sequential estimator (``phase_linking(...,
   ministack=K)``) on stacks of more than K epochs. Each run of ours goes in a fresh (spawned)
   process, so its peak RSS is its own.
4. Figures: phase RMSE (rad) over the pixels every side linked and every epoch but the first,
   against the truth; the Cramér-Rao bound at each side's own SHP counts and the true
   coherence; wall time of a first run (dolphin's includes JAX's compilation) and a second;
   peak RSS of each side's process; ratios dolphin / ours.

Run: ``python benchmarks/bench_phase_linking.py [--epochs 30 60 120] [--shape 64 96]
[--method emi] [--ministack 15] [--skip-dolphin] [--venv PATH] [--dolphin-tile 0]
[--dolphin-timeout 1800]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import dask
import numpy as np

from depsi.conventions import wrap_phase
from depsi.kernels.backend import single_threaded_blas
from depsi.kernels.phase_linking import DEFAULT_ALPHA, cramer_rao_bound
from depsi.processing.distributed_scatterers import DEFAULT_WINDOW, phase_linking, select_shp
from depsi.simulate.ds import simulate_ds_stack

DOLPHIN_VERSION = "0.42.9"
DEFAULT_VENV = Path.home() / ".cache" / "depsi-bench" / "dolphin"
DRIVER = Path(__file__).with_name("_dolphin_driver.py")
#: XLA's intra-op threads for dolphin (``PJRT_NPROC``): jaxlib's LAPACK calls split their batch
#: over the pool they run on and wait for it, so a pool of one thread a core (2 here) locks when
#: two such calls run at once (``_dolphin_driver.py``); 8 leaves threads free to do the work.
DOLPHIN_XLA_THREADS = 8


def ensure_venv(venv: Path) -> Path:
    """dolphin's own venv, created and filled once; its python."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "from importlib.metadata import version; "
             "print(version('dolphin'))"]
    if python.exists():
        done = subprocess.run(check, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == DOLPHIN_VERSION:
            return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"dolphin=={DOLPHIN_VERSION}"],
                   check=True)
    return python


def linked_pixels(phase: np.ndarray, shp_count: np.ndarray) -> np.ndarray:
    return np.isfinite(phase).all(axis=-1) & (shp_count >= 2)


def score(phase: np.ndarray, truth, shp_count: np.ndarray, linked: np.ndarray) -> dict:
    """RMSE against the truth (phases referenced to the first epoch) on the ``linked`` pixels,
    and the bound at this side's SHP counts there."""
    referenced = wrap_phase(phase - phase[..., :1])
    error = wrap_phase(referenced - truth["phase"].values)[linked][:, 1:]
    n_epochs = phase.shape[-1]
    coherence = np.broadcast_to(truth["coherence"].values, (int(linked.sum()), n_epochs, n_epochs))
    bound = cramer_rao_bound(coherence, shp_count[linked])[:, 1:]
    rmse, crb = float(np.sqrt(np.mean(error**2))), float(np.sqrt(np.mean(bound)))
    return {"pixels": int(linked.sum()), "rmse": rmse, "crb": crb, "ratio": rmse / crb}


def _ours_twice(stack, method: str, ministack: int | None):
    """Ours, twice, in the spawned process: times, phase, SHP counts, peak RSS (MB)."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        with single_threaded_blas(), dask.config.set(scheduler="threads"):
            shp = select_shp(stack, alpha=DEFAULT_ALPHA).persist()
            linked = phase_linking(stack, shp, method=method, ministack=ministack).compute()
        times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return times, linked["phase"].values, linked["shp_count"].values, peak_mb


def run_ours(stack, method: str, ministack: int | None = None):
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        times, phase, count, peak_mb = pool.submit(_ours_twice, stack, method,
                                                   ministack).result()
    return ({"first_s": times[0], "second_s": times[1], "peak_rss_mb": peak_mb}, phase, count)


def run_dolphin(python: Path, slc: np.ndarray, method: str, workdir: Path, *, tile: int,
                timeout_s: float):
    stack_path, out_path = workdir / "stack.npy", workdir / "dolphin.npz"
    np.save(stack_path, slc)
    params = {"half_window": [w // 2 for w in DEFAULT_WINDOW], "alpha": DEFAULT_ALPHA,
              "method": method, "tile": tile, "watchdog_s": timeout_s}
    env = os.environ | {"PJRT_NPROC": str(DOLPHIN_XLA_THREADS)}
    done = subprocess.run([str(python), str(DRIVER), str(stack_path), str(out_path),
                           json.dumps(params)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"dolphin driver failed:\n{done.stderr[-3000:]}")
    out = np.load(out_path)
    return ({"first_s": float(out["seconds"][0]), "second_s": float(out["seconds"][1]),
             "peak_rss_mb": float(out["peak_rss_mb"])}, out["phase"], out["shp_count"])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, nargs="+", default=[30, 60, 120])
    parser.add_argument("--shape", type=int, nargs=2, default=[64, 96])
    parser.add_argument("--method", choices=["emi", "evd"], default="emi")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--ministack", type=int, default=None,
                        help="also ours with the sequential estimator, K epochs a mini-stack")
    parser.add_argument("--skip-dolphin", action="store_true")
    parser.add_argument("--dolphin-tile", type=int, default=0,
                        help="dolphin in tiles of this many pixels a side (0: one call)")
    parser.add_argument("--dolphin-timeout", type=float, default=1800.0,
                        help="seconds before dolphin's driver dumps its stacks and exits")
    args = parser.parse_args(argv)
    python = None if args.skip_dolphin else ensure_venv(args.venv)
    records = []
    for n_epochs in args.epochs:
        stack, truth = simulate_ds_stack(shape=tuple(args.shape), n_epochs=n_epochs,
                                         seed=n_epochs)
        stack = stack.persist()
        record = {"epochs": n_epochs, "shape": args.shape, "method": args.method}
        results = {"ours": run_ours(stack, args.method)}
        sequential = f"ours ministack {args.ministack}"
        if args.ministack is not None and args.ministack < n_epochs:
            results[sequential] = run_ours(stack, args.method, args.ministack)
        if python is not None:
            with tempfile.TemporaryDirectory() as workdir:
                results["dolphin"] = run_dolphin(
                    python, stack["complex"].values, args.method, Path(workdir),
                    tile=args.dolphin_tile, timeout_s=args.dolphin_timeout)
        common = np.logical_and.reduce([linked_pixels(phase, count)
                                        for _, phase, count in results.values()])
        for side, (times, phase, count) in results.items():
            record[side] = times | score(phase, truth, count, common)
        if python is not None:
            for side in results.keys() - {"dolphin"}:
                record[f"time_ratio_dolphin_over_{side.replace(' ', '_')}"] = (
                    record["dolphin"]["second_s"] / record[side]["second_s"])
        records.append(record)
        print(json.dumps(record), flush=True)
    print("\n| epochs | side | pixels | RMSE (rad) | CRB (rad) | RMSE / CRB | first run (s) "
          "| second run (s) | peak RSS (MB) |\n|---|---|---|---|---|---|---|---|---|")
    for record in records:
        for side, r in record.items():
            if isinstance(r, dict):
                print(f"| {record['epochs']} | {side} | {r['pixels']} | {r['rmse']:.4f} | "
                      f"{r['crb']:.4f} | {r['ratio']:.3f} | {r['first_s']:.2f} | "
                      f"{r['second_s']:.2f} | {r['peak_rss_mb']:.0f} |")
    return records


if __name__ == "__main__":
    main()
