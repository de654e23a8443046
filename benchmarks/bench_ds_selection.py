"""``ds_selection``'s pre-screen and mini-stacks, against linking every candidate of all epochs.

Run: ``python benchmarks/bench_ds_selection.py [prescreen] [relation] [ministack] [update]``.

- ``prescreen``: ms a pixel of ``ds_selection`` with the pre-screen (``prescreen_sigmas`` 3) and
  without (None), best of two rounds each, and the DS found / false against the truth, on the
  tests' mixed scene (``tests/scenes.py::MIXED_SCENE``) and on a scene of mostly decorrelated
  background (128 x 128 pixels, one 20 x 20 DS patch, 30 epochs).
- ``relation``: the pre-screen's proxy (short-lag coherence) against the temporal coherence of
  the EMI-linked phase, on simulated pixels of exponential coherence models (the default
  ``g0`` 0.7, ``g_inf`` 0.2 and weaker ones) and on pure noise: the smallest proxy among the
  pixels accepted at temporal coherence 0.6, the noise's largest, and the bound.
- ``ministack``: peak memory (``ru_maxrss`` above the start, a fresh child process per case,
  and the peak of the allocations ``tracemalloc`` traces, NumPy's arrays among them) and
  linked-phase RMSE against the Cramér-Rao bound of ``ds_selection`` with and without
  mini-stacks (beside every compressed SLC, and beside ``max_compressed`` of them), at 30, 60,
  120 and 240 epochs.
- ``update``: what the last mini-stack of 15 epochs costs when added to a stored DS product
  (``update_ds_selection``) against selecting the whole stack again with mini-stacks: seconds
  and peak memory of that call, at 30, 60 and 120 epochs.

Nothing is asserted; figures go to docs/steps/distributed.md and docs/benchmarks.md.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from depsi.processing.scatterers import DEFAULT_MAX_COMPRESSED

NOISE_SCENE = {"shape": (128, 128), "n_epochs": 30, "seed": 7, "ps_fraction": 0.01,
               "ds_regions": 1, "ds_region_size": 20}


def _counts(ds, truth) -> tuple[int, int, int]:
    true = truth["ds_mask"].values
    found = true[ds["azimuth"].values, ds["range"].values]
    return int(true.sum()), int(found.sum()), int((~found).sum())


def prescreen() -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from depsi.processing.scatterers import DEFAULT_PRESCREEN_SIGMAS, ds_selection
    from depsi.simulate import simulate_stack
    from scenes import MIXED_SCENE, mixed_scene

    noise = simulate_stack(**NOISE_SCENE)
    scenes = {"mixed (tests/scenes.py)": mixed_scene(),
              "mostly noise": tuple(x.compute() for x in noise)}
    print(f"scene | pixels | prescreen | ms/pixel | linked of candidates | true | found | false"
          f"  (mixed scene: {MIXED_SCENE})")
    for name, (stack, truth) in scenes.items():
        pixels = stack.sizes["azimuth"] * stack.sizes["range"]
        times = {}
        for sigmas in (None, DEFAULT_PRESCREEN_SIGMAS):
            best = np.inf
            for _ in range(2):
                start = time.perf_counter()
                ds = ds_selection(stack, prescreen_sigmas=sigmas)
                best = min(best, time.perf_counter() - start)
            times[sigmas] = best
            true, found, false = _counts(ds, truth)
            print(f"{name} | {pixels} | {sigmas} | {best / pixels * 1e3:.3f} | "
                  f"{ds.attrs['n_ds_linked']} of {ds.attrs['n_ds_candidates']} | {true} | "
                  f"{found} | {false}")
        print(f"  {name}: pre-screen speed-up {times[None] / times[DEFAULT_PRESCREEN_SIGMAS]:.1f}x")


def _proxy(looks) -> np.ndarray:
    power = (np.abs(looks) ** 2).sum(axis=1)
    cross = np.abs((looks[:, :, :-1] * np.conj(looks[:, :, 1:])).sum(axis=1))
    return (cross / np.sqrt(power[:, :-1] * power[:, 1:])).mean(axis=1)


def relation(n_pixels: int = 2000) -> None:
    from depsi.kernels.backend import single_threaded_blas
    from depsi.kernels.phase_linking import (
        link_phases,
        sample_coherence,
        short_lag_noise_threshold,
        temporal_coherence,
    )
    from depsi.processing.scatterers import (
        DEFAULT_MIN_TEMPORAL_COHERENCE,
        DEFAULT_PRESCREEN_SIGMAS,
    )
    from depsi.simulate.ds import circular_gaussian_looks, exponential_coherence

    rng = np.random.default_rng(1)
    models = [(0.0, 0.0), (0.4, 0.0), (0.5, 0.0), (0.4, 0.1), (0.5, 0.1), (0.6, 0.1),
              (0.5, 0.2), (0.7, 0.2), (0.9, 0.4)]
    print("epochs | looks | g0 | g_inf | accepted | proxy median | min proxy accepted | "
          "max proxy | bound | accepted lost | noise passed")
    with single_threaded_blas():
        for n_epochs in (30, 60):
            for looks in (20, 50, 121):
                bound = float(short_lag_noise_threshold(looks, n_epochs,
                                                        DEFAULT_PRESCREEN_SIGMAS))
                for gamma0, gamma_inf in models:
                    coherence = (np.eye(n_epochs) if gamma0 == 0 else exponential_coherence(
                        np.arange(n_epochs) * 12.0, gamma0=gamma0, gamma_inf=gamma_inf))
                    phase = rng.uniform(-np.pi, np.pi, n_epochs)
                    samples = circular_gaussian_looks(coherence, phase, (n_pixels, looks), rng)
                    gamma, _ = sample_coherence(samples)
                    linked, _ = link_phases(gamma)
                    accepted = temporal_coherence(gamma, linked) >= DEFAULT_MIN_TEMPORAL_COHERENCE
                    proxy = _proxy(samples)
                    lowest = proxy[accepted].min() if accepted.any() else np.nan
                    print(f"{n_epochs} | {looks} | {gamma0} | {gamma_inf} | "
                          f"{accepted.mean():.3f} | {np.median(proxy):.3f} | {lowest:.3f} | "
                          f"{proxy.max():.3f} | {bound:.3f} | "
                          f"{int((accepted & (proxy <= bound)).sum())} | "
                          f"{(proxy > bound).mean():.4f}")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


#: The mini-stack case: one DS stack of three regions (``simulate_ds_stack``, default coherence
#: model), 9 x 9 windows, mini-stacks of 15 epochs: all epochs at once, then mini-stacks beside
#: every compressed SLC and beside the default ``max_compressed``.
MINISTACK_SHAPE, MINISTACK_WINDOW, MINISTACK = (48, 96), (9, 9), 15
MAX_COMPRESSED = DEFAULT_MAX_COMPRESSED


def _ministack_case(n_epochs: int, ministack: int | None, max_compressed: int | None) -> dict:
    """In a fresh process: ds_selection on the synchronous scheduler (one task at a time), its
    peak resident memory above what the process held with the stack loaded, and the accepted
    DS's phase RMSE against the truth and the Cramér-Rao bound at the true coherence (pixels
    whose window lies in one region)."""
    import dask

    from depsi.conventions import wrap_phase
    from depsi.kernels.phase_linking import cramer_rao_bound
    from depsi.processing.scatterers import ds_selection
    from depsi.simulate.ds import simulate_ds_stack

    stack, truth = simulate_ds_stack(shape=MINISTACK_SHAPE, n_epochs=n_epochs, seed=3)
    stack, truth = stack.compute(), truth.compute()
    small = stack.isel(azimuth=slice(0, 16), range=slice(0, 16), time=slice(0, 4))
    with dask.config.set(scheduler="synchronous"):
        ds_selection(small, window=MINISTACK_WINDOW, min_looks=10, ministack=ministack and 2,
                     max_compressed=max_compressed)
        before = _peak_mb()
        tracemalloc.start()
        start = time.perf_counter()
        ds = ds_selection(stack, window=MINISTACK_WINDOW, ministack=ministack,
                          max_compressed=max_compressed)
        seconds = time.perf_counter() - start
        traced = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    peak = _peak_mb() - before
    azimuth, range_ = ds["azimuth"].values, ds["range"].values
    region = truth["region"].values
    half = MINISTACK_WINDOW[1] // 2
    padded = np.pad(region, ((0, 0), (half, half)), mode="edge")
    pure = np.array([np.all(padded[a, r:r + 2 * half + 1] == region[a, r])
                     for a, r in zip(azimuth, range_)])
    error = wrap_phase(ds["phase"].values[pure] - truth["phase"].values[azimuth, range_][pure])
    variance = cramer_rao_bound(np.broadcast_to(truth["coherence"].values,
                                                (int(pure.sum()), n_epochs, n_epochs)),
                                ds["shp_count"].values[pure].astype(float))
    return {"epochs": n_epochs, "ministack": ministack, "max_compressed": max_compressed,
            "points": int(ds.sizes["space"]),
            "pure": int(pure.sum()), "rmse": float(np.sqrt(np.mean(error[:, 1:] ** 2))),
            "crb": float(np.sqrt(np.mean(variance[:, 1:]))), "peak_mb": peak,
            "traced_mb": traced, "seconds": seconds,
            "coherence": float(np.median(ds["linked_coherence"].values))}


def ministack(epochs=(30, 60, 120, 240)) -> None:
    from concurrent.futures import ProcessPoolExecutor

    print("epochs | ministack | max_compressed | DS | pure | RMSE (rad) | CRB (rad) | "
          "RMSE / CRB | median linked coherence | peak RSS MB above start | peak traced MB | s")
    for n_epochs in epochs:
        for size, cap in ((None, None), (MINISTACK, None), (MINISTACK, MAX_COMPRESSED)):
            if size is None and n_epochs > 120:  # 240^2 matrices for every pixel: 12 GB
                continue
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                row = pool.submit(_ministack_case, n_epochs, size, cap).result()
            print(f"{row['epochs']} | {row['ministack']} | {row['max_compressed']} | "
                  f"{row['points']} | {row['pure']} | "
                  f"{row['rmse']:.3f} | {row['crb']:.3f} | {row['rmse'] / row['crb']:.3f} | "
                  f"{row['coherence']:.3f} | {row['peak_mb']:.0f} | {row['traced_mb']:.0f} | "
                  f"{row['seconds']:.1f}",
                  flush=True)


def _update_case(n_epochs: int, mode: str) -> dict:
    """In a fresh process: the last mini-stack of ``n_epochs`` added to a stored DS product
    (``mode`` "update": update_ds_selection on the store of the first ``n_epochs - M``) or the
    whole stack selected again (``mode`` "rerun": ds_selection with mini-stacks): seconds,
    peak RSS and traced allocations of that call alone."""
    import tempfile

    import dask

    from depsi.io.store import save_stm
    from depsi.processing.scatterers import ds_selection, update_ds_selection
    from depsi.simulate.ds import simulate_ds_stack

    stack, _ = simulate_ds_stack(shape=MINISTACK_SHAPE, n_epochs=n_epochs, seed=3)
    stack = stack.compute()
    first = n_epochs - MINISTACK
    with dask.config.set(scheduler="synchronous"), tempfile.TemporaryDirectory() as folder:
        store = save_stm(ds_selection(stack.isel(time=slice(0, first)), window=MINISTACK_WINDOW,
                                      ministack=MINISTACK), f"{folder}/ds.zarr")
        before = _peak_mb()
        tracemalloc.start()
        start = time.perf_counter()
        if mode == "update":
            points = update_ds_selection(store, stack.isel(time=slice(first, n_epochs)))
        else:
            points = ds_selection(stack, window=MINISTACK_WINDOW, ministack=MINISTACK)
        seconds = time.perf_counter() - start
        traced = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        n_points = int(points.sizes["space"])
    return {"epochs": n_epochs, "mode": mode, "points": n_points, "seconds": seconds,
            "peak_mb": _peak_mb() - before, "traced_mb": traced}


def update(epochs=(30, 60, 120)) -> None:
    """What a new mini-stack of epochs costs: update_ds_selection against selecting again."""
    from concurrent.futures import ProcessPoolExecutor

    print("epochs after | how | DS | s | peak RSS MB above start | peak traced MB")
    for n_epochs in epochs:
        for mode in ("update", "rerun"):
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                row = pool.submit(_update_case, n_epochs, mode).result()
            print(f"{row['epochs']} | {row['mode']} | {row['points']} | {row['seconds']:.2f} | "
                  f"{row['peak_mb']:.0f} | {row['traced_mb']:.0f}", flush=True)


def main(argv: list[str]) -> None:
    parts = argv or ["prescreen", "relation", "ministack", "update"]
    for part in parts:
        print(f"## {part}")
        {"prescreen": prescreen, "relation": relation, "ministack": ministack,
         "update": update}[part]()


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    main(sys.argv[1:])
