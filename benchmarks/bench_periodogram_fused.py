"""Benchmark: the periodogram's fused Numba kernel against the array-namespace kernel (the
reference), in the same process, printed as ratios (no asserts); and what the first call costs.

Cases, each on the same arcs (60 epochs by default, 0.5 rad noise, the default grid):
per-item ``h2ph`` (what arcs and densification give), shared ``h2ph``, and per-item ``h2ph``
with one extra (seasonal) regressor. Times are the smallest of ``--repeat`` calls, wall and CPU
(the machine is shared: on a loaded machine the CPU time is the steadier). BLAS runs one thread
per caller, as in the chain's steps, unless ``--blas-threads`` says otherwise.

The first call of a process compiles the kernel or loads it from the cache: both are timed in
fresh subprocesses (an empty cache directory, then the one it filled).

``--stages``: the fused kernel's thread CPU an arc in each of its stages instead (per-item
``h2ph``, the smallest of ``--repeat`` calls per stage).

Run: ``python benchmarks/bench_periodogram_fused.py [--items 20000] [--epochs 60]
[--repeat 3] [--blas-threads N] [--no-compile] [--stages]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

_BLAS = sys.argv[sys.argv.index("--blas-threads") + 1] if "--blas-threads" in sys.argv else "1"
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, _BLAS)

import numpy as np  # noqa: E402

from depsi.conventions import wrap_phase  # noqa: E402
from depsi.kernels.periodogram import periodogram  # noqa: E402

WAVELENGTH = 0.0555
M2PH = -4 * np.pi / WAVELENGTH


def arcs(K, T, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 5, T))
    t -= t[0]
    h2ph = rng.normal(0, 1.5e-4, (K, T))
    height, velocity = rng.uniform(-40, 40, K), rng.uniform(-0.04, 0.04, K)
    model = M2PH * (velocity[:, None] * t + h2ph * height[:, None])
    return wrap_phase(model + rng.normal(0, 0.5, (K, T))), h2ph, t


def best_of(func, repeat):
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        func()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def compare(label, phase, h2ph, t, repeat, **kwargs):
    K = phase.shape[0]
    times = {}
    for fused in (False, True):
        periodogram(phase[:50], h2ph if h2ph.ndim == 1 else h2ph[:50], t,
                    wavelength=WAVELENGTH, fused=fused, **kwargs)  # compiled, warm
        times[fused] = best_of(lambda f=fused: periodogram(phase, h2ph, t, wavelength=WAVELENGTH,
                                                           fused=f, **kwargs), repeat)
    (ref_wall, ref_cpu), (wall, cpu) = times[False], times[True]
    print(f"{label:<34} reference {K / ref_wall:9,.0f} arcs/s ({ref_wall:6.2f} s wall, "
          f"{ref_cpu:6.2f} s CPU)   fused {K / wall:9,.0f} arcs/s ({wall:6.2f} s wall, "
          f"{cpu:6.2f} s CPU)   ratio {ref_wall / wall:4.2f}x wall, {ref_cpu / cpu:4.2f}x CPU")


#: The fused kernel's stages timed by ``--stages``: its module's functions that the calls go
#: through (the grid stage's GEMM is its total less the phasors and the moduli).
STAGES = {"_grid_phasors": "height phasors", "_grid_best": "moduli and argmax",
          "_mirrored_coarse": "grid stage", "_items": "refinement and results"}


def stages(phase, h2ph, t, repeat):
    """Thread CPU per arc (us) of each stage of the fused kernel, and of the whole call."""
    from depsi.kernels import periodogram_numba as kernel

    K = phase.shape[0]
    spent: dict[str, float] = {}

    def timed(name, function):
        def run(*args):
            start = time.thread_time()
            try:
                return function(*args)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - start
        return run

    saved = {name: getattr(kernel, name) for name in STAGES}
    best: dict[str, float] = {}
    try:
        for name, function in saved.items():
            setattr(kernel, name, timed(name, function))
        periodogram(phase[:50], h2ph[:50], t, wavelength=WAVELENGTH, fused=True)  # compiled
        for _ in range(repeat):
            spent.clear()
            start = time.thread_time()
            periodogram(phase, h2ph, t, wavelength=WAVELENGTH, fused=True)
            spent["total"] = time.thread_time() - start
            for name, seconds in spent.items():
                best[name] = min(best.get(name, np.inf), seconds / K * 1e6)
    finally:
        for name, function in saved.items():
            setattr(kernel, name, function)
    gemm = best["_mirrored_coarse"] - best["_grid_phasors"] - best["_grid_best"]
    other = best["total"] - best["_mirrored_coarse"] - best["_items"]
    print(f"per-item h2ph, thread CPU an arc: {STAGES['_grid_phasors']} "
          f"{best['_grid_phasors']:.2f} us, GEMM {gemm:.2f}, {STAGES['_grid_best']} "
          f"{best['_grid_best']:.2f}, {STAGES['_items']} {best['_items']:.2f}, the rest "
          f"{other:.2f}; total {best['total']:.2f} us")


FIRST_CALL = textwrap.dedent("""
    import time
    start = time.perf_counter()
    import numpy as np
    from depsi.kernels.periodogram import periodogram
    imported = time.perf_counter()
    t = np.linspace(0, 3, 20)
    h2ph = 3e-4 * np.sin(7.0 * np.arange(20))[None].repeat(3, 0)
    periodogram(np.zeros((3, 20)), h2ph, t, wavelength=0.0555, fused=True)
    print(f"{imported - start:.2f} {time.perf_counter() - imported:.2f}")
""")


def first_call_costs():
    """(import s, first call s) with an empty cache, then with the cache it filled."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        runs = [subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, check=True,
                               capture_output=True, text=True).stdout.split()
                for _ in range(2)]
    return [tuple(float(v) for v in run) for run in runs]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blas-threads", default=_BLAS)
    parser.add_argument("--no-compile", action="store_true",
                        help="skip timing the first call in fresh processes")
    parser.add_argument("--stages", action="store_true",
                        help="time the fused kernel's stages instead of comparing kernels")
    args = parser.parse_args()
    print(f"periodogram, fused / reference: {args.items:,} arcs x {args.epochs} epochs, "
          f"BLAS threads {args.blas_threads}, load average {os.getloadavg()[0]:.2f}")
    phase, h2ph, t = arcs(args.items, args.epochs)
    if args.stages:
        stages(phase, h2ph, t, args.repeat)
        return
    compare("per-item h2ph", phase, h2ph, t, args.repeat)
    compare("shared h2ph", phase, h2ph[0], t, args.repeat)
    seasonal = {"seasonal": (np.sin(2 * np.pi * t), (-0.01, 0.01), 0.004)}
    compare("per-item h2ph + seasonal term", phase, h2ph, t, args.repeat,
            extra_regressors=seasonal)
    if not args.no_compile:
        (imp0, cold), (imp1, warm) = first_call_costs()
        print(f"first call in a new process: {cold:.1f} s compiling (empty cache), {warm:.1f} s "
              f"from the cache; import {imp0:.1f} / {imp1:.1f} s")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
