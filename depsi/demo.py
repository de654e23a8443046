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
    figures = {"n_points": int(result.sizes["space"])}
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


def plot_results(result: xr.Dataset, truth: xr.Dataset, path: Path) -> Path:
    """Velocity map (estimated and true), height errors and a few time series, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = int(np.flatnonzero(result["point_index"].values == result.attrs["reference"])[0])
    az, rg = result["azimuth"].values, result["range"].values
    true_v = relative_truth(truth, result, "velocity")
    v_mm = 1e3 * result["velocity"].values
    limit = np.nanpercentile(np.abs(1e3 * true_v), 99)

    area = reference_area_mask(result)
    fig, axes = plt.subplots(2, 2, figsize=(12, 10))
    for ax, values, title in ((axes[0, 0], v_mm, "estimated velocity (mm/yr)"),
                              (axes[0, 1], 1e3 * true_v, "true velocity (mm/yr)")):
        sc = ax.scatter(rg, az, c=values, s=4, cmap="RdBu", vmin=-limit, vmax=limit)
        _outline_reference_area(ax, rg[area], az[area])
        ax.plot(rg[ref], az[ref], "k*", ms=14, label="reference")
        ax.set(title=title, xlabel="range (pixels)", ylabel="azimuth (pixels)")
        ax.invert_yaxis()
        ax.legend(loc="lower right")
        fig.colorbar(sc, ax=ax)
    true_h = relative_truth(truth, result, "height_error")
    axes[1, 0].plot(true_h, result["height_error"].values, ".", ms=2)
    axes[1, 0].set(title="height error: estimated vs true (m)", xlabel="true (m)",
                   ylabel="estimated (m)")
    times = result["time"].values
    order = np.argsort(v_mm)
    for index in (order[0], order[len(order) // 2], order[-1]):
        axes[1, 1].plot(times, 1e3 * result["displacement"].values[index], ".-",
                        label=f"point {int(result['point_index'].values[index])}")
    axes[1, 1].set(title="displacement time series (mm)", ylabel="mm")
    axes[1, 1].legend()
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_demo(out: Path, *, shape=(300, 300), n_epochs: int = 60, seed: int = 0,
             overwrite: bool = True) -> Path:
    """Simulate a stack, select PS, run the chain, write Zarr, CSV and plots to ``out``.

    Returns the output folder. The log says what was done, how long each step took, and how
    the estimates compare with the simulator's truth.
    """
    from depsi.io import open_stm, save_stm
    from depsi.io.export import to_csv
    from depsi.processing.chain import run_ps_chain
    from depsi.processing.selection import ps_selection
    from depsi.simulate import write_stack_zarr

    out = Path(out)
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"demo output folder {str(out)!r} exists")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    timings = {}

    start = time.perf_counter()
    stack_path = write_stack_zarr(out / "stack.zarr", shape=tuple(shape), n_epochs=n_epochs,
                                  seed=seed, ps_fraction=0.03, progress=False)
    stack = xr.open_zarr(stack_path, consolidated=None)
    truth = xr.open_zarr(stack_path, group="truth", consolidated=None).compute()
    timings["simulate"] = time.perf_counter() - start
    logger.info("simulated %s stack with %d epochs in %s", shape, n_epochs, stack_path)

    start = time.perf_counter()
    ps = ps_selection(stack, method="nad", threshold=DEMO_NAD_THRESHOLD)
    ps_path = save_stm(ps, out / "ps.zarr")
    timings["selection"] = time.perf_counter() - start
    ps = open_stm(ps_path)
    logger.info("selected %d PS candidates (NAD <= %.2f)", ps.sizes["space"],
                DEMO_NAD_THRESHOLD)

    start = time.perf_counter()
    result = run_ps_chain(ps)
    result_path = save_stm(result, out / "stm.zarr")
    timings["chain"] = time.perf_counter() - start

    figures = compare_with_truth(result, truth)
    to_csv(result, out / "points.csv")
    plot_results(result, truth, out / "velocity.png")
    logger.info("result: %d points; velocity RMSE %.2f mm/yr, height-error RMSE %.2f m "
                "against the truth; %.0f %% of the true PS found",
                figures["n_points"], 1e3 * figures["velocity_rmse"],
                figures["height_error_rmse"], 100 * figures["fraction_of_true_ps_found"])
    logger.info("time per step: %s", ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    logger.info("products: %s, %s, %s, %s, %s", stack_path, ps_path, result_path,
                out / "points.csv", out / "velocity.png")
    return out
