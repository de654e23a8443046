"""Benchmark: every kernel of :mod:`depsi.kernels` on NumPy and on CuPy for the same batch, with
the largest difference between the two results (part of ``scripts/gpu-check.sh``).

For each case the same host inputs are timed three ways: NumPy (best of ``--repeat``, BLAS at
``--blas-threads``, one thread by default as the chain's chunks run), CuPy on inputs already on
the device (one warm-up for kernel compilation and the memory pool, then best of ``--repeat``,
synchronised), and CuPy with the transfers (host in, host out). Per output array: the largest
absolute difference where both are finite, that over the largest CPU magnitude, and the count of
elements whose finiteness differs; integer outputs (flags, ambiguities, components) give the
fraction of elements that differ. Where CuPy or a GPU does not work the CuPy columns are ``null``
and the reason is printed and stored.

Run: ``python benchmarks/bench_gpu_kernels.py [--scale 1.0] [--repeat 3] [--json PATH]``
(``--scale 0.02`` is the dry run's size; ``--no-gpu`` times NumPy alone). Not part of the test
suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

# BLAS threads are fixed before NumPy loads BLAS (see bench_kernels.py).
_BLAS = sys.argv[sys.argv.index("--blas-threads") + 1] if "--blas-threads" in sys.argv else "1"
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, _BLAS)

import numpy as np  # noqa: E402

from depsi.conventions import wrap_phase  # noqa: E402
from depsi.kernels.backend import get_namespace, to_host  # noqa: E402
from depsi.kernels.design_matrices import design_matrix  # noqa: E402
from depsi.kernels.lstsq import lstsq_batched, solve_normal_equations  # noqa: E402
from depsi.kernels.network_inversion import connected_components, invert_network  # noqa: E402
from depsi.kernels.periodogram import ensemble_coherence, periodogram  # noqa: E402
from depsi.kernels.phase_linking import link_phases, sample_coherence  # noqa: E402
from depsi.kernels.statistics import phase_of, statistics_block  # noqa: E402

WAVELENGTH = 0.0555
M2PH = -4 * np.pi / WAVELENGTH
GRID = dict(wavelength=WAVELENGTH, height_step=100 / 49, velocity_step=0.1 / 49)


def _n(base: int, scale: float) -> int:
    return max(int(base * scale), 16)


def _epochs(rng, T):
    t = np.sort(rng.uniform(0, 5, T))
    return t - t[0]


def _arcs(rng, K, T, shared):
    t = _epochs(rng, T)
    h2ph = rng.normal(0, 1.5e-4, (K, T)).astype(np.float32)
    height, velocity = rng.uniform(-40, 40, K), rng.uniform(-0.04, 0.04, K)
    phase = wrap_phase(M2PH * (velocity[:, None] * t + h2ph * height[:, None])
                       + rng.normal(0, 0.5, (K, T))).astype(np.float32)
    return {"phase": phase, "h2ph": h2ph[0] if shared else h2ph}, {"time_years": t}


def _network(rng, K, T, nan_fraction):
    pairs = np.array([(a, b) for a in range(T) for b in range(a + 1, min(a + 4, T))])
    series = np.cumsum(rng.normal(0, 1, (K, T)), axis=1)
    ifg = series[:, pairs[:, 1]] - series[:, pairs[:, 0]] + rng.normal(0, 0.1, (K, len(pairs)))
    ifg[rng.random(ifg.shape) < nan_fraction] = np.nan
    return ifg, pairs


def cases(scale: float) -> list[dict]:
    """The benchmark cases: name, items, device inputs, host keywords and the kernel call."""
    rng = np.random.default_rng(0)
    out = []

    def case(name, unit, items, device, host, call):
        out.append({"name": name, "unit": unit, "items": items, "device": device,
                    "host": host, "call": call})

    K, D, P = _n(200_000, scale), 100, 3
    A = rng.standard_normal((K, D, P)).astype(np.float32)
    y = rng.standard_normal((K, D)).astype(np.float32)
    y[rng.random((K, D)) < 0.05] = np.nan
    w = rng.uniform(0.5, 2, (K, D)).astype(np.float32)
    case("lstsq_batched, per-problem A, weights, 5% NaN, float32", "problems", K,
         {"A": A, "y": y, "weights": w}, {}, lambda a: lstsq_batched(a["A"], a["y"], a["weights"]))
    case("lstsq_batched, shared A, float64", "problems", K,
         {"A": A[0].astype(np.float64), "y": np.nan_to_num(y).astype(np.float64)}, {},
         lambda a: lstsq_batched(a["A"], a["y"]))
    del A, y, w

    K = _n(1_000_000, scale)
    M = rng.standard_normal((K, 3, 3))
    case("solve_normal_equations, 3 x 3", "systems", K,
         {"N": M @ M.transpose(0, 2, 1) + 0.1 * np.eye(3), "b": rng.standard_normal((K, 3))}, {},
         lambda a: solve_normal_equations(a["N"], a["b"]))
    del M

    K, T = _n(20_000, scale), 60
    for shared in (False, True):
        device, host = _arcs(rng, K, T, shared)
        label = "shared h2ph" if shared else "per-arc h2ph"
        case(f"periodogram, 50 x 50 grid + refinement, {label}", "arcs", K, device, host,
             lambda a: periodogram(a["phase"], a["h2ph"], a["time_years"], **GRID))
    device, host = _arcs(rng, K, T, True)
    case("periodogram, velocity only (h2ph None)", "points", K, {"phase": device["phase"]}, host,
         lambda a: periodogram(a["phase"], None, a["time_years"], wavelength=WAVELENGTH))
    case("ensemble_coherence", "items", K, {"r": device["phase"].astype(np.float64)}, {},
         lambda a: ensemble_coherence(a["r"]))

    T = 60
    for K, nan in ((_n(100_000, scale), 0.0), (_n(10_000, scale), 0.05)):
        ifg, pairs = _network(rng, K, T, nan)
        label = "all valid" if nan == 0 else "5% NaN (per-pixel)"
        case(f"invert_network, T={T}, {label}", "pixels", K, {"ifg": ifg}, {"pairs": pairs},
             lambda a: invert_network(a["ifg"], a["pairs"], T))
    case("connected_components, 5% invalid", "pixels", K, {"mask": np.isfinite(ifg)},
         {"pairs": pairs}, lambda a: connected_components(a["mask"], a["pairs"], T))

    K, T = _n(500_000, scale), 60
    slc = (rng.rayleigh(1.0, (K, T)) * np.exp(1j * rng.uniform(-np.pi, np.pi, (K, T))))
    slc = slc.astype(np.complex64)
    case("statistics_block, robust (median, MAD)", "pixels", K, {"slc": slc}, {},
         lambda a: statistics_block(a["slc"]))
    case("statistics_block, moments only", "pixels", K, {"slc": slc}, {},
         lambda a: statistics_block(a["slc"], robust=False))
    case("phase_of", "pixels", K, {"slc": slc}, {}, lambda a: phase_of(a["slc"]))
    del slc

    K, T = _n(200_000, scale), 60
    case("design_matrix, per-point h2ph, 4 terms", "points", K,
         {"h2ph": rng.normal(0, 1.5e-4, (K, T))}, {"time_years": _epochs(rng, T)},
         lambda a: design_matrix(a["time_years"], h2ph=a["h2ph"],
                                 terms=("offset", "velocity", "height_error", "seasonal")))

    # distributed scatterers: coherence matrices from looks, then phase linking
    # (new names: the cases above bind K and T late, in their lambdas)
    n_pixels, n_looks, n_epochs = _n(20_000, scale), 50, 30
    looks = (rng.standard_normal((n_pixels, n_looks, n_epochs))
             + 1j * rng.standard_normal((n_pixels, n_looks, n_epochs)))
    looks = (looks + 0.8 * looks[:, :1, :]).astype(np.complex64)
    case("sample_coherence, 50 looks, T=30", "pixels", n_pixels, {"looks": looks}, {},
         lambda a: sample_coherence(a["looks"]))
    coherence, _ = sample_coherence(looks)
    del looks
    for method in ("emi", "evd"):
        case(f"link_phases ({method}), T=30", "pixels", n_pixels, {"coherence": coherence}, {},
             lambda a, method=method: link_phases(a["coherence"], method=method))
    return out


def arrays_of(result) -> dict:
    """The output arrays of a kernel's result (a dataclass, dict, tuple or one array), by name."""
    if dataclasses.is_dataclass(result):
        items = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    elif isinstance(result, dict):
        items = dict(result)
    elif isinstance(result, tuple):
        items = {str(i): v for i, v in enumerate(result)}
    else:
        items = {"out": result}
    out = {}
    for name, value in items.items():
        if isinstance(value, dict):
            out |= {f"{name}.{k}": v for k, v in arrays_of(value).items()}
        elif hasattr(value, "shape"):
            out[name] = value
    return out


def differences(gpu: dict, cpu: dict) -> dict:
    """Per output: largest absolute difference where both are finite, relative to the largest CPU
    magnitude, finiteness mismatches; for integers and booleans the fraction differing."""
    out = {}
    for name, c in cpu.items():
        c, g = np.asarray(to_host(c)), np.asarray(to_host(gpu[name]))
        if c.shape != g.shape:
            out[name] = {"shape_cpu": list(c.shape), "shape_gpu": list(g.shape)}
        elif c.dtype.kind in "biu":
            out[name] = {"fraction_differing": float(np.mean(c != g)) if c.size else 0.0}
        else:
            both = np.isfinite(c) & np.isfinite(g)
            diff = np.abs(g[both].astype(np.float64) - c[both].astype(np.float64))
            scale = float(np.abs(c[both]).max()) if both.any() else 0.0
            largest = float(diff.max()) if diff.size else 0.0
            out[name] = {"max_abs_diff": largest,
                         "max_rel_diff": largest / scale if scale else largest,
                         "finite_mismatch": int((np.isfinite(c) != np.isfinite(g)).sum())}
    return out


def best_of(func, repeat: int, sync=None) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return min(times)


def run_case(item: dict, repeat: int, cupy) -> dict:
    def cpu_call():
        return item["call"](item["device"] | item["host"])

    cpu_s = best_of(cpu_call, repeat)
    record = {"name": item["name"], "unit": item["unit"], "items": item["items"],
              "numpy_s": cpu_s, "cupy_s": None, "cupy_with_transfers_s": None,
              "speedup": None, "differences": None}
    if cupy is None:
        return record
    sync = cupy.cuda.Device().synchronize
    on_device = {k: cupy.asarray(v) for k, v in item["device"].items()}

    def gpu_call():
        return item["call"](on_device | item["host"])

    def gpu_round_trip():
        moved = {k: cupy.asarray(v) for k, v in item["device"].items()}
        return {k: to_host(v) for k, v in arrays_of(item["call"](moved | item["host"])).items()}

    try:
        result = gpu_call()  # warm-up: kernel compilation, the memory pool
        sync()
        record["cupy_s"] = best_of(gpu_call, repeat, sync)
        record["cupy_with_transfers_s"] = best_of(gpu_round_trip, repeat, sync)
        record["speedup"] = cpu_s / record["cupy_s"]
        record["differences"] = differences(arrays_of(result), arrays_of(cpu_call()))
    except Exception as err:  # one kernel failing on the GPU must not hide the others' figures
        record["error"] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
        result = None
    on_device.clear()  # the closures hold the dict: empty it so the pool can free the blocks
    result = None
    cupy.get_default_memory_pool().free_all_blocks()
    return record


def worst(differences: dict | None) -> tuple[str, float] | None:
    """The output with the largest relative difference (or fraction differing)."""
    if not differences:
        return None
    scored = [(name, d.get("max_rel_diff", d.get("fraction_differing", float("inf"))))
              for name, d in differences.items()]
    return max(scored, key=lambda item: item[1])


def gpu_namespace(no_gpu: bool = False):
    """(cupy, reason) where CuPy runs kernels on a GPU, else (None, why not)."""
    if no_gpu:
        return None, "--no-gpu given"
    try:
        cupy = get_namespace("cupy")
    except RuntimeError as err:
        return None, str(err)
    return cupy, f"CuPy {cupy.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="problem sizes x this")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blas-threads", default="1", help="BLAS threads for NumPy")
    parser.add_argument("--no-gpu", action="store_true", help="time NumPy only")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)

    cupy, reason = gpu_namespace(args.no_gpu)
    gpu_name = None
    if cupy is not None:
        gpu_name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        gpu_name = gpu_name.decode() if isinstance(gpu_name, bytes) else str(gpu_name)
    print(f"bench_gpu_kernels: scale {args.scale}, NumPy {np.__version__}, BLAS threads "
          f"{os.environ['OPENBLAS_NUM_THREADS']}, {os.cpu_count()} CPU(s); GPU: "
          f"{gpu_name or 'none'} ({reason})")
    if cupy is None:
        print(f"bench_gpu_kernels: CuPy columns SKIPPED: {reason}")
    records = []
    for item in cases(args.scale):
        record = run_case(item, args.repeat, cupy)
        records.append(record)
        if "error" in record:
            print(f"  {record['name']:<58s} FAILED on the GPU: {record['error']}", flush=True)
            continue
        gpu = (f"cupy {record['cupy_s'] * 1e3:9.2f} ms (with transfers "
               f"{record['cupy_with_transfers_s'] * 1e3:9.2f} ms) = {record['speedup']:6.1f}x"
               if record["cupy_s"] is not None else "cupy skipped")
        name, value = worst(record["differences"]) or ("-", float("nan"))
        print(f"  {record['name']:<58s} {record['items']:>9,d} {record['unit']:<8s} numpy "
              f"{record['numpy_s'] * 1e3:9.2f} ms   {gpu}   worst {name} {value:.2e}",
              flush=True)
    summary = {"scale": args.scale, "repeat": args.repeat, "numpy": np.__version__,
               "blas_threads": os.environ["OPENBLAS_NUM_THREADS"], "cpus": os.cpu_count(),
               "gpu": gpu_name, "cupy": getattr(cupy, "__version__", None),
               "cupy_status": reason, "cases": records}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)
    return 1 if any("error" in record for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
