"""Driver of dolphin 0.42.9's SHP selection and phase linking for ``bench_phase_linking.py``;
runs in dolphin's own venv only.

Reads the SLC stack ``(azimuth, range, time)`` complex64 that the benchmark saved (``.npy``),
runs ``dolphin.shp.estimate_neighbors`` (GLRT on the amplitudes' mean and variance) and
``dolphin.phase_link.run_phase_linking`` (EMI or EVD, its defaults otherwise), twice (the first
run includes JAX's compilation), and writes the linked phase ``(azimuth, range, time)``, the SHP
counts and the wall times to an ``.npz``.

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
    stack = np.ascontiguousarray(np.moveaxis(slc, -1, 0))  # dolphin: (time, rows, cols)
    half = HalfWindow(y=params["half_window"][0], x=params["half_window"][1])
    amplitude = np.abs(stack)
    times, outputs = [], None
    for _ in range(2):
        start = time.perf_counter()
        neighbours = shp.estimate_neighbors(
            halfwin_rowcol=(half.y, half.x), alpha=params["alpha"],
            mean=amplitude.mean(axis=0), var=amplitude.var(axis=0), nslc=stack.shape[0],
            method=shp.ShpMethod.GLRT)
        outputs = run_phase_linking(stack, half_window=half, use_evd=params["method"] == "evd",
                                    neighbor_arrays=neighbours, reference_idx=0)
        np.asarray(outputs.cpx_phase)
        times.append(time.perf_counter() - start)
    phase = np.angle(np.moveaxis(np.asarray(outputs.cpx_phase), 0, -1))
    np.savez(out_path, phase=phase.astype(np.float32),
             shp_count=np.asarray(outputs.shp_counts), seconds=np.array(times),
             version=version("dolphin"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
