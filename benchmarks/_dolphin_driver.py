"""Driver of dolphin 0.42.9's SHP selection and phase linking for ``bench_phase_linking.py``;
runs in dolphin's own venv only.

Reads the SLC stack ``(azimuth, range, time)`` complex64 that the benchmark saved (``.npy``),
runs ``dolphin.shp.estimate_neighbors`` (GLRT on the amplitudes' mean and variance) and
``dolphin.phase_link.run_phase_linking`` (EMI or EVD, its defaults otherwise), twice (the first
run includes JAX's compilation), and writes the linked phase ``(azimuth, range, time)``, the SHP
counts and the wall times to an ``.npz``.

The scene goes through in tiles of ``tile`` x ``tile`` pixels with a halo of half a window (NaN
outside the scene, which dolphin masks as no data), all of one shape so that JAX compiles once:
on this 2-core machine a single call on 32 x 32 pixels of 30 epochs never returned (every
thread waiting on a lock, 10 % of a core busy) while 16 x 16 took 0.3 s.

dolphin imports GDAL (``osgeo``) at import time for its raster IO, which has no wheel on PyPI;
the SHP and phase-linking functions run on arrays and never call it, so an inert stand-in
module is put in its place here.

Usage: ``dolphin-venv/bin/python _dolphin_driver.py STACK.npy OUT.npz PARAMS_JSON``.
"""

from __future__ import annotations

import json
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
    tile = int(params.get("tile", 16))
    n_az, n_rg, n_epochs = slc.shape
    tiles_az, tiles_rg = -(-n_az // tile), -(-n_rg // tile)
    padded = np.full((n_epochs, tiles_az * tile + 2 * half.y, tiles_rg * tile + 2 * half.x),
                     np.nan + 0j, np.complex64)  # dolphin: (time, rows, cols)
    padded[:, half.y:half.y + n_az, half.x:half.x + n_rg] = np.moveaxis(slc, -1, 0)
    phase = np.full((n_epochs, tiles_az * tile, tiles_rg * tile), np.nan, np.float32)
    count = np.zeros((tiles_az * tile, tiles_rg * tile), np.int32)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        for i in range(tiles_az):
            for j in range(tiles_rg):
                block = padded[:, i * tile:(i + 1) * tile + 2 * half.y,
                               j * tile:(j + 1) * tile + 2 * half.x]
                amplitude = np.abs(block)
                neighbours = shp.estimate_neighbors(
                    halfwin_rowcol=(half.y, half.x), alpha=params["alpha"],
                    mean=np.nanmean(amplitude, axis=0), var=np.nanvar(amplitude, axis=0),
                    nslc=n_epochs, method=shp.ShpMethod.GLRT)
                out = run_phase_linking(block, half_window=half,
                                        use_evd=params["method"] == "evd",
                                        neighbor_arrays=neighbours, reference_idx=0)
                core = (slice(half.y, half.y + tile), slice(half.x, half.x + tile))
                rows, cols = slice(i * tile, (i + 1) * tile), slice(j * tile, (j + 1) * tile)
                phase[:, rows, cols] = np.angle(np.asarray(out.cpx_phase))[:, core[0], core[1]]
                count[rows, cols] = np.asarray(out.shp_counts)[core]
        times.append(time.perf_counter() - start)
    np.savez(out_path, phase=np.moveaxis(phase, 0, -1)[:n_az, :n_rg],
             shp_count=count[:n_az, :n_rg], seconds=np.array(times), version=version("dolphin"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
