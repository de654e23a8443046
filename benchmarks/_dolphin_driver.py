"""Driver of dolphin 0.42.9's SHP selection and phase linking for ``bench_phase_linking.py``;
runs in dolphin's own venv only.

Reads the SLC stack ``(azimuth, range, time)`` complex64 that the benchmark saved (``.npy``),
runs ``dolphin.shp.estimate_neighbors`` (GLRT on the amplitudes' mean and variance) and
``dolphin.phase_link.run_phase_linking`` (EMI or EVD, its defaults otherwise), twice (the first
run includes JAX's compilation), and writes the linked phase ``(azimuth, range, time)``, the SHP
counts and the wall times to an ``.npz``.

The scene goes through in one call (``tile`` 0, the default) or in tiles of ``tile`` x ``tile``
pixels with a halo of half a window (NaN outside the scene, which dolphin masks as no data), all
of one shape so that JAX compiles once.

The benchmark starts this driver with ``PJRT_NPROC`` set (more XLA intra-op threads than
cores): with jaxlib 0.10.2's default pool of one thread per core, a call on more than about
700 pixels never returned on a 2-core machine. gdb showed why: both ``tf_XLAEigen`` pool
threads were inside a LAPACK custom call (``lapack_sgetrf_ffi`` and ``lapack_cgetrf_ffi``, LU
decompositions that XLA's thunk executor runs concurrently), each in
``jax::ParallelBatchMap`` waiting (``absl::BlockingCounter::Wait``) for the batch slices it had
queued on the same pool, which had no free thread left to run them; the main thread waited in
``tsl::BlockUntilReady``. Small batches are not split, hence tiles of 16 x 16 ran. A pool with
more threads than concurrent LAPACK calls cannot lock that way. ``watchdog_s`` in the
parameters dumps the Python stacks and exits if a run takes longer (native stacks need gdb).

dolphin imports GDAL (``osgeo``) at import time for its raster IO, which has no wheel on PyPI;
the SHP and phase-linking functions run on arrays and never call it, so an inert stand-in
module is put in its place here.

Usage: ``dolphin-venv/bin/python _dolphin_driver.py STACK.npy OUT.npz PARAMS_JSON``.
"""

from __future__ import annotations

import faulthandler
import json
import resource
import sys
import time
import types


class _Inert(types.ModuleType):
    """Any attribute is another inert module, any call returns None (GDAL is never used)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return None


def _stand_in_for_gdal() -> None:
    osgeo = _Inert("osgeo")
    for name in ("gdal", "gdal_array", "gdalconst", "osr", "ogr"):
        module = _Inert(f"osgeo.{name}")
        setattr(osgeo, name, module)
        sys.modules[f"osgeo.{name}"] = module
    sys.modules["osgeo"] = osgeo


def main(stack_path: str, out_path: str, params_json: str) -> None:
    _stand_in_for_gdal()
    from importlib.metadata import version

    import numpy as np
    from dolphin import shp
    from dolphin._types import HalfWindow
    from dolphin.phase_link import run_phase_linking

    params = json.loads(params_json)
    slc = np.load(stack_path)  # (azimuth, range, time)
    half = HalfWindow(y=params["half_window"][0], x=params["half_window"][1])
    n_az, n_rg, n_epochs = slc.shape
    tile = int(params.get("tile", 0))
    tile_az, tile_rg = (tile, tile) if tile else (n_az, n_rg)
    tiles_az, tiles_rg = -(-n_az // tile_az), -(-n_rg // tile_rg)
    padded = np.full((n_epochs, tiles_az * tile_az + 2 * half.y,
                      tiles_rg * tile_rg + 2 * half.x),
                     np.nan + 0j, np.complex64)  # dolphin: (time, rows, cols)
    padded[:, half.y:half.y + n_az, half.x:half.x + n_rg] = np.moveaxis(slc, -1, 0)
    phase = np.full((n_epochs, tiles_az * tile_az, tiles_rg * tile_rg), np.nan, np.float32)
    count = np.zeros((tiles_az * tile_az, tiles_rg * tile_rg), np.int32)
    if params.get("watchdog_s"):
        faulthandler.dump_traceback_later(float(params["watchdog_s"]), exit=True)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        for i in range(tiles_az):
            for j in range(tiles_rg):
                block = padded[:, i * tile_az:(i + 1) * tile_az + 2 * half.y,
                               j * tile_rg:(j + 1) * tile_rg + 2 * half.x]
                amplitude = np.abs(block)
                neighbours = shp.estimate_neighbors(
                    halfwin_rowcol=(half.y, half.x), alpha=params["alpha"],
                    mean=np.nanmean(amplitude, axis=0), var=np.nanvar(amplitude, axis=0),
                    nslc=n_epochs, method=shp.ShpMethod.GLRT)
                out = run_phase_linking(block, half_window=half,
                                        use_evd=params["method"] == "evd",
                                        neighbor_arrays=neighbours, reference_idx=0)
                core = (slice(half.y, half.y + tile_az), slice(half.x, half.x + tile_rg))
                rows = slice(i * tile_az, (i + 1) * tile_az)
                cols = slice(j * tile_rg, (j + 1) * tile_rg)
                phase[:, rows, cols] = np.angle(np.asarray(out.cpx_phase))[:, core[0], core[1]]
                count[rows, cols] = np.asarray(out.shp_counts)[core]
        times.append(time.perf_counter() - start)
    np.savez(out_path, phase=np.moveaxis(phase, 0, -1)[:n_az, :n_rg],
             shp_count=count[:n_az, :n_rg], seconds=np.array(times), version=version("dolphin"),
             peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


if __name__ == "__main__":
    main(*sys.argv[1:4])
