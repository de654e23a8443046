"""TU Delft DePSI 0.1.2's ``ps_selection`` (NAD) on a Zarr SLC store, for ``bench_selection.py``;
runs in the peer's venv only (it imports the *peer's* ``depsi``).

Usage: ``peer-venv/bin/python _peer_selection_driver.py STORE THRESHOLD``. Prints one JSON line:
wall seconds, CPU seconds (all threads), peak resident MB above the start, points selected. An
untimed selection on the first chunk first (imports, thread pools), as the other cases do.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import dask.array as da
import xarray as xr
from depsi.classification import ps_selection


def _open(store):
    slcs = xr.open_zarr(store)
    return slcs.assign(amplitude=slcs["complex"].copy(data=da.absolute(slcs["complex"].data)),
                       phase=slcs["complex"].copy(data=da.angle(slcs["complex"].data)))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(store: str, threshold: float) -> None:
    slcs = _open(store)
    az, rg = slcs["complex"].data.chunksize[:2]
    ps_selection(slcs.isel(azimuth=slice(0, az), range=slice(0, rg)), threshold=threshold,
                 method="nad", output_chunks=10000, mem_persist=True)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu, start = _cpu(), time.perf_counter()
    points = ps_selection(_open(store), threshold=threshold, method="nad", output_chunks=10000,
                          mem_persist=True)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "cpu": _cpu() - cpu, "points": points.sizes["space"],
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                      - base}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
