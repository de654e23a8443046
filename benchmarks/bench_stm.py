"""Zarr write/read throughput of a point STM against numpy.save/load of the same bytes.

Run: ``python benchmarks/bench_stm.py [--points N] [--epochs T]``. Prints MB/s and ratios; also
runs the enrich_from_polygon benchmark (10^6 points, 1000 polygons with holes) when asked with
``--enrich``. Nothing here is asserted: figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

from depsi.io import open_stm, save_stm


def make_stm(n_points: int, n_epochs: int, seed: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    side = int(np.ceil(np.sqrt(n_points * 4)))
    flat = rng.choice(side * side, size=n_points, replace=False)
    az, rg = np.divmod(flat, side)
    slc = (rng.normal(size=(n_points, n_epochs)) + 1j * rng.normal(size=(n_points, n_epochs)))
    slc = slc.astype(np.complex64)
    dates = np.datetime64("2020-01-01", "ns") + np.arange(n_epochs) * np.timedelta64(12, "D")
    ds = xr.Dataset(
        {"complex": (("space", "time"), slc),
         "amplitude": (("space", "time"), np.abs(slc)),
         "phase": (("space", "time"), np.angle(slc).astype(np.float32))},
        coords={"time": dates, "azimuth": ("space", az), "range": ("space", rg)},
        attrs={"wavelength": 0.0555},
    )
    order = np.argsort((az.astype(np.uint64) << np.uint64(32)) | rg.astype(np.uint64))
    return ds.isel(space=order)


def _best_of(fn, repeat=3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_zarr(n_points: int, n_epochs: int) -> None:
    from depsi.io.store import to_morton_order

    ds = to_morton_order(make_stm(n_points, n_epochs))
    arrays = {k: ds[k].values for k in ("complex", "amplitude", "phase")}
    nbytes = sum(a.nbytes for a in arrays.values())
    tmp = Path(tempfile.mkdtemp(prefix="bench_stm_"))
    try:
        def np_write():
            for k, a in arrays.items():
                np.save(tmp / f"{k}.npy", a)

        def np_read():
            return [np.load(tmp / f"{k}.npy") for k in arrays]

        def zarr_write():
            save_stm(ds, tmp / "stm.zarr", overwrite=True)

        def zarr_read():
            out = open_stm(tmp / "stm.zarr")
            return [out[k].values for k in arrays]

        t_npw = _best_of(np_write)
        t_npr = _best_of(np_read)
        t_zw = _best_of(zarr_write)
        t_zr = _best_of(zarr_read)
        mb = nbytes / 1e6
        print(f"point STM {n_points} x {n_epochs}: {mb:.0f} MB of complex+amplitude+phase")
        print(f"  numpy.save  {mb / t_npw:8.0f} MB/s   (baseline)")
        print(f"  save_stm    {mb / t_zw:8.0f} MB/s   ratio to numpy.save {t_zw / t_npw:5.2f}x")
        print(f"  numpy.load  {mb / t_npr:8.0f} MB/s   (baseline)")
        print(f"  open_stm    {mb / t_zr:8.0f} MB/s   ratio to numpy.load {t_zr / t_npr:5.2f}x")
        disk = sum(p.stat().st_size for p in (tmp / "stm.zarr").rglob("*") if p.is_file())
        print(f"  Zarr store on disk {disk / 1e6:.0f} MB (compressed) vs {mb:.0f} MB raw")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--enrich", action="store_true", help="also run bench_enrich")
    args = parser.parse_args()
    bench_zarr(args.points, args.epochs)
    if args.enrich:
        import runpy

        runpy.run_path(str(Path(__file__).with_name("bench_enrich.py")), run_name="__main__")


if __name__ == "__main__":
    main()
