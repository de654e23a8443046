"""Benchmark: the batched kernels against the loops users would otherwise write, and against the
limits of the machine, measured in the same run and printed as ratios (no asserts).

* ``lstsq_batched``: 2*10^5 problems (D=100, P=3, one design per problem) against a per-problem
  ``scipy.linalg.lstsq`` loop (timed on a subset, extrapolated) and against one plain copy of the
  inputs; with a shared design also against one BLAS call on the same data (``Y @ A``).
* ``periodogram``: 10^4 arcs, 60 epochs, a 50 x 50 (height, velocity) grid plus refinement,
  against a per-arc NumPy loop (each arc's grid vectorised, refinement by a local 3 x 3
  parabola; timed on a subset) and a per-arc, per-node Python loop (a few arcs); and against the
  complex GEMM alone (the machine limit of the coarse stage).
* ``invert_network``: 10^5 pixels, 60 epochs, small-baseline network, against a per-pixel
  ``numpy.linalg.lstsq`` loop.
* With a working GPU (CuPy), the same kernels on the GPU and the GPU/CPU ratio.

Run: ``python benchmarks/bench_kernels.py [--quick] [--blas-threads N]`` (``--quick``: 10x
smaller problems; BLAS runs one thread per caller unless ``--blas-threads`` says otherwise).
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# One BLAS thread per caller, set before NumPy loads BLAS: the configuration for Dask's threaded
# scheduler (parallel over chunks). Multithreaded OpenBLAS on tall-skinny products busy-waits
# and, on a shared machine, runs several times slower. ``--blas-threads N`` overrides.
_BLAS = sys.argv[sys.argv.index("--blas-threads") + 1] if "--blas-threads" in sys.argv else "1"
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, _BLAS)

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402

from depsi.conventions import wrap_phase  # noqa: E402
from depsi.kernels.backend import cupy_available  # noqa: E402
from depsi.kernels.lstsq import lstsq_batched  # noqa: E402
from depsi.kernels.network_inversion import invert_network  # noqa: E402
from depsi.kernels.periodogram import periodogram  # noqa: E402

QUICK = "--quick" in sys.argv
SCALE = 10 if QUICK else 1
WAVELENGTH = 0.0555
M2PH = -4 * np.pi / WAVELENGTH


CPU_TIMES: dict[float, float] = {}


def best_of(func, repeat=3):
    """Smallest wall time of ``repeat`` calls (the machine is shared: the minimum is the cost).

    The smallest CPU time of the process over the same calls is kept in ``CPU_TIMES`` under the
    wall time, for :func:`line` (on a loaded machine it is the steadier of the two).
    """
    walls, cpus = [], []
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        func()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    CPU_TIMES[min(walls)] = min(cpus)
    return min(walls)


def scaled(seconds, factor):
    """A wall time (and its CPU time) extrapolated by ``factor``."""
    CPU_TIMES[seconds * factor] = CPU_TIMES.get(seconds, seconds) * factor
    return seconds * factor


def line(label, seconds, items, unit):
    cpu = CPU_TIMES.get(seconds)
    cpu_text = f"  (CPU {cpu * 1e3:9.1f} ms)" if cpu is not None else ""
    print(f"  {label:<46s} {seconds * 1e3:10.1f} ms  {items / seconds:14,.0f} {unit}/s{cpu_text}")


def cpu_ratio(a, b):
    """Ratio of the CPU times behind two wall times measured by :func:`best_of`."""
    return CPU_TIMES.get(a, a) / CPU_TIMES.get(b, b)


def two_threads(func, *arrays):
    """``func`` on two halves of the leading axis in two threads (the way Dask runs chunks)."""
    halves = [[a[: len(a) // 2] for a in arrays], [a[len(a) // 2:] for a in arrays]]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda args: func(*args), halves))


# --------------------------------------------------------------------------------------------


def bench_lstsq():
    K, D, P = 200_000 // SCALE, 100, 3
    rng = np.random.default_rng(0)
    A = rng.standard_normal((K, D, P))
    y = np.einsum("kdp,kp->kd", A, rng.standard_normal((K, P))) + rng.normal(0, 0.1, (K, D))
    print(f"\nlstsq_batched: K={K:,} problems, D={D}, P={P}, float64")
    t_kernel = best_of(lambda: lstsq_batched(A, y))
    n_loop = 2000 // SCALE
    t_loop = scaled(best_of(lambda: [scipy.linalg.lstsq(A[k], y[k]) for k in range(n_loop)], 1),
                    K / n_loop)
    t_copy = best_of(lambda: (A.copy(), y.copy()))
    line("lstsq_batched, per-problem A", t_kernel, K, "problems")
    line("scipy.linalg.lstsq loop (extrapolated)", t_loop, K, "problems")
    line("plain copy of A and y (memory limit)", t_copy, K, "problems")
    print(f"  speed-up over the scipy loop: {t_loop / t_kernel:8.1f}x  (CPU time "
          f"{cpu_ratio(t_loop, t_kernel):.1f}x)   (goal >= 30x)")
    print(f"  time / plain copy:            {t_kernel / t_copy:8.2f}x  (CPU time "
          f"{cpu_ratio(t_kernel, t_copy):.2f}x)   (goal <= 4x)")

    w = rng.uniform(0.5, 2.0, (K, D))
    y_nan = y.copy()
    y_nan[rng.random((K, D)) < 0.05] = np.nan
    t_weighted = best_of(lambda: lstsq_batched(A, y_nan, w))
    line("lstsq_batched, weights and 5% NaN", t_weighted, K, "problems")
    t_copy_w = best_of(lambda: (A.copy(), y.copy(), w.copy()))
    print(f"  time / plain copy (+ weights): {t_weighted / t_copy_w:.2f}x  (CPU time "
          f"{cpu_ratio(t_weighted, t_copy_w):.2f}x)")

    A_shared = A[0]
    t_shared = best_of(lambda: lstsq_batched(A_shared, y))
    t_gemm = best_of(lambda: y @ A_shared)
    t_copy_y = best_of(lambda: y.copy())
    line("lstsq_batched, shared A", t_shared, K, "problems")
    line("one BLAS call Y @ A (same data)", t_gemm, K, "problems")
    line("plain copy of y", t_copy_y, K, "problems")
    print(f"  shared A: time / one GEMM {t_shared / t_gemm:.2f}x, time / copy of y "
          f"{t_shared / t_copy_y:.2f}x  (CPU time {cpu_ratio(t_shared, t_gemm):.2f}x, "
          f"{cpu_ratio(t_shared, t_copy_y):.2f}x)")
    return {"lstsq": t_kernel, "lstsq_shared": t_shared, "lstsq_loop": t_loop,
            "lstsq_copy": t_copy}


# --------------------------------------------------------------------------------------------


def _arcs(K, T, seed=1):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 5, T))
    t -= t[0]
    h2ph = rng.normal(0, 1.5e-4, (K, T))
    height, velocity = rng.uniform(-40, 40, K), rng.uniform(-0.04, 0.04, K)
    phase = wrap_phase(M2PH * (velocity[:, None] * t + h2ph * height[:, None])
                       + rng.normal(0, 0.5, (K, T)))
    return t, h2ph.astype(np.float32), phase.astype(np.float32), height, velocity


def _numpy_loop(phase, h2ph, t, heights, velocities):
    """What a user would write: per arc, the grid vectorised in NumPy, then a parabola through
    the 3 x 3 neighbourhood of the best node."""
    out = np.zeros((phase.shape[0], 2))
    ev = np.exp(-1j * M2PH * np.outer(t, velocities))  # (T, Nv)
    dh, dv = heights[1] - heights[0], velocities[1] - velocities[0]
    for k in range(phase.shape[0]):
        zh = np.exp(1j * phase[k])[None, :] * np.exp(-1j * M2PH * np.outer(heights, h2ph[k]))
        coh = np.abs(zh @ ev) / phase.shape[1]
        i, j = np.unravel_index(coh.argmax(), coh.shape)
        i, j = min(max(i, 1), len(heights) - 2), min(max(j, 1), len(velocities) - 2)
        c = coh[i - 1:i + 2, j - 1:j + 2]
        di = 0.5 * (c[0, 1] - c[2, 1]) / (c[0, 1] - 2 * c[1, 1] + c[2, 1])
        dj = 0.5 * (c[1, 0] - c[1, 2]) / (c[1, 0] - 2 * c[1, 1] + c[1, 2])
        out[k] = heights[i] + di * dh, velocities[j] + dj * dv
    return out


def _python_loop(phase, h2ph, t, heights, velocities):
    for k in range(phase.shape[0]):
        best = -1.0
        for H in heights:
            for v in velocities:
                c = abs(np.mean(np.exp(1j * (phase[k] - M2PH * (v * t + h2ph[k] * H)))))
                best = max(best, c)


def bench_periodogram():
    K, T = 10_000 // SCALE, 60
    heights, velocities = np.linspace(-50, 50, 50), np.linspace(-0.05, 0.05, 50)
    kwargs = dict(wavelength=WAVELENGTH, height_range=(-50, 50), velocity_range=(-0.05, 0.05),
                  height_step=100 / 49, velocity_step=0.1 / 49)
    t, h2ph, phase, height, velocity = _arcs(K, T)
    print(f"\nperiodogram: {K:,} arcs, T={T}, grid 50 x 50, refinement on, per-arc h2ph")
    periodogram(phase[:200], h2ph[:200], t, **kwargs)  # warm-up
    t_kernel = best_of(lambda: periodogram(phase, h2ph, t, **kwargs))
    t_coarse = best_of(lambda: periodogram(phase, h2ph, t, refine=False, **kwargs))
    t_shared = best_of(lambda: periodogram(phase, h2ph[0], t, **kwargs))
    n_loop = max(K // 50, 20)
    t_np = scaled(best_of(lambda: _numpy_loop(phase[:n_loop], h2ph[:n_loop], t, heights,
                                              velocities), 1), K / n_loop)
    n_py = 2
    t_py = scaled(best_of(lambda: _python_loop(phase[:n_py], h2ph[:n_py], t, heights,
                                               velocities), 1), K / n_py)
    zh = np.ones((K * 50, T), np.complex64)
    ev = np.ones((T, 50), np.complex64)
    t_gemm = best_of(lambda: zh @ ev)
    line("periodogram (grid + refinement)", t_kernel, K, "arcs")
    line("periodogram, coarse grid only", t_coarse, K, "arcs")
    line("periodogram, shared h2ph (one GEMM)", t_shared, K, "arcs")
    line("per-arc NumPy loop (extrapolated)", t_np, K, "arcs")
    line("per-arc, per-node Python loop (extrap.)", t_py, K, "arcs")
    line("complex64 GEMM of the coarse stage alone", t_gemm, K, "arcs")
    print(f"  arcs/s: {K / t_kernel:,.0f} (one call, one core; CPU time: "
          f"{K / CPU_TIMES[t_kernel]:,.0f} per core-second)   (goal >= 25,000 on 2 cores)")
    print(f"  speed-up over the per-arc NumPy loop: {t_np / t_kernel:.1f}x (CPU time "
          f"{cpu_ratio(t_np, t_kernel):.1f}x), over the Python loop: {t_py / t_kernel:,.0f}x; "
          f"time / GEMM alone: {t_kernel / t_gemm:.2f}x (CPU {cpu_ratio(t_kernel, t_gemm):.2f}x)")
    res = periodogram(phase, h2ph, t, **kwargs)
    print(f"  velocity RMS error {np.sqrt(np.mean((res.velocity - velocity) ** 2)) * 1e3:.3f} "
          f"mm/yr (grid step {0.1 / 49 * 1e3:.2f} mm/yr), noise 0.5 rad")
    return {"periodogram": t_kernel, "periodogram_loop": t_np}


# --------------------------------------------------------------------------------------------


def bench_network():
    K, T = 100_000 // SCALE, 60
    pairs = np.array([(a, b) for a in range(T) for b in range(a + 1, min(a + 4, T))])
    rng = np.random.default_rng(2)
    series = np.cumsum(rng.normal(0, 1, (K, T)), axis=1)
    ifg = series[:, pairs[:, 1]] - series[:, pairs[:, 0]] + rng.normal(0, 0.1, (K, len(pairs)))
    print(f"\ninvert_network: {K:,} pixels, T={T}, I={len(pairs)} small-baseline interferograms")
    t_shared = best_of(lambda: invert_network(ifg, pairs, T))
    ifg_nan = ifg[: K // 10].copy()
    ifg_nan[rng.random(ifg_nan.shape) < 0.05] = np.nan
    t_nan = scaled(best_of(lambda: invert_network(ifg_nan, pairs, T), 1), 10)
    A = np.zeros((len(pairs), T))
    A[np.arange(len(pairs)), pairs[:, 1]] = 1
    A[np.arange(len(pairs)), pairs[:, 0]] = -1
    n_loop = 500
    t_loop = scaled(best_of(lambda: [np.linalg.lstsq(A[:, 1:], ifg[k], rcond=None)
                                     for k in range(n_loop)], 1), K / n_loop)
    line("invert_network, all valid (shared matrix)", t_shared, K, "pixels")
    line("invert_network, 5% NaN (per-pixel, extrap.)", t_nan, K, "pixels")
    line("per-pixel numpy.linalg.lstsq loop (extrap.)", t_loop, K, "pixels")
    print(f"  speed-up: {t_loop / t_shared:.0f}x (all valid), {t_loop / t_nan:.1f}x (with NaN)")
    return {"network": t_shared}


# --------------------------------------------------------------------------------------------


def bench_two_threads(cpu):
    """Two halves in two threads, as Dask's threaded scheduler runs two chunks. Last in the run:
    OpenBLAS called from several threads at once stays slower for single calls afterwards."""
    print("\ntwo threads (two chunks at once, as the Dask threaded scheduler runs them)")
    K, D, P = 200_000 // SCALE, 100, 3
    rng = np.random.default_rng(0)
    A = rng.standard_normal((K, D, P))
    y = np.einsum("kdp,kp->kd", A, rng.standard_normal((K, P))) + rng.normal(0, 0.1, (K, D))
    t_lstsq = best_of(lambda: two_threads(lstsq_batched, A, y))
    line("lstsq_batched, per-problem A", t_lstsq, K, "problems")
    print(f"  speed-up over the scipy loop: {cpu['lstsq_loop'] / t_lstsq:.1f}x, time / plain "
          f"copy: {t_lstsq / cpu['lstsq_copy']:.2f}x")
    Kp, T = 10_000 // SCALE, 60
    t, h2ph, phase, _, _ = _arcs(Kp, T)
    kwargs = dict(wavelength=WAVELENGTH, height_step=100 / 49, velocity_step=0.1 / 49)
    t_pg = best_of(lambda: two_threads(lambda p, h: periodogram(p, h, t, **kwargs), phase, h2ph))
    line("periodogram (grid + refinement)", t_pg, Kp, "arcs")
    print(f"  arcs/s: {Kp / t_pg:,.0f}   (goal >= 25,000 on 2 cores); speed-up over the "
          f"per-arc NumPy loop {cpu['periodogram_loop'] / t_pg:.1f}x")


# --------------------------------------------------------------------------------------------


def bench_gpu(cpu):
    import cupy

    def timed(func):
        def run():
            func()
            cupy.cuda.Device().synchronize()
        run()  # warm-up: kernel compilation, memory pool
        return best_of(run)

    print(f"\nGPU: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    K, D, P = 200_000 // SCALE, 100, 3
    rng = np.random.default_rng(0)
    A = cupy.asarray(rng.standard_normal((K, D, P)))
    y = cupy.asarray(rng.standard_normal((K, D)))
    t = timed(lambda: lstsq_batched(A, y))
    line("lstsq_batched, per-problem A", t, K, "problems")
    print(f"  GPU/CPU speed ratio: {cpu['lstsq'] / t:.1f}x")
    t = timed(lambda: lstsq_batched(A[0], y))
    line("lstsq_batched, shared A", t, K, "problems")
    print(f"  GPU/CPU speed ratio: {cpu['lstsq_shared'] / t:.1f}x")
    Kp, T = 10_000 // SCALE, 60
    tt, h2ph, phase, _, _ = _arcs(Kp, T)
    kwargs = dict(wavelength=WAVELENGTH, height_step=100 / 49, velocity_step=0.1 / 49)
    ph, hh = cupy.asarray(phase), cupy.asarray(h2ph)
    t = timed(lambda: periodogram(ph, hh, tt, **kwargs))
    line("periodogram (grid + refinement)", t, Kp, "arcs")
    print(f"  GPU/CPU speed ratio: {cpu['periodogram'] / t:.1f}x")
    big = 50
    ph, hh = cupy.asarray(np.tile(phase, (big, 1))), cupy.asarray(np.tile(h2ph, (big, 1)))
    t = timed(lambda: periodogram(ph, hh, tt, **kwargs))
    line(f"periodogram, {Kp * big:,} arcs", t, Kp * big, "arcs")


def main():
    print(f"depsi kernel benchmark; {os.cpu_count()} CPU(s), NumPy {np.__version__}, "
          f"BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}, load average "
          f"{os.getloadavg()[0]:.1f}" + (" (quick)" if QUICK else ""))
    print("times: best of 3 wall clock (CPU time of the process in brackets); loops timed on a "
          "subset and extrapolated")
    cpu = {}
    cpu.update(bench_lstsq())
    cpu.update(bench_periodogram())
    cpu.update(bench_network())
    bench_two_threads(cpu)
    if cupy_available():
        bench_gpu(cpu)
    else:
        print("\nGPU: CuPy or a CUDA device is not available; GPU section skipped")


if __name__ == "__main__":
    main()
