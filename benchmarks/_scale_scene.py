"""Point STMs of 10^5 to 10^7 persistent scatterers for ``bench_scale.py``, written tile by tile.

Independent of :mod:`depsi.simulate` (no shared code; the physical conventions are those of
``tests/scenes.py``): PS at 3 % of 10 m pixels of a square scene, 60 epochs 12 days apart,
mother at the middle epoch, and a wrapped single-mother interferogram per point and epoch::

    phase = wrap(m2ph * (v * t + h2ph * h) + aps_t(x) - aps_mother(x) + noise)

with ``m2ph = -4 pi / wavelength`` and ``t`` in years of 365.25 days from the mother.

- atmosphere: 1 rad per epoch, exponential covariance of 400 m correlation length, synthesised
  per epoch by FFT on a coarse 100 m grid (padded, so not periodic over the scene) and
  interpolated bilinearly to the points;
- velocity: Gaussian subsidence bowls (5-20 mm/yr, one per 100 km^2, at least three) plus a
  planar ramp of 4 mm/yr across the scene, on the same coarse grid;
- height errors: white, N(0, 3 m); perpendicular baselines N(0, 120 m) per epoch, zero at the
  mother; ``h2ph = Bperp / (R sin 37 deg)`` with the slant range ``R`` about 850 km growing
  across range;
- 30 % of the points have a low amplitude dispersion (0.05-0.15) and 0.3 rad phase noise per
  SLC, the others 0.15-0.25 and 0.5 rad; the interferogram's noise is the epoch's minus the
  mother's, so the mother column is exactly 0.

Memory is bounded by the coarse screens (``60 x (scene / 100 m)^2`` float32: 0.8 GB for 10^7
points) and one tile of points: the scene is cut into tiles of ``TILE`` x ``TILE`` pixels, a
power of two, visited in Z order of the tiles, with each tile's points in Morton order, so the
points arrive in the global Morton order of (azimuth, range) that depsi stores; they are
buffered into whole space chunks and written straight into the Zarr arrays.

Two stores are written side by side, then moved into place together:

- ``ps.zarr``, the chain's input: ``phase`` and ``h2ph`` (float32, space x time),
  ``amplitude_dispersion`` (float32), coordinates ``azimuth``, ``range``, ``time``; compressed
  and checksummed (LZ4 + crc32c) with the codecs depsi's ``save_stm`` uses, but written with
  xarray (the metadata) and zarr (each chunk), not ``save_stm``, which needs the whole Dataset.
  It opens with :func:`depsi.io.open_stm`, which validates it.
- ``truth.zarr``: per point ``velocity`` (m/yr), ``height_error`` (m) and the errors of the two
  oracle fits (least squares of offset, velocity and height error, true ambiguities) to the
  noise alone (``*_noise_error``, the noise floor) and to noise plus atmosphere
  (``*_nocorr_error``, what a chain without atmospheric correction reaches at best); their RMS
  over all points in its attrs (``floor_*``).

Run ``python benchmarks/_scale_scene.py N FOLDER`` to write one scene (``bench_scale.py`` does,
in a child process, to measure its time and memory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import xarray as xr

#: Bump when the scene changes: cached scenes of another version are regenerated.
GENERATOR_VERSION = 1

WAVELENGTH = 0.05546576  # m, Sentinel-1 C band
M2PH = -4.0 * np.pi / WAVELENGTH
PIXEL = 10.0  # m, azimuth and range
PS_DENSITY = 0.03
N_EPOCHS = 60
REVISIT_DAYS = 12
FIRST_EPOCH = np.datetime64("2021-01-04", "ns")
SLANT_RANGE = 850e3  # m, at mid-scene
INCIDENCE = np.deg2rad(37.0)
BPERP_STD = 120.0  # m
APS_STD = 1.0  # rad per epoch
APS_LENGTH = 400.0  # m, exponential covariance
COARSE = 100.0  # m, grid of the screens and of the velocity field
HEIGHT_STD = 3.0  # m
LOW_FRACTION = 0.3
LOW_NAD, HIGH_NAD = (0.05, 0.15), (0.15, 0.25)
LOW_NOISE, HIGH_NOISE = 0.3, 0.5  # rad per SLC
BOWL_DEPTH = (0.005, 0.020)  # m/yr
BOWL_SIGMA = (300.0, 1500.0)  # m
BOWL_AREA = 100e6  # m^2 of scene per bowl
RAMP = 0.004  # m/yr across the scene
#: Tile side in pixels; a power of two, so Z order of tiles then Morton order within a tile is
#: the global Morton order.
TILE = 1024
#: Bytes of one space chunk over all variables (depsi's ``save_stm`` default).
CHUNK_BYTES = 32 * 2**20

PS_STORE, TRUTH_STORE = "ps.zarr", "truth.zarr"
FLOOR_NAMES = ("velocity_noise_error", "height_noise_error", "velocity_nocorr_error",
               "height_nocorr_error")


def scene_side(n_points: int) -> int:
    """Pixels a side of the square scene holding ``n_points`` PS at :data:`PS_DENSITY`."""
    return math.ceil(math.sqrt(n_points / PS_DENSITY))


def epochs() -> tuple[np.ndarray, int, np.ndarray]:
    """Acquisition times, the mother's index and times in years from the mother."""
    times = FIRST_EPOCH + np.arange(N_EPOCHS) * np.timedelta64(REVISIT_DAYS, "D")
    mother = N_EPOCHS // 2
    years = (times - times[mother]) / np.timedelta64(1, "D") / 365.25
    return times, mother, years


# ---------------------------------------------------------------------- smooth fields (coarse)
def _exponential_spectrum(shape: tuple[int, int], length_cells: float) -> np.ndarray:
    """Amplitude spectrum (rfft layout) of a field with covariance ``exp(-r / length)``."""
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.rfftfreq(shape[1])[None, :]
    k = 2.0 * np.pi * np.hypot(ky, kx)
    # 2-D power spectrum of exp(-r/L): 2 pi L^2 / (1 + (k L)^2)^(3/2)
    power = 2.0 * np.pi * length_cells**2 / (1.0 + (k * length_cells) ** 2) ** 1.5
    return np.sqrt(power).astype(np.float32)


def atmosphere_screens(rng: np.random.Generator, grid: tuple[int, int], mother: int
                       ) -> np.ndarray:
    """Screens of every epoch minus the mother's, on the coarse grid: ``(ny, nx, time)``
    float32, each epoch's screen of zero mean and :data:`APS_STD` before the difference."""
    import scipy.fft

    length = APS_LENGTH / COARSE
    # padding of 4 correlation lengths: the wrap-around correlation is exp(-4) < 2 %
    pad = tuple(scipy.fft.next_fast_len(s + int(math.ceil(4 * length)), real=True)
                for s in grid)
    amplitude = _exponential_spectrum(pad, length)
    screens = np.empty((*grid, N_EPOCHS), dtype=np.float32)
    for t in range(N_EPOCHS):
        white = rng.standard_normal(pad, dtype=np.float32)
        field = scipy.fft.irfft2(scipy.fft.rfft2(white) * amplitude, s=pad)[:grid[0], :grid[1]]
        field -= field.mean()
        field *= APS_STD / field.std()
        screens[:, :, t] = field
    screens -= screens[:, :, mother:mother + 1]
    return screens


def velocity_field(rng: np.random.Generator, grid: tuple[int, int], extent: float
                   ) -> np.ndarray:
    """Subsidence bowls plus a planar ramp on the coarse grid, m/yr, ``(ny, nx)`` float64."""
    y = np.arange(grid[0]) * COARSE
    x = np.arange(grid[1]) * COARSE
    field = RAMP * (0.8 * (y[:, None] / extent - 0.5) + 0.6 * (x[None, :] / extent - 0.5))
    n_bowls = max(3, round(extent**2 / BOWL_AREA))
    centres = rng.uniform(0.0, extent, (n_bowls, 2))
    depths = rng.uniform(*BOWL_DEPTH, n_bowls)
    sigmas = rng.uniform(*BOWL_SIGMA, n_bowls)
    for (cy, cx), depth, sigma in zip(centres, depths, sigmas):
        # each bowl only where it is above 1e-4 of its depth: a window of 4.3 sigma
        reach = 4.3 * sigma
        iy = slice(max(0, int((cy - reach) / COARSE)), min(grid[0], int((cy + reach) / COARSE) + 2))
        ix = slice(max(0, int((cx - reach) / COARSE)), min(grid[1], int((cx + reach) / COARSE) + 2))
        r2 = (y[iy, None] - cy) ** 2 + (x[None, ix] - cx) ** 2
        field[iy, ix] -= depth * np.exp(-r2 / (2.0 * sigma**2))
    return field


def bilinear(grid_values: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``grid_values`` (ny, nx, ...) at positions ``y``, ``x`` (m): ``(n, ...)``."""
    gy, gx = y / COARSE, x / COARSE
    i0 = np.minimum(gy.astype(np.int64), grid_values.shape[0] - 2)
    j0 = np.minimum(gx.astype(np.int64), grid_values.shape[1] - 2)
    fy, fx = gy - i0, gx - j0
    extra = (slice(None),) + (None,) * (grid_values.ndim - 2)
    wy, wx = fy[extra], fx[extra]
    top = grid_values[i0, j0] * (1 - wx) + grid_values[i0, j0 + 1] * wx
    bottom = grid_values[i0 + 1, j0] * (1 - wx) + grid_values[i0 + 1, j0 + 1] * wx
    return (top * (1 - wy) + bottom * wy).astype(grid_values.dtype)


# ------------------------------------------------------------------------------- the scene
class Scene:
    """The scene-wide quantities of one size: geometry, baselines, coarse fields, tiles."""

    def __init__(self, n_points: int, seed: int = 0):
        from depsi.stm.order import morton_order

        self.n_points, self.seed = int(n_points), int(seed)
        self.side = scene_side(n_points)
        self.extent = self.side * PIXEL
        self.times, self.mother, self.years = epochs()
        root = np.random.SeedSequence([20261201, GENERATOR_VERSION, self.seed, self.n_points])
        scene_seed, self.tile_seed = root.spawn(2)
        rng = np.random.default_rng(scene_seed)
        bperp = rng.normal(0.0, BPERP_STD, N_EPOCHS)
        self.bperp = bperp - bperp[self.mother]
        grid = (int(math.ceil(self.extent / COARSE)) + 2,) * 2
        self.velocity_grid = velocity_field(rng, grid, self.extent)
        self.screens = atmosphere_screens(rng, grid, self.mother)
        n_tiles = math.ceil(self.side / TILE)
        ta, tr = np.divmod(np.arange(n_tiles * n_tiles), n_tiles)
        order = morton_order(ta, tr)
        self.tiles = np.column_stack([ta[order], tr[order]]) * TILE
        sizes = np.minimum(self.side - self.tiles, TILE)
        self.tile_shapes = sizes
        area = sizes.prod(axis=1).astype(np.float64)
        self.tile_counts = rng.multinomial(self.n_points, area / area.sum())
        # the oracle fit's design for h2ph = bperp: a point's height column is this one times
        # its 1 / (R sin theta), so its height estimate is this fit's divided by that factor
        design = np.column_stack([M2PH * self.years, M2PH * self.bperp, np.ones(N_EPOCHS)])
        self.fit_rows = np.linalg.pinv(design)[:2]  # (velocity, height) x time

    def inverse_range_sine(self, range_: np.ndarray) -> np.ndarray:
        """``1 / (R sin theta)`` at range pixels ``range_``: R grows by the ground distance
        times sin(theta) across the scene, about 850 km at its middle."""
        slant = SLANT_RANGE + (range_ - self.side / 2) * PIXEL * np.sin(INCIDENCE)
        return 1.0 / (slant * np.sin(INCIDENCE))

    def tile_points(self, index: int) -> dict[str, np.ndarray]:
        """Every variable of the points of tile ``index`` (Z order), in Morton order."""
        from depsi.stm.order import morton_order

        # the index-th child of the tiles' seed, whatever the order tiles are made in
        rng = np.random.default_rng(np.random.SeedSequence(
            self.tile_seed.entropy, spawn_key=(*self.tile_seed.spawn_key, index)))
        n = int(self.tile_counts[index])
        (a0, r0), (height, width) = self.tiles[index], self.tile_shapes[index]
        flat = rng.choice(int(height) * int(width), n, replace=False)
        az, rg = np.divmod(flat, int(width))
        az, rg = az + a0, rg + r0
        order = morton_order(az, rg)
        az, rg = az[order], rg[order]
        y, x = az * PIXEL, rg * PIXEL

        low = rng.random(n) < LOW_FRACTION
        nad = np.where(low, rng.uniform(*LOW_NAD, n), rng.uniform(*HIGH_NAD, n))
        sigma = np.where(low, LOW_NOISE, HIGH_NOISE).astype(np.float32)
        slc_noise = rng.standard_normal((n, N_EPOCHS), dtype=np.float32) * sigma[:, None]
        noise = slc_noise - slc_noise[:, self.mother:self.mother + 1]
        aps = bilinear(self.screens, y, x)
        velocity = bilinear(self.velocity_grid, y, x)
        height = rng.normal(0.0, HEIGHT_STD, n)
        inverse = self.inverse_range_sine(rg)
        h2ph = (inverse[:, None] * self.bperp[None, :]).astype(np.float32)

        model = M2PH * (velocity[:, None] * self.years[None, :] + h2ph * height[:, None])
        phase = np.pi - np.mod(np.pi - (model + aps + noise), 2.0 * np.pi)
        phase = phase.astype(np.float32)
        phase[:, self.mother] = 0.0

        v_noise, h_noise = self._oracle_errors(noise, inverse)
        v_nocorr, h_nocorr = self._oracle_errors(noise + aps, inverse)
        return {"phase": phase, "h2ph": h2ph, "amplitude_dispersion": nad.astype(np.float32),
                "azimuth": az.astype(np.int64), "range": rg.astype(np.int64),
                "velocity": velocity.astype(np.float32), "height_error": height.astype(np.float32),
                "velocity_noise_error": v_noise, "height_noise_error": h_noise,
                "velocity_nocorr_error": v_nocorr, "height_nocorr_error": h_nocorr}

    def _oracle_errors(self, error_phase: np.ndarray, inverse: np.ndarray):
        """Velocity and height error that ``error_phase`` (n, time) puts into the least-squares
        fit of offset, velocity and height error (true ambiguities), float32."""
        fitted = error_phase.astype(np.float64) @ self.fit_rows.T
        return fitted[:, 0].astype(np.float32), (fitted[:, 1] / inverse).astype(np.float32)


# ------------------------------------------------------------------------------------ stores
def _template(variables: dict[str, tuple], n_points: int, times: np.ndarray, attrs: dict,
              chunk: int) -> xr.Dataset:
    """A lazy Dataset of the store's layout; its data are never computed, only its metadata
    written (``to_zarr(compute=False)``)."""
    import dask.array as da

    data_vars, coords = {}, {"time": times}
    for name, (dims, dtype, units, is_coord) in variables.items():
        shape = tuple(n_points if d == "space" else len(times) for d in dims)
        chunks = tuple(chunk if d == "space" else len(times) for d in dims)
        array = da.zeros(shape, dtype=dtype, chunks=chunks)
        (coords if is_coord else data_vars)[name] = (dims, array, {"units": units})
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def _compressors(dtype: np.dtype) -> list:
    """LZ4 behind a byte shuffle, then a crc32c checksum per chunk (as depsi's stores)."""
    from zarr.codecs import BloscCodec, Crc32cCodec

    return [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=dtype.itemsize),
            Crc32cCodec()]


PS_VARIABLES = {
    "phase": (("space", "time"), np.float32, "rad", False),
    "h2ph": (("space", "time"), np.float32, "1", False),
    "amplitude_dispersion": (("space",), np.float32, "1", False),
    "azimuth": (("space",), np.int64, "1", True),
    "range": (("space",), np.int64, "1", True),
}
TRUTH_VARIABLES = {
    "velocity": (("space",), np.float32, "m year-1", False),
    "height_error": (("space",), np.float32, "m", False),
    **{name: (("space",), np.float32, "m year-1" if name.startswith("velocity") else "m", False)
       for name in FLOOR_NAMES},
    "azimuth": (("space",), np.int64, "1", True),
    "range": (("space",), np.int64, "1", True),
}


def space_chunk(variables: dict[str, tuple]) -> int:
    """Points per space chunk: :data:`CHUNK_BYTES` over the variables of one point."""
    row = sum(np.dtype(dtype).itemsize * (N_EPOCHS if "time" in dims else 1)
              for dims, dtype, _, _ in variables.values())
    return max(1, CHUNK_BYTES // row)


class _ChunkWriter:
    """Buffers rows of points and writes them into a store's arrays one whole chunk at a time."""

    def __init__(self, path: Path, variables: dict[str, tuple], template: xr.Dataset,
                 chunk: int):
        import zarr

        encoding = {name: {"compressors": _compressors(np.dtype(variables[name][1]))}
                    for name in variables}
        template.to_zarr(path, mode="w-", zarr_format=3, consolidated=False, compute=False,
                         encoding=encoding)
        self.arrays = {name: zarr.open_array(zarr.storage.LocalStore(path), path=name,
                                             mode="r+", config={"write_empty_chunks": True})
                       for name in variables}
        self.path, self.chunk = path, chunk
        self.buffer: dict[str, list[np.ndarray]] = {name: [] for name in variables}
        self.buffered = self.written = 0

    def add(self, rows: dict[str, np.ndarray]) -> None:
        for name in self.buffer:
            self.buffer[name].append(rows[name])
        self.buffered += len(next(iter(rows.values())))
        while self.buffered >= self.chunk:
            self._flush(self.chunk)

    def close(self) -> None:
        if self.buffered:
            self._flush(self.buffered)
        total = next(iter(self.arrays.values())).shape[0]
        if self.written != total:
            raise RuntimeError(f"{self.path}: expected {total} points written, found "
                               f"{self.written}")

    def _flush(self, count: int) -> None:
        for name, parts in self.buffer.items():
            joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
            self.arrays[name][self.written:self.written + count] = joined[:count]
            self.buffer[name] = [joined[count:]] if len(joined) > count else []
        self.written += count
        self.buffered -= count


def _rms(sum_squares: float, count: int) -> float:
    return float(math.sqrt(sum_squares / max(count, 1)))


def write_scene(n_points: int, folder: str | os.PathLike, *, seed: int = 0) -> dict:
    """Write ``ps.zarr`` and ``truth.zarr`` of an ``n_points`` scene into ``folder``.

    The two stores are written into a temporary sibling that is renamed to ``folder`` when
    complete, so an existing ``folder`` is always a whole scene. Returns the scene's summary
    (also the truth store's attrs).
    """
    from depsi.io.store import consolidate_metadata

    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"scene folder {str(folder)!r} exists")
    start = time.perf_counter()
    scene = Scene(n_points, seed)
    fields_seconds = time.perf_counter() - start
    attrs = {"wavelength": WAVELENGTH, "mother_time": str(scene.times[scene.mother]),
             "azimuth_spacing": PIXEL, "range_spacing": PIXEL, "interferogram": 1,
             "scene": "benchmarks/_scale_scene.py", "scene_version": GENERATOR_VERSION,
             "scene_seed": scene.seed}
    tmp = folder.with_name(f".{folder.name}.writing-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        writers = {}
        for store, variables in ((PS_STORE, PS_VARIABLES), (TRUTH_STORE, TRUTH_VARIABLES)):
            chunk = space_chunk(variables)
            template = _template(variables, scene.n_points, scene.times, attrs, chunk)
            writers[store] = _ChunkWriter(tmp / store, variables, template, chunk)
        sum_squares = dict.fromkeys(FLOOR_NAMES, 0.0)
        for index in range(len(scene.tiles)):
            if not scene.tile_counts[index]:
                continue
            rows = scene.tile_points(index)
            for writer in writers.values():
                writer.add(rows)
            for name in FLOOR_NAMES:
                sum_squares[name] += float(np.sum(rows[name].astype(np.float64) ** 2))
        for writer in writers.values():
            writer.close()
        summary = {
            "n_points": scene.n_points, "side_pixels": scene.side,
            "extent_km": scene.extent / 1e3, "n_epochs": N_EPOCHS, "n_tiles": len(scene.tiles),
            "space_chunk": writers[PS_STORE].chunk,
            **{f"floor_{name.removesuffix('_error')}": _rms(sum_squares[name], scene.n_points)
               for name in FLOOR_NAMES},
            "fields_seconds": fields_seconds,
            "generation_seconds": time.perf_counter() - start,
        }
        _set_root_attrs(tmp / TRUTH_STORE, summary)
        for store in writers:
            consolidate_metadata(tmp / store)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _set_root_attrs(path: Path, extra: dict) -> None:
    import zarr

    group = zarr.open_group(zarr.storage.LocalStore(path), mode="r+", use_consolidated=False)
    group.attrs.update(extra)


def scene_summary(folder: str | os.PathLike) -> dict | None:
    """The summary of a complete scene of this generator version in ``folder``, else None."""
    folder = Path(folder)
    meta = folder / TRUTH_STORE / "zarr.json"
    if not (folder / PS_STORE / "zarr.json").exists() or not meta.exists():
        return None
    attrs = json.loads(meta.read_text()).get("attributes", {})
    if attrs.get("scene_version") != GENERATOR_VERSION:
        return None
    return attrs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n_points", type=float, help="number of PS, e.g. 1e6")
    parser.add_argument("folder", help="scene folder to create (ps.zarr, truth.zarr)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the summary and peak RSS to this file")
    args = parser.parse_args(argv)
    summary = write_scene(int(args.n_points), args.folder, seed=args.seed)
    summary["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.json:
        Path(args.json).write_text(json.dumps(summary))
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
