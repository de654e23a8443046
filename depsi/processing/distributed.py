"""The import path of :mod:`depsi.processing.distributed_scatterers` before its rename (the module
is about distributed scatterers, not Dask's distributed): its public names, for the code and
notebooks that import them from here."""

from depsi.processing.distributed_scatterers import (
    CALIBRATION_LAG,
    CALIBRATION_QUANTILE,
    CALIBRATIONS,
    COMPRESSED_HISTORY,
    CPU_BATCH_BYTES,
    DEFAULT_MIN_LOOKS,
    DEFAULT_WINDOW,
    check_ministack,
    mean_intensity,
    n_compressed,
    phase_linking,
    resolve_max_compressed,
    select_shp,
    shp_threshold,
)

__all__ = [
    "CALIBRATIONS",
    "CALIBRATION_LAG",
    "CALIBRATION_QUANTILE",
    "COMPRESSED_HISTORY",
    "CPU_BATCH_BYTES",
    "DEFAULT_MIN_LOOKS",
    "DEFAULT_WINDOW",
    "check_ministack",
    "mean_intensity",
    "n_compressed",
    "phase_linking",
    "resolve_max_compressed",
    "select_shp",
    "shp_threshold",
]
