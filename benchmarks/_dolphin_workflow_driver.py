"""Driver of dolphin 0.42.9's whole displacement workflow on the real ``psps_houston_crop`` stack
for ``_dolphin_workflow.py``; runs in dolphin's own venv only (with real GDAL bindings).

1. Builds a pseudo-SLC stack from the crop's 92 single-reference interferograms and 93
   amplitudes: ``p_t = amp_t * exp(i phi_t)`` with ``phi_t = angle(s_t conj(s_ref))``, that is
   the file's phase for ``t_ref.int`` and minus it for ``ref_t.int`` (``phi_ref = 0``), written
   as one single-band complex64 GeoTIFF a date (``YYYYMMDD.slc.tif``) with a fake geotransform
   (100 m pixels, EPSG:32615; the crop has no georeferencing).
2. Runs ``dolphin.workflows.displacement.run`` with dolphin's defaults (sequential EMI phase
   linking, ministacks of 15, nearest-3 interferogram network, snaphu, L1 inversion, velocity)
   except the wavelength (outputs in metres), two threads and two parallel jobs.
3. Writes an ``.npz`` with the velocity, the (average) temporal coherence, the reference point,
   the displacement time series and the timings (see ``main``).

dolphin's sign and units (``dolphin/timeseries.py``, ``_convert_and_reference`` and
``invert_unw_network``: ``constant = -1 * (wavelength / (4 * np.pi))``): its interferograms are
``ref * conj(sec)``, and displacement is minus their phase times ``wavelength / (4 pi)``, in
metres, positive towards the satellite; ``create_velocity`` fits it against time in days and
multiplies by 365.25: velocity in m/yr, positive towards the satellite.

Set ``PJRT_NPROC`` (more XLA threads than cores) before starting: jaxlib's default pool of one
thread a core deadlocks on 2 cores (see ``_dolphin_driver.py``).

Usage: ``dolphin-venv/bin/python _dolphin_workflow_driver.py CROP_DIR WORK_DIR OUT.npz``.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger("dolphin_workflow_driver")

WAVELENGTH_M = 0.05546576
PIXEL_M = 100.0
FAKE_EPSG = 32615
THREADS = 2


def crop_shape(crop: Path) -> tuple[int, int]:
    """The square shape of the crop's rasters, from the size of its float32 amplitude files."""
    size = next((crop / "amplitude").glob("*.amp")).stat().st_size // 4
    side = int(round(size ** 0.5))
    if side * side != size:
        raise ValueError(f"{crop}: amplitude files of {size} pixels are not square")
    return side, side


def pseudo_slcs(crop: Path) -> tuple[list[str], np.ndarray]:
    """The crop's dates (``YYYYMMDD``, sorted) and its pseudo-SLC stack ``(time, rows, cols)``."""
    shape = crop_shape(crop)
    dates = sorted(p.stem for p in (crop / "amplitude").glob("*.amp"))
    pairs = {tuple(p.stem.split("_")): p for p in (crop / "igrams").glob("*.int")}
    common = set.intersection(*(set(pair) for pair in pairs))
    if len(common) != 1 or len(pairs) != len(dates) - 1:
        raise ValueError(f"expected single-reference interferograms, found {len(pairs)}")
    reference = common.pop()
    phase: dict[str, np.ndarray] = {reference: np.zeros(shape)}
    for (first, second), path in pairs.items():
        # A_B holds s_A conj(s_B); phi_t = angle(s_t conj(s_ref)).
        ifg = np.fromfile(path, dtype="<c8").reshape(shape)
        if second == reference:
            phase[first] = np.angle(ifg)
        else:
            phase[second] = -np.angle(ifg)
    if sorted(phase) != dates:
        raise ValueError("the interferograms' dates do not match the amplitudes'")
    stack = np.empty((len(dates), *shape), np.complex64)
    for k, date in enumerate(dates):
        amp = np.fromfile(crop / "amplitude" / f"{date}.amp", dtype="<f4").reshape(shape)
        stack[k] = amp * np.exp(1j * phase[date])
    return dates, stack


def write_slcs(dates: list[str], stack: np.ndarray, folder: Path) -> list[Path]:
    """One single-band complex64 GeoTIFF a date, with a fake 100 m UTM geotransform."""
    from osgeo import gdal, osr

    folder.mkdir(parents=True, exist_ok=True)
    srs = osr.SpatialReference()
    srs.ImportFromEPSG(FAKE_EPSG)
    paths = []
    for date, slc in zip(dates, stack, strict=True):
        path = folder / f"{date}.slc.tif"
        ds = gdal.GetDriverByName("GTiff").Create(str(path), slc.shape[1], slc.shape[0], 1,
                                                  gdal.GDT_CFloat32)
        ds.SetGeoTransform((500_000.0, PIXEL_M, 0.0, 3_300_000.0, 0.0, -PIXEL_M))
        ds.SetProjection(srs.ExportToWkt())
        ds.GetRasterBand(1).WriteArray(slc)
        ds = None
        paths.append(path)
    return paths


def read_raster(path: Path) -> np.ndarray:
    """A single-band raster as float64, its nodata as NaN."""
    from osgeo import gdal

    ds = gdal.Open(str(path))  # keep the dataset alive while its band is used
    band = ds.GetRasterBand(1)
    arr = band.ReadAsArray().astype(np.float64)
    nodata = band.GetNoDataValue()
    ds = None
    if nodata is not None and not np.isnan(nodata):
        arr[arr == nodata] = np.nan
    return arr


def peak_rss_gb() -> float:
    """Peak resident set of this process or any of its finished children, in GB (kB / 1e6)."""
    kb = max(resource.getrusage(who).ru_maxrss
             for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return kb / 1e6


def collect(dolphin_dir: Path) -> dict[str, np.ndarray]:
    """dolphin's products in its work directory ``dolphin_dir`` as arrays (see ``main``).

    dolphin's rasters use 0 as nodata (the unprocessed half-window border, masked pixels): those
    read as NaN, except at the reference point, where velocity and displacement are 0 by
    construction (dolphin subtracts the reference pixel's value).
    """
    ts_dir, ifg_dir = dolphin_dir / "timeseries", dolphin_dir / "interferograms"
    row, col = (int(v) for v in (ts_dir / "reference_point.txt").read_text().split(","))
    ts_paths = sorted(ts_dir.glob("[0-9]*_[0-9]*.tif"))
    pairs = [p.stem.split("_") for p in ts_paths]
    velocity = read_raster(ts_dir / "velocity.tif")
    displacement = np.stack([read_raster(p) for p in ts_paths])
    velocity[row, col], displacement[:, row, col] = 0.0, 0.0
    # One map a ministack, then their average (``temporal_coherence_average_*``).
    ministacks = sorted(set(ifg_dir.glob("temporal_coherence_*.tif"))
                        - set(ifg_dir.glob("temporal_coherence_average_*.tif")))
    average = next(ifg_dir.glob("temporal_coherence_average_*.tif"), None)
    temporal_coherence = np.stack([read_raster(p) for p in ministacks])
    return {
        "velocity": velocity,
        "temporal_coherence": read_raster(average) if average is not None
        else temporal_coherence[-1],
        "temporal_coherence_ministacks": temporal_coherence,
        "reference_point": np.array([row, col]),
        "displacement": displacement,
        "displacement_dates": np.array([second for _, second in pairs]),
        "displacement_reference_date": np.array(pairs[0][0]),
        "units": np.array("velocity m/yr, displacement m; positive towards the satellite"),
    }


def main(crop_dir: str, work_dir: str, out_path: str, options: str = "") -> None:
    """Build the pseudo-SLCs, run dolphin's displacement workflow and write ``out_path``.

    The ``.npz`` holds ``velocity`` (m/yr, positive towards the satellite), ``temporal_coherence``
    (dolphin's average over its ministacks), ``temporal_coherence_ministacks`` (one map a
    ministack), ``reference_point`` (row, col), ``displacement`` (time, rows, cols; m, positive
    towards the satellite, relative to ``displacement_reference_date``) with
    ``displacement_dates``, ``dates`` (the SLC dates), ``wall_s`` (the workflow alone),
    ``peak_rss_gb``, ``slc_write_s``, ``dolphin_version`` and ``units``. ``options``: JSON of
    further ``DisplacementWorkflow`` sections, e.g. ``{"ps_options":
    {"amp_dispersion_threshold": 0}}`` (no PS: on this multilooked stack dolphin's amplitude
    dispersion passes 97 % of the pixels, which then keep their raw phase and a temporal
    coherence of 1) or ``{"phase_linking": {"half_window": {"y": 2, "x": 2}}}``.
    """
    from importlib.metadata import version

    from dolphin.workflows import displacement
    from dolphin.workflows.config import DisplacementWorkflow

    crop, work = Path(crop_dir), Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    dates, stack = pseudo_slcs(crop)
    slc_paths = write_slcs(dates, stack, work / "slcs")
    slc_write_s = time.perf_counter() - start
    logger.info("wrote %d pseudo-SLCs in %.1f s", len(slc_paths), slc_write_s)

    cfg = DisplacementWorkflow(
        cslc_file_list=slc_paths,
        work_directory=work / "dolphin",
        log_file=work / "dolphin.log",
        input_options={"wavelength": WAVELENGTH_M, "cslc_date_fmt": "%Y%m%d"},
        worker_settings={"threads_per_worker": THREADS},
        unwrap_options={"n_parallel_jobs": THREADS},
        timeseries_options={"num_parallel_blocks": THREADS},
        **(json.loads(options) if options else {}),
    )
    cfg.to_yaml(work / "dolphin_config.yaml")
    start = time.perf_counter()
    displacement.run(cfg)
    wall_s = time.perf_counter() - start
    logger.info("dolphin's displacement workflow took %.1f s", wall_s)

    results = collect(work / "dolphin")
    np.savez(out_path, **results, dates=np.array(dates), wall_s=wall_s, slc_write_s=slc_write_s,
             peak_rss_gb=peak_rss_gb(), dolphin_version=version("dolphin"))
    logger.info("wrote %s", out_path)


if __name__ == "__main__":
    # dolphin logs through its own handlers; this driver's lines go to stderr beside them.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    main(*sys.argv[1:5])
