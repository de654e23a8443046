"""The ``depsi demo``: simulate a small stack, run the PS chain, write products and pictures.

Everything the demo writes goes to one folder: the SLC stack (with its truth), the PS
candidates and the result STM as Zarr, the results as CSV, and PNG plots that compare the
estimates with the simulator's truth.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import numpy as np
import xarray as xr

logger = logging.getLogger(__name__)

#: Amplitude-dispersion threshold of the demo's PS selection.
DEMO_NAD_THRESHOLD = 0.25


def _truth_at(truth: xr.Dataset, result: xr.Dataset, name: str) -> np.ndarray:
    az = result["azimuth"].values
    rg = result["range"].values
    return truth[name].values[az, rg]


def reference_area_mask(result: xr.Dataset) -> np.ndarray:
    """Boolean per result point: the chain's reference area (the reference point alone when
    the result has no ``in_reference_area``)."""
    if "in_reference_area" in result:
        return np.asarray(result["in_reference_area"].values, dtype=bool)
    return result["point_index"].values == result.attrs["reference"]


def relative_truth(truth: xr.Dataset, result: xr.Dataset, name: str) -> np.ndarray:
    """The truth of ``name`` at the result's points, minus its mean over the reference area:
    the datum of the chain's estimates."""
    true = _truth_at(truth, result, name)
    area = reference_area_mask(result)
    return true - true[area].mean(axis=0)


def compare_with_truth(result: xr.Dataset, truth: xr.Dataset) -> dict:
    """RMSE of velocity (m/yr) and height error (m) against the truth, on the chain's datum.

    The chain estimates everything relative to the mean over its reference area
    (``in_reference_area``), so the truth is taken relative to that mean too.
    """
    figures: dict[str, float] = {"n_points": int(result.sizes["space"])}
    for name in ("velocity", "height_error"):
        error = result[name].values - relative_truth(truth, result, name)
        figures[f"{name}_rmse"] = float(np.sqrt(np.nanmean(error**2)))
    ps = truth["ps_mask"].values
    found = ps[result["azimuth"].values, result["range"].values]
    figures["fraction_of_true_ps_found"] = float(found.sum() / max(int(ps.sum()), 1))
    return figures


def _outline_reference_area(ax, x: np.ndarray, y: np.ndarray) -> None:
    """A dashed outline (convex hull) around the reference-area points."""
    from scipy.spatial import ConvexHull, QhullError

    try:
        hull = ConvexHull(np.column_stack([x, y]))
    except (QhullError, ValueError):  # fewer than three points, or all on a line
        return
    ring = np.append(hull.vertices, hull.vertices[0])
    ax.plot(x[ring], y[ring], "k--", lw=1, label="reference area")


# plot helpers shared with the exports (and the tutorials import them from here)
from depsi.io.export import COLOUR_PERCENTILE, lon_lat_axes, one_to_one, robust_limit  # noqa: E402,F401


def _aligned_truth(truth: xr.Dataset, result: xr.Dataset) -> np.ndarray:
    """True displacement (m) at the result's points, on the estimates' datum: relative to the
    reference area, and zero at the epoch where the estimates are zero."""
    true = relative_truth(truth, result, "displacement")
    estimated = result["displacement"].values
    zero = int(np.nanargmin(np.nanmean(np.abs(estimated), axis=0)))
    return true - true[:, zero:zero + 1]


def _std(result: xr.Dataset, name: str, scale: float) -> np.ndarray | None:
    """``name``'s standard deviation in the plot's unit, or None where the result has none."""
    std = f"{name}_std"
    return scale * result[std].values if std in result.variables else None


def plot_results(result: xr.Dataset, truth: xr.Dataset, path: Path) -> Path:
    """Velocity maps (estimated and true), estimated vs true velocity and height with 1:1
    lines and error bars, temporal coherence, and displacement series with their error bars
    beside the truth, as one PNG.

    Line of sight: positive towards the satellite (docs/concepts.md); maps on lon/lat axes
    with equal ground scale; symmetric colour limits at the 98th percentile of |velocity|.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    from depsi.io.cf import LOS_SIGN_CONVENTION

    ref = int(np.flatnonzero(result["point_index"].values == result.attrs["reference"])[0])
    lon, lat = result["lon"].values, result["lat"].values
    true_v = 1e3 * relative_truth(truth, result, "velocity")
    v_mm = 1e3 * result["velocity"].values
    limit = robust_limit(v_mm, true_v)
    area = reference_area_mask(result)

    fig, axes = plt.subplots(2, 3, figsize=(17, 10.5))
    for ax, values, title in ((axes[0, 0], v_mm, "estimated LOS velocity"),
                              (axes[0, 1], true_v, "true LOS velocity")):
        sc = ax.scatter(lon, lat, c=values, s=6, cmap="RdBu", vmin=-limit, vmax=limit)
        _outline_reference_area(ax, lon[area], lat[area])
        ax.plot(lon[ref], lat[ref], "k*", ms=14, label="reference point")
        ax.set_title(title)
        lon_lat_axes(ax, lat)
        ax.legend(loc="lower right", fontsize=8)
        bar = fig.colorbar(sc, ax=ax, extend="both", shrink=0.85)
        bar.set_label("LOS velocity (mm/yr), + towards satellite")
    one_to_one(axes[0, 2], true_v, v_mm, "mm/yr", "velocity", std=_std(result, "velocity", 1e3))

    one_to_one(axes[1, 0], relative_truth(truth, result, "height_error"),
               result["height_error"].values, "m", "height error",
               std=_std(result, "height_error", 1.0))

    coherence = result["temporal_coherence"].values
    low = float(np.nanpercentile(coherence, 100 - COLOUR_PERCENTILE)) if np.isfinite(
        coherence).any() else 0.0
    sc = axes[1, 1].scatter(lon, lat, c=coherence, s=6, cmap="viridis",
                            vmin=min(low, 0.99), vmax=1)
    axes[1, 1].set_title("temporal coherence")
    lon_lat_axes(axes[1, 1], lat)
    fig.colorbar(sc, ax=axes[1, 1], shrink=0.85).set_label("temporal coherence (-)")

    ax = axes[1, 2]
    times = result["time"].values
    true_d = 1e3 * _aligned_truth(truth, result)
    order = np.argsort(v_mm)
    for k, index in enumerate((order[0], order[len(order) // 2], order[-1])):
        colour = f"C{k}"
        label = f"point {int(result['point_index'].values[index])}"
        series = 1e3 * result["displacement"].values[index]
        std = _std(result, "displacement", 1e3)
        if std is None:
            ax.plot(times, series, ".", color=colour, label=f"{label} estimated")
        else:
            ax.errorbar(times, series, yerr=std[index], fmt=".", color=colour, elinewidth=0.6,
                        capsize=0, label=f"{label} estimated +-1 sigma")
        ax.plot(times, true_d[index], "-", color=colour, lw=1.2, label=f"{label} true")
    ax.set(title="LOS displacement\nestimated (dots, +-1 sigma) and true (lines)",
           ylabel="LOS displacement (mm), + towards satellite")
    ax.axhline(0, color="0.6", lw=0.5)
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"depsi demo: {result.sizes['space']} points, {result.sizes['time']} epochs. "
                 f"Sign convention: {LOS_SIGN_CONVENTION}.", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _reference_point(result: xr.Dataset) -> tuple[int, int, int]:
    """(point_index, azimuth, range) of ``attrs['reference']``, the chain's reference point."""
    ref = int(result.attrs["reference"])
    where = int(np.flatnonzero(result["point_index"].values == ref)[0])
    return ref, int(result["azimuth"].values[where]), int(result["range"].values[where])


def _progress_bar():
    """Dask's progress bar on a terminal or in a notebook (steps over 2 s); else nothing."""
    import contextlib
    import sys

    from depsi.io.prefetch import bars_wanted

    if not bars_wanted(True):
        return contextlib.nullcontext()
    from dask.diagnostics import ProgressBar

    return ProgressBar(minimum=2.0, out=sys.stderr)


def run_demo(out: Path, *, shape=(300, 300), n_epochs: int = 60, seed: int = 0,
             overwrite: bool = True) -> Path:
    """Simulate a stack, write it as a DORIS-5 stack folder, read it back, select PS, run the
    chain, write Zarr, CSV and plots to ``out``.

    Returns the output folder. The log says what was done, how long each step took, and how
    the estimates compare with the simulator's truth.
    """
    from depsi import run_ps_chain
    from depsi.io import open_stm, save_stm
    from depsi.io.cf import LOS_SIGN_CONVENTION
    from depsi.io.doris import from_doris_stack
    from depsi.io.export import to_csv
    from depsi.pipeline.workspace import heartbeat
    from depsi.processing.selection import ps_selection
    from depsi.simulate import accuracy, write_stack

    out = Path(out)
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"demo output folder {str(out)!r} exists")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    timings = {}

    start = time.perf_counter()
    # written as a DORIS-5 stack folder and read back by its reader, as a user's stack is:
    # the points are geocoded from the .res orbits
    written = write_stack(out / "stack", format="doris", shape=tuple(shape),
                          n_epochs=n_epochs, seed=seed, ps_fraction=0.03)
    stack_path = written["path"]
    stack = from_doris_stack(stack_path)
    truth = written["truth"].compute()
    timings["simulate"] = time.perf_counter() - start
    logger.info("simulated %s stack with %d epochs, written as a DORIS-5 stack folder in %s",
                shape, n_epochs, stack_path)

    start = time.perf_counter()
    ps = ps_selection(stack, method="nad", threshold=DEMO_NAD_THRESHOLD)
    ps_path = save_stm(ps, out / "ps.zarr")
    timings["selection"] = time.perf_counter() - start
    ps = open_stm(ps_path)
    logger.info("selected %d PS candidates (NAD <= %.2f)", ps.sizes["space"],
                DEMO_NAD_THRESHOLD)

    start = time.perf_counter()
    logger.info("running the PS chain on %d candidates x %d epochs (network, arcs, "
                "integration, atmosphere, densification)", ps.sizes["space"], ps.sizes["time"])
    with _progress_bar(), heartbeat("chain"):
        result = run_ps_chain(ps)
        result_path = save_stm(result, out / "stm.zarr")
    timings["chain"] = time.perf_counter() - start
    logger.info("reference point: point_index %d (azimuth %d, range %d), attrs['reference']; "
                "%d points in the reference area", *_reference_point(result),
                int(reference_area_mask(result).sum()))
    logger.info("sign convention: %s", LOS_SIGN_CONVENTION)

    figures = compare_with_truth(result, truth)
    to_csv(result, out / "points.csv")
    plot_results(result, truth, out / "velocity.png")
    logger.info("result: %d points; velocity RMSE %.2f mm/yr, height-error RMSE %.2f m "
                "against the truth; %.0f %% of the true PS found",
                figures["n_points"], 1e3 * figures["velocity_rmse"],
                figures["height_error_rmse"], 100 * figures["fraction_of_true_ps_found"])
    floors = accuracy(result, ps, truth)
    logger.info("against what physics allows on the %d true PS with coherence >= 0.8 (median "
                "datum): velocity %.2f mm/yr (floors: noise %.2f, no atmosphere correction "
                "%.2f), height error %.2f m (floors %.2f / %.2f)", floors["n_compared"],
                1e3 * floors["velocity_rmse"], 1e3 * floors["velocity_noise_floor"],
                1e3 * floors["velocity_nocorr_floor"], floors["height_rmse"],
                floors["height_noise_floor"], floors["height_nocorr_floor"])
    logger.info("time per step: %s", ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    logger.info("products: %s, %s, %s, %s, %s", stack_path, ps_path, result_path,
                out / "points.csv", out / "velocity.png")
    return out
