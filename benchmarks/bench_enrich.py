"""Time ``ds.stm.enrich_from_polygon`` against the loop users would otherwise write.

10^6 random points over a scene, 1000 ring polygons (a disc with a hole). Baselines, measured in
the same run: (a) a loop over the polygons with vectorised ``shapely.contains_xy`` over all
points, timed on a subset of polygons and scaled to all of them; (b) one ``STRtree.query`` of
shapely Points with a predicate. Prints figures; asserts nothing except that answers agree.

Run: ``python benchmarks/bench_enrich.py [--points N] [--polygons M] [--baseline-polygons K]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import shapely
import xarray as xr

import depsi.stm  # noqa: F401  (registers .stm)
from depsi.stm.order import morton_order


def scene(n_points: int, n_polygons: int, seed: int = 0):
    """Points in Morton order over a 100 x 100 scene and ring polygons with a hole each."""
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0, 100, n_points), rng.uniform(0, 100, n_points)
    order = morton_order((x * 100).astype(np.int64), (y * 100).astype(np.int64))
    x, y = x[order], y[order]
    centres = shapely.points(rng.uniform(0, 100, (n_polygons, 2)))
    radius = rng.uniform(0.8, 2.0, n_polygons)
    rings = shapely.difference(shapely.buffer(centres, radius),
                               shapely.buffer(centres, radius / 3))
    ds = xr.Dataset(coords={"lon": ("space", x), "lat": ("space", y)})
    return ds, rings


def timed(func, repeat: int = 1):
    best, result = np.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - start)
    return best, result


def loop_over_polygons(rings, x, y):
    """The straightforward approach: every polygon against every point; first polygon wins."""
    found = np.full(x.size, -1, dtype=np.int64)
    for i, polygon in enumerate(rings):
        inside = shapely.contains_xy(polygon, x, y)
        found[inside & (found < 0)] = i
    return found


def points_strtree(rings, x, y):
    """One STRtree query with shapely Points and a predicate."""
    pts = shapely.points(x, y)
    point, polygon = shapely.STRtree(rings).query(pts, predicate="intersects")
    found = np.full(x.size, np.iinfo(np.int64).max)
    np.minimum.at(found, point, polygon)
    return np.where(found == np.iinfo(np.int64).max, -1, found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--polygons", type=int, default=1000)
    parser.add_argument("--baseline-polygons", type=int, default=100)
    parser.add_argument("--chunk", type=int, default=250_000, help="space chunk, lazy run")
    args = parser.parse_args()

    import geopandas as gpd

    ds, rings = scene(args.points, args.polygons)
    frame = gpd.GeoDataFrame({"parcel": np.arange(args.polygons)}, geometry=rings)
    x, y = ds["lon"].values, ds["lat"].values
    print(f"{args.points:,} points, {args.polygons} polygons with a hole "
          f"({int(shapely.get_num_coordinates(rings).mean())} vertices each)")

    t_eager, eager = timed(lambda: ds.stm.enrich_from_polygon(frame, "parcel"), repeat=2)
    found = np.nan_to_num(eager["parcel"].values, nan=-1).astype(np.int64)
    print(f"enrich_from_polygon, in memory         : {t_eager:7.3f} s "
          f"({args.points / t_eager / 1e6:.2f} M points/s), {(found >= 0).sum():,} points inside")

    lazy = ds.chunk({"space": args.chunk})
    t_lazy, _ = timed(lambda: lazy.stm.enrich_from_polygon(frame, "parcel")["parcel"].compute(),
                      repeat=2)
    print(f"enrich_from_polygon, Dask, {args.chunk:,}-pt chunks: {t_lazy:7.3f} s")

    t_tree, tree_found = timed(lambda: points_strtree(rings, x, y))
    assert np.array_equal(tree_found, found), "STRtree-of-Points answer differs"
    print(f"baseline STRtree.query(shapely.points) : {t_tree:7.3f} s   "
          f"ratio {t_tree / t_eager:5.1f}x")

    k = min(args.baseline_polygons, args.polygons)
    t_loop_k, loop_found = timed(lambda: loop_over_polygons(rings[:k], x, y))
    subset = ds.stm.enrich_from_polygon(frame.iloc[:k], "parcel")["parcel"].values
    assert np.array_equal(loop_found, np.nan_to_num(subset, nan=-1).astype(np.int64)), \
        "loop answer differs"
    t_loop = t_loop_k * args.polygons / k
    print(f"baseline loop of contains_xy ({k} polys: {t_loop_k:.2f} s) scaled to "
          f"{args.polygons}: {t_loop:7.2f} s   ratio {t_loop / t_eager:5.1f}x")


if __name__ == "__main__":
    main()
