"""Simulated SLC stacks with a known truth, to test and benchmark depsi end to end.

``simulate_stack`` builds a lazy, chunk-independent (azimuth, range, time) stack of persistent
and distributed scatterers with a known deformation, height error and atmosphere, deterministic
by seed; ``write_stack_zarr`` and ``write_stack_binary`` write it to disk block by block.

Phase model (DESIGN.md §3, the sign convention of the Delft method), per pixel and epoch ``t``::

    m2ph          = -4 * pi / wavelength
    slc_phase_t   = scatterer_phase + m2ph * (displacement_t + h2ph_t * height_error)
                    + aps_t + noise_t                                   (wrapped)
    ifg_phase_t   = angle(slc_t * conj(slc_mother))
                  = wrap(m2ph * (displacement_t - displacement_mother + h2ph_t * height_error)
                         + aps_t + noise_t - noise_mother)

with ``h2ph_t = bperp_t / (R sin(theta))`` (zero at the mother epoch), ``aps_mother = 0`` and
``displacement_t = velocity * tau_t + seasonal_amplitude * sin(2 pi tau_t)``, ``tau_t`` the time
since the first epoch in years of 365.25 days, so ``displacement`` is zero at the first epoch.
Persistent scatterers (PS) follow this model with ``noise_t ~ N(0, ps_noise_std)`` per epoch
(so the interferometric noise has standard deviation ``sqrt(2) * ps_noise_std`` off the mother
epoch); distributed scatterers are circular complex Gaussian, independent per epoch (Rayleigh
amplitude, uniform phase), i.e. fully decorrelated.

Randomness is drawn per fixed internal tile of ``TILE_SIZE`` x ``TILE_SIZE`` pixels from
``SeedSequence([seed, key, tile_i, tile_j, ...])`` and every tile is always computed whole, so a
value never depends on how the stack is chunked.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr
from tqdm.auto import tqdm

from depsi.conventions import (
    SPEED_OF_LIGHT,
    phase_per_metre,
    wrap_phase,
    years_since,
)
from depsi.io.doris import _doris_time, _fields, _process_control, _section
from depsi.io.paths import TEMPORARY, temporary_sibling

logger = logging.getLogger(__name__)

#: Edge (pixels) of the fixed tiles that randomness is drawn on; changing it changes the stacks.
TILE_SIZE = 256

#: Target bytes of ``complex`` per chunk when ``chunks="auto"`` (chunk edges are tile multiples).
CHUNK_BYTES = 64 * 2**20

#: Ground pixel spacing (m) in azimuth and range.
PIXEL_SPACING = (10.0, 10.0)

#: Scene centre (WGS84 degrees latitude, longitude): Amsterdam.
SCENE_CENTRE = (52.3676, 4.9041)

#: Heading of the (ascending, right-looking) track, degrees clockwise from north. Azimuth index
#: grows along the flight direction (to the north), range index away from the track (east).
HEADING_DEG = -12.0

#: Slant range (m) and incidence angle (degrees) at the scene centre, Sentinel-1 like. The
#: geometry is a flat Earth below a satellite at height ``R cos(theta)``, so slant range and
#: incidence angle grow smoothly across range.
SLANT_RANGE_CENTRE = 850e3
INCIDENCE_CENTRE_DEG = 39.0

#: Standard deviation (m) of the random perpendicular baselines (zero at the mother epoch).
BPERP_STD = 100.0

#: Ground speed of the footprint (m/s): azimuth pixel spacing over azimuth time interval.
GROUND_SPEED = 6740.0

#: UTC second of the day of the first line of every acquisition (an evening ascending pass).
ACQUISITION_SECOND_OF_DAY = 17 * 3600 + 24 * 60 + 30.0

#: Root-mean-square amplitude of distributed scatterers (arbitrary SLC units).
DS_RMS_AMPLITUDE = 100.0

#: Mean PS amplitude as a multiple of ``DS_RMS_AMPLITUDE``: log-uniform between these.
PS_AMPLITUDE_GAIN = (3.0, 20.0)

#: Amplitude dispersion (std / mean) of PS amplitudes: uniform between these, per PS.
PS_NAD_RANGE = (0.1, 0.2)

#: Amplitude dispersion of a Rayleigh amplitude, sqrt(4 / pi - 1) = 0.5227.
RAYLEIGH_NAD = math.sqrt(4.0 / math.pi - 1.0)

#: Atmospheric phase screens: sum of this many random Fourier modes drawn from an isotropic
#: power-law spectrum ``P(k) ~ k**-APS_SPECTRAL_EXPONENT`` (8/3: the 2-D spectrum of a
#: Kolmogorov-like troposphere) between an outer scale of twice the scene extent and the pixel
#: Nyquist scale.
APS_MODES = 256
APS_SPECTRAL_EXPONENT = 8.0 / 3.0

#: Share of ``velocity_max`` in the subsidence bowl (the rest is the linear trend).
BOWL_SHARE = 0.8

_WGS84_A = 6378137.0
_WGS84_E2 = 6.69437999014e-3
_GM = 3.986004418e14

# keys that separate the random streams: SeedSequence([seed, key, ...])
_KEY_BPERP, _KEY_FIELD, _KEY_APS, _KEY_TILE_STATIC, _KEY_TILE_EPOCH = 1, 2, 3, 4, 5

_DIMS2 = ("azimuth", "range")
_DIMS3 = ("azimuth", "range", "time")


# ----------------------------------------------------------------------------------------------
# The scene: every global (not per-tile) quantity, small 1-D arrays only
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Scene:
    shape: tuple[int, int]
    n_epochs: int
    seed: int
    ps_fraction: float
    wavelength: float
    mother_index: int
    height_error_std: float
    ps_noise_std: float
    time: np.ndarray            # (T,) datetime64[ns]
    years: np.ndarray           # (T,) years since the first epoch
    seasonal_sine: np.ndarray   # (T,) sin(2 pi years)
    bperp: np.ndarray           # (T,) float32, zero at the mother
    h2ph_factor: np.ndarray     # (N_rg,) 1 / (R sin(theta)) per range pixel
    slant_range: np.ndarray     # (N_rg,) m
    incidence: np.ndarray       # (N_rg,) radians
    bowl_az: np.ndarray         # (N_az,) separable Gaussian bowl, 0..1
    bowl_rg: np.ndarray         # (N_rg,)
    bowl_depth: float           # m/yr (negative: subsidence)
    trend_az: np.ndarray        # (N_az,) m/yr
    trend_rg: np.ndarray        # (N_rg,) m/yr
    seasonal_amplitude: float   # m, at the bowl centre
    aps_k_az: np.ndarray        # (T, K) rad/m
    aps_k_rg: np.ndarray        # (T, K) rad/m
    aps_phase: np.ndarray       # (T, K) rad, phase of each mode
    aps_amplitude: np.ndarray   # (T,) amplitude of each mode, zero at the mother
    token: str

    @property
    def m2ph(self) -> float:
        return phase_per_metre(self.wavelength)


def _check_arguments(*, shape, n_epochs, seed, ps_fraction, wavelength, revisit_days,
                     mother_index, stds: dict[str, float]) -> tuple[tuple[int, int], int]:
    if (not isinstance(shape, (tuple, list)) or len(shape) != 2
            or not all(isinstance(n, (int, np.integer)) and n > 0 for n in shape)):
        raise ValueError(f"shape: expected two positive integers (n_azimuth, n_range), "
                         f"found {shape!r}")
    if not isinstance(n_epochs, (int, np.integer)) or n_epochs < 2:
        raise ValueError(f"n_epochs: expected an integer >= 2, found {n_epochs!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, found {seed!r}")
    if not 0.0 <= ps_fraction <= 1.0:
        raise ValueError(f"ps_fraction: expected a fraction in [0, 1], found {ps_fraction!r}")
    if not 1e-3 < wavelength < 1.0:
        raise ValueError(f"wavelength: expected a radar wavelength in metres (0.001 .. 1), "
                         f"found {wavelength!r}")
    if not revisit_days > 0:
        raise ValueError(f"revisit_days: expected a positive number of days, "
                         f"found {revisit_days!r}")
    mother = n_epochs // 2 if mother_index is None else mother_index
    if not isinstance(mother, (int, np.integer)) or not 0 <= mother < n_epochs:
        raise ValueError(f"mother_index: expected an epoch index in [0, {n_epochs - 1}], "
                         f"found {mother_index!r}")
    for name, value in stds.items():
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{name}: expected a finite non-negative number, found {value!r}")
    return (int(shape[0]), int(shape[1])), int(mother)


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) for k in keys]))


def _range_geometry(n_rg: int) -> tuple[np.ndarray, np.ndarray]:
    """Slant range (m) and incidence angle (rad) per range pixel, flat Earth."""
    theta_c = np.deg2rad(INCIDENCE_CENTRE_DEG)
    height = SLANT_RANGE_CENTRE * np.cos(theta_c)
    ground = SLANT_RANGE_CENTRE * np.sin(theta_c) + (
        np.arange(n_rg) - (n_rg - 1) / 2.0) * PIXEL_SPACING[1]
    return np.hypot(height, ground), np.arctan2(ground, height)


def _velocity_shape(shape: tuple[int, int], seed: int, velocity_max: float):
    """Separable Gaussian bowl and linear trend, parameters drawn from the global stream."""
    rng = _rng(seed, _KEY_FIELD)
    centre = rng.uniform(0.3, 0.7, 2) * np.asarray(shape)
    sigma = rng.uniform(0.1, 0.2) * min(shape)
    direction = rng.uniform(0.0, 2.0 * np.pi)
    axes = [np.arange(n, dtype=np.float64) for n in shape]
    bowl = [np.exp(-0.5 * ((x - c) / sigma) ** 2) for x, c in zip(axes, centre)]
    # the trend spans +-(1 - BOWL_SHARE) * velocity_max across the scene
    trend_amplitude = (1.0 - BOWL_SHARE) * velocity_max / math.sqrt(2.0)
    trend = [trend_amplitude * w * (2.0 * x / max(n - 1, 1) - 1.0)
             for x, n, w in zip(axes, shape, (np.cos(direction), np.sin(direction)))]
    return bowl, trend


def _aps_modes(shape: tuple[int, int], n_epochs: int, seed: int, mother: int, aps_std: float):
    """Wave vectors and complex amplitudes of the random Fourier modes of each epoch's APS."""
    extent = max(shape[0] * PIXEL_SPACING[0], shape[1] * PIXEL_SPACING[1])
    k_min = 2.0 * np.pi / (2.0 * extent)
    k_max = np.pi / min(PIXEL_SPACING)
    # radial density P(k) * 2 pi k ~ k**(1 - exponent); sample by its inverse CDF
    power = 2.0 - APS_SPECTRAL_EXPONENT
    k_az, k_rg, phase = np.zeros((3, n_epochs, APS_MODES))
    for t in range(n_epochs):
        u, direction, phase[t] = _rng(seed, _KEY_APS, t).random((3, APS_MODES))
        k = (k_min**power + u * (k_max**power - k_min**power)) ** (1.0 / power)
        k_az[t] = k * np.cos(2.0 * np.pi * direction)
        k_rg[t] = k * np.sin(2.0 * np.pi * direction)
    amplitude = np.full(n_epochs, aps_std * math.sqrt(2.0 / APS_MODES))
    amplitude[mother] = 0.0
    return k_az, k_rg, 2.0 * np.pi * phase, amplitude


def _build_scene(*, shape, n_epochs, seed, ps_fraction, wavelength, start, revisit_days,
                 mother_index, velocity_max, seasonal_amplitude, height_error_std, aps_std,
                 ps_noise_std) -> _Scene:
    stds = {"velocity_max": velocity_max, "seasonal_amplitude": seasonal_amplitude,
            "height_error_std": height_error_std, "aps_std": aps_std,
            "ps_noise_std": ps_noise_std}
    shape, mother = _check_arguments(shape=shape, n_epochs=n_epochs, seed=seed,
                                     ps_fraction=ps_fraction, wavelength=wavelength,
                                     revisit_days=revisit_days, mother_index=mother_index,
                                     stds=stds)
    try:
        first = np.datetime64(start, "ns")
    except ValueError as err:
        raise ValueError(f"start: expected an ISO date such as '2020-01-01', found {start!r}"
                         ) from err
    step = np.timedelta64(round(float(revisit_days) * 86400), "s")
    time = (first + np.arange(n_epochs) * step).astype("datetime64[ns]")
    years = years_since(time, time[0])  # displacement is zero at the first epoch

    bperp = _rng(seed, _KEY_BPERP).normal(0.0, BPERP_STD, n_epochs)
    bperp[mother] = 0.0
    bperp = bperp.astype(np.float32)
    slant_range, incidence = _range_geometry(shape[1])
    bowl, trend = _velocity_shape(shape, seed, velocity_max)
    k_az, k_rg, aps_phase, aps_amplitude = _aps_modes(shape, n_epochs, seed, mother, aps_std)
    token = dask.base.tokenize(shape, n_epochs, seed, ps_fraction, wavelength, str(first),
                               revisit_days, mother, sorted(stds.items()), TILE_SIZE,
                               APS_MODES)
    return _Scene(
        shape=shape, n_epochs=int(n_epochs), seed=int(seed), ps_fraction=float(ps_fraction),
        wavelength=float(wavelength), mother_index=mother,
        height_error_std=float(height_error_std), ps_noise_std=float(ps_noise_std),
        time=time, years=years, seasonal_sine=np.sin(2.0 * np.pi * years), bperp=bperp,
        h2ph_factor=1.0 / (slant_range * np.sin(incidence)), slant_range=slant_range,
        incidence=incidence, bowl_az=bowl[0], bowl_rg=bowl[1],
        bowl_depth=-BOWL_SHARE * float(velocity_max), trend_az=trend[0], trend_rg=trend[1],
        seasonal_amplitude=float(seasonal_amplitude), aps_k_az=k_az, aps_k_rg=k_rg,
        aps_phase=aps_phase, aps_amplitude=aps_amplitude, token=token)


# ----------------------------------------------------------------------------------------------
# Deterministic fields: elementwise from 1-D arrays, so identical whatever the block
# ----------------------------------------------------------------------------------------------

def _velocity(scene: _Scene, az: slice, rg: slice) -> np.ndarray:
    bowl = scene.bowl_az[az, None] * scene.bowl_rg[None, rg]
    return scene.bowl_depth * bowl + scene.trend_az[az, None] + scene.trend_rg[None, rg]


def _seasonal(scene: _Scene, az: slice, rg: slice) -> np.ndarray:
    return scene.seasonal_amplitude * (scene.bowl_az[az, None] * scene.bowl_rg[None, rg])


def _displacement(velocity: np.ndarray, seasonal: np.ndarray, scene: _Scene) -> np.ndarray:
    """Displacement (m, float64), time on the last axis, zero at the first epoch."""
    return (velocity[..., None] * scene.years
            + seasonal[..., None] * scene.seasonal_sine)


def _h2ph(scene: _Scene, rg: slice) -> np.ndarray:
    """h2ph (float32, (range, time)): B_perp / (R sin(theta))."""
    return (scene.h2ph_factor[rg, None] * scene.bperp.astype(np.float64)).astype(np.float32)


def _latlon(scene: _Scene, az: slice, rg: slice) -> tuple[np.ndarray, np.ndarray]:
    """WGS84 latitude, longitude (degrees) of pixels, local tangent plane at the centre."""
    lat0, lon0 = SCENE_CENTRE
    heading = np.deg2rad(HEADING_DEG)
    sin_lat = np.sin(np.deg2rad(lat0))
    meridian = _WGS84_A * (1 - _WGS84_E2) / (1 - _WGS84_E2 * sin_lat**2) ** 1.5
    normal = _WGS84_A / math.sqrt(1 - _WGS84_E2 * sin_lat**2)
    along = (np.arange(az.start, az.stop) - (scene.shape[0] - 1) / 2.0) * PIXEL_SPACING[0]
    across = (np.arange(rg.start, rg.stop) - (scene.shape[1] - 1) / 2.0) * PIXEL_SPACING[1]
    north = along[:, None] * np.cos(heading) - across[None, :] * np.sin(heading)
    east = along[:, None] * np.sin(heading) + across[None, :] * np.cos(heading)
    lat = lat0 + np.rad2deg(north / meridian)
    lon = lon0 + np.rad2deg(east / (normal * np.cos(np.deg2rad(lat0))))
    return lat, lon


# ----------------------------------------------------------------------------------------------
# Random fields: computed per fixed tile, always whole
# ----------------------------------------------------------------------------------------------

def _tile_bounds(scene: _Scene, ti: int, tj: int) -> tuple[slice, slice]:
    return (slice(ti * TILE_SIZE, min((ti + 1) * TILE_SIZE, scene.shape[0])),
            slice(tj * TILE_SIZE, min((tj + 1) * TILE_SIZE, scene.shape[1])))


def _tile_static(scene: _Scene, ti: int, tj: int) -> dict[str, np.ndarray]:
    """Time-constant draws of a whole tile (TILE_SIZE x TILE_SIZE, not cropped to the scene)."""
    rng = _rng(scene.seed, _KEY_TILE_STATIC, ti, tj)
    full = (TILE_SIZE, TILE_SIZE)
    ps_mask = rng.random(full) < scene.ps_fraction
    scatterer_phase = rng.uniform(-np.pi, np.pi, full)
    height_error = np.where(ps_mask, rng.standard_normal(full) * scene.height_error_std, 0.0)
    gain = 10.0 ** rng.uniform(*np.log10(PS_AMPLITUDE_GAIN), full)
    nad = rng.uniform(*PS_NAD_RANGE, full)
    return {"ps_mask": ps_mask, "scatterer_phase": scatterer_phase,
            "height_error": height_error, "ps_amplitude": DS_RMS_AMPLITUDE * gain,
            "amplitude_dispersion": np.where(ps_mask, nad, RAYLEIGH_NAD)}


def _tile_aps(scene: _Scene, ti: int, tj: int, t: int) -> np.ndarray:
    """APS (float32, radians) of epoch ``t`` on the tile's part of the scene."""
    az, rg = _tile_bounds(scene, ti, tj)
    if scene.aps_amplitude[t] == 0:
        return np.zeros((az.stop - az.start, rg.stop - rg.start), dtype=np.float32)
    # sum_k a cos(k_az y + k_rg x + phi_k), separated into one matrix product per tile
    along = (np.outer(np.arange(az.start, az.stop) * PIXEL_SPACING[0], scene.aps_k_az[t])
             + scene.aps_phase[t])
    across = np.outer(np.arange(rg.start, rg.stop) * PIXEL_SPACING[1], scene.aps_k_rg[t])
    left = np.concatenate([np.cos(along), -np.sin(along)], axis=1) * scene.aps_amplitude[t]
    right = np.concatenate([np.cos(across), np.sin(across)], axis=1)
    # einsum, not a BLAS product: BLAS threads oversubscribe the cores next to Dask's threads
    return np.einsum("ik,jk->ij", left.astype(np.float32), right.astype(np.float32))


def _tile_aps_all(scene: _Scene, ti: int, tj: int) -> np.ndarray:
    return np.stack([_tile_aps(scene, ti, tj, t) for t in range(scene.n_epochs)], axis=-1)


def _tile_truth(scene: _Scene, ti: int, tj: int, name: str) -> np.ndarray:
    az, rg = _tile_bounds(scene, ti, tj)
    return _tile_static(scene, ti, tj)[name][: az.stop - az.start, : rg.stop - rg.start]


def _tile_complex(scene: _Scene, ti: int, tj: int) -> np.ndarray:
    """Complex SLC values (complex64, (az, rg, time)) of the tile's part of the scene."""
    az, rg = _tile_bounds(scene, ti, tj)
    n_az, n_rg = az.stop - az.start, rg.stop - rg.start
    static = _tile_static(scene, ti, tj)
    ps_az, ps_rg = np.nonzero(static["ps_mask"])       # PS of the whole tile: fixed draw sizes
    inside = (ps_az < n_az) & (ps_rg < n_rg)
    ia, ir = ps_az[inside], ps_rg[inside]
    mean_amplitude = static["ps_amplitude"][ia, ir]
    nad = static["amplitude_dispersion"][ia, ir]
    height_error = static["height_error"][ia, ir]
    displacement = _displacement(_velocity(scene, az, rg)[ia, ir],
                                 _seasonal(scene, az, rg)[ia, ir], scene)
    h2ph = _h2ph(scene, rg)[ir].astype(np.float64)
    model = scene.m2ph * (displacement + h2ph * height_error[:, None])
    base_phase = static["scatterer_phase"][ia, ir]

    out = np.empty((n_az, n_rg, scene.n_epochs), dtype=np.complex64)
    ds_scale = np.float32(DS_RMS_AMPLITUDE / math.sqrt(2.0))
    for t in range(scene.n_epochs):
        rng = _rng(scene.seed, _KEY_TILE_EPOCH, ti, tj, t)
        ds = rng.standard_normal((2, TILE_SIZE, TILE_SIZE), dtype=np.float32)[:, :n_az, :n_rg]
        amplitude_noise, phase_noise = rng.standard_normal((2, ps_az.size))[:, inside]
        out[:, :, t] = ds_scale * ds[0] + 1j * (ds_scale * ds[1])
        aps = _tile_aps(scene, ti, tj, t)[ia, ir]
        phase = base_phase + model[:, t] + aps + scene.ps_noise_std * phase_noise
        amplitude = mean_amplitude * np.abs(1.0 + nad * amplitude_noise)
        out[ia, ir, t] = amplitude * np.exp(1j * phase)
    return out


_TILE_FUNCTIONS = {
    "complex": _tile_complex,
    "aps": _tile_aps_all,
    "ps_mask": partial(_tile_truth, name="ps_mask"),
    "height_error": partial(_tile_truth, name="height_error"),
    "amplitude_dispersion": partial(_tile_truth, name="amplitude_dispersion"),
}


def _from_tiles(scene: _Scene, variable: str, az: slice, rg: slice, dtype) -> np.ndarray:
    """Assemble a region from the whole tiles that overlap it."""
    trailing = (scene.n_epochs,) if variable in ("complex", "aps") else ()
    out = np.empty((az.stop - az.start, rg.stop - rg.start, *trailing), dtype=dtype)
    tile_fn = _TILE_FUNCTIONS[variable]
    for ti in range(az.start // TILE_SIZE, (az.stop - 1) // TILE_SIZE + 1):
        for tj in range(rg.start // TILE_SIZE, (rg.stop - 1) // TILE_SIZE + 1):
            tile_az, tile_rg = _tile_bounds(scene, ti, tj)
            a0, a1 = max(az.start, tile_az.start), min(az.stop, tile_az.stop)
            r0, r1 = max(rg.start, tile_rg.start), min(rg.stop, tile_rg.stop)
            values = tile_fn(scene, ti, tj)
            out[a0 - az.start:a1 - az.start, r0 - rg.start:r1 - rg.start] = values[
                a0 - tile_az.start:a1 - tile_az.start, r0 - tile_rg.start:r1 - tile_rg.start]
    return out


def _region(scene: _Scene, variable: str, az: slice, rg: slice, dtype) -> np.ndarray:
    """Values of one variable on one region of the scene (what a Dask block computes)."""
    if variable in _TILE_FUNCTIONS:
        return _from_tiles(scene, variable, az, rg, dtype)
    if variable == "h2ph":
        h2ph = _h2ph(scene, rg)
        return np.ascontiguousarray(np.broadcast_to(h2ph, (az.stop - az.start, *h2ph.shape)))
    if variable == "velocity":
        return _velocity(scene, az, rg).astype(dtype)
    if variable == "seasonal_amplitude":
        return _seasonal(scene, az, rg).astype(dtype)
    if variable == "displacement":
        return _displacement(_velocity(scene, az, rg), _seasonal(scene, az, rg),
                             scene).astype(dtype)
    if variable in ("lat", "lon"):
        return _latlon(scene, az, rg)[variable == "lon"]
    raise KeyError(f"variable: expected one of the simulated variables, found {variable!r}")


def _block(scene: _Scene, variable: str, dtype, block_info=None) -> np.ndarray:
    (a0, a1), (r0, r1) = block_info[None]["array-location"][:2]
    return _region(scene, variable, slice(a0, a1), slice(r0, r1), dtype)


def _lazy(scene: _Scene, variable: str, chunks2d: tuple[int, int], dtype,
          with_time: bool) -> da.Array:
    shape = scene.shape + ((scene.n_epochs,) if with_time else ())
    chunks = da.core.normalize_chunks(chunks2d + ((scene.n_epochs,) if with_time else ()),
                                      shape=shape)
    return da.map_blocks(partial(_block, scene, variable, np.dtype(dtype)), chunks=chunks,
                         dtype=dtype, meta=np.empty((0,) * len(shape), dtype=dtype),
                         name=f"simulate-{variable}-{dask.base.tokenize(scene.token, chunks)}")


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def _normalize_chunks(chunks, shape: tuple[int, int], n_epochs: int) -> tuple[int, int]:
    if isinstance(chunks, str):
        if chunks != "auto":
            raise ValueError(f"chunks: expected 'auto', an int, (n_azimuth, n_range) or a dict "
                             f"with 'azimuth' and 'range', found {chunks!r}")
        tiles = max(1, int(math.sqrt(CHUNK_BYTES / (8 * n_epochs)) // TILE_SIZE))
        edge = tiles * TILE_SIZE
        return min(edge, shape[0]), min(edge, shape[1])
    if isinstance(chunks, (int, np.integer)):
        pair = (chunks, chunks)
    elif isinstance(chunks, dict):
        pair = (chunks.get("azimuth", -1), chunks.get("range", -1))
    elif isinstance(chunks, (tuple, list)) and len(chunks) in (2, 3):
        pair = tuple(chunks[:2])
    else:
        raise ValueError(f"chunks: expected 'auto', an int, (n_azimuth, n_range) or a dict with "
                         f"'azimuth' and 'range', found {chunks!r}")
    out = []
    for name, value, n in zip(_DIMS2, pair, shape):
        if value in (-1, None):
            value = n
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"chunks: expected a positive chunk size for {name!r}, "
                             f"found {value!r}")
        out.append(min(int(value), n))
    return out[0], out[1]


def simulate_stack(
    *,
    shape: tuple[int, int] = (200, 200),
    n_epochs: int = 30,
    seed: int = 0,
    ps_fraction: float = 0.02,
    wavelength: float = 0.0556,
    start: str | np.datetime64 = "2020-01-01",
    revisit_days: float = 12,
    mother_index: int | None = None,
    velocity_max: float = 0.02,
    seasonal_amplitude: float = 0.0,
    height_error_std: float = 5.0,
    aps_std: float = 1.0,
    ps_noise_std: float = 0.3,
    chunks: str | int | tuple[int, int] | dict[str, int] = "auto",
) -> tuple[xr.Dataset, xr.Dataset]:
    """Simulate a lazy SLC stack of persistent and distributed scatterers with known truth.

    Values depend only on the arguments other than ``chunks``: randomness is drawn per fixed
    tile of ``TILE_SIZE`` pixels, so any chunking gives identical values.

    Parameters
    ----------
    shape
        Scene size ``(n_azimuth, n_range)`` in pixels (``PIXEL_SPACING`` metres on the ground).
    n_epochs
        Number of acquisitions, dated ``start + k * revisit_days``.
    seed
        Non-negative integer; the same seed gives the same stack.
    ps_fraction
        Probability that a pixel is a persistent scatterer.
    wavelength
        Radar wavelength (m).
    start, revisit_days
        Date of the first epoch and the days between epochs.
    mother_index
        Index of the mother epoch (``n_epochs // 2`` when None): its ``bperp``, ``h2ph`` and APS
        are zero.
    velocity_max
        Largest line-of-sight rate (m/yr): a Gaussian subsidence bowl of depth
        ``BOWL_SHARE * velocity_max`` plus a linear trend spanning the rest.
    seasonal_amplitude
        Amplitude (m) of an annual ``sin(2 pi tau)`` term at the bowl centre, scaled by the
        bowl's shape elsewhere.
    height_error_std
        Standard deviation (m) of the PS height errors.
    aps_std
        Standard deviation (rad) of each epoch's atmospheric phase screen (power-law spectrum,
        see ``APS_MODES``); the screen within a small scene varies less than this.
    ps_noise_std
        Standard deviation (rad) of the PS phase noise per SLC epoch.
    chunks
        Dask chunks in azimuth and range (time is one chunk): ``"auto"`` (tile multiples of
        about ``CHUNK_BYTES`` of ``complex`` per chunk), an int, ``(n_azimuth, n_range)`` or a
        dict with keys ``azimuth`` and ``range``.

    Returns
    -------
    stack : xarray.Dataset
        Dims ``(azimuth, range, time)``, Dask-backed: ``complex`` (complex64) and ``h2ph``
        (float32). Coordinates ``azimuth``, ``range`` (int64), ``time`` (datetime64[ns]),
        ``lat``, ``lon`` (float64, WGS84 degrees, per pixel) and ``bperp`` (float32, m, per
        epoch). Attributes ``wavelength``, ``mother_time`` (ISO), ``seed``, ``history``.
    truth : xarray.Dataset
        Same coordinates and attributes (plus ``phase_model``): ``ps_mask`` (bool),
        ``velocity`` (m/yr, every pixel), ``seasonal_amplitude`` (m), ``height_error`` (m, zero
        off PS), ``amplitude_dispersion`` (expected NAD: per-PS value, ``RAYLEIGH_NAD``
        elsewhere), ``aps`` (rad, zero at the mother) and ``displacement`` (m, zero at the
        first epoch), the last two per epoch.

    Raises
    ------
    ValueError
        When an argument is out of range; the message names it.

    Examples
    --------
    >>> stack, truth = simulate_stack(shape=(32, 40), n_epochs=5, seed=1)
    >>> stack["complex"].shape, str(stack["complex"].dtype)
    ((32, 40, 5), 'complex64')
    >>> float(abs(stack["h2ph"].isel(time=2)).max())  # the mother epoch
    0.0
    """
    scene = _build_scene(shape=shape, n_epochs=n_epochs, seed=seed, ps_fraction=ps_fraction,
                         wavelength=wavelength, start=start, revisit_days=revisit_days,
                         mother_index=mother_index, velocity_max=velocity_max,
                         seasonal_amplitude=seasonal_amplitude,
                         height_error_std=height_error_std, aps_std=aps_std,
                         ps_noise_std=ps_noise_std)
    chunks2d = _normalize_chunks(chunks, scene.shape, scene.n_epochs)
    logger.info(
        "simulating a %d x %d x %d stack (seed %d, mother %s): ~%d PS, velocity up to %.3g "
        "m/yr, height error std %.3g m, APS std %.3g rad, PS noise std %.3g rad, chunks %s",
        *scene.shape, scene.n_epochs, scene.seed,
        np.datetime_as_string(scene.time[scene.mother_index], unit="D"),
        round(scene.ps_fraction * scene.shape[0] * scene.shape[1]), velocity_max,
        height_error_std, aps_std, ps_noise_std, chunks2d)

    def lazy(variable, dtype, with_time=True):
        return _lazy(scene, variable, chunks2d, dtype, with_time)

    mother_time = np.datetime_as_string(scene.time[scene.mother_index], unit="s")
    args = (f"shape={scene.shape}, n_epochs={scene.n_epochs}, seed={scene.seed}, "
            f"ps_fraction={ps_fraction}, wavelength={wavelength}, start={str(start)!r}, "
            f"revisit_days={revisit_days}, mother_index={scene.mother_index}, "
            f"velocity_max={velocity_max}, seasonal_amplitude={seasonal_amplitude}, "
            f"height_error_std={height_error_std}, aps_std={aps_std}, "
            f"ps_noise_std={ps_noise_std}")
    attrs = {"wavelength": scene.wavelength, "mother_time": mother_time, "seed": scene.seed,
             "azimuth_spacing": PIXEL_SPACING[0], "range_spacing": PIXEL_SPACING[1],
             "history": f"depsi.simulate.simulate_stack({args})"}
    coords = {
        "azimuth": ("azimuth", np.arange(scene.shape[0], dtype=np.int64)),
        "range": ("range", np.arange(scene.shape[1], dtype=np.int64)),
        "time": ("time", scene.time),
        "lat": (_DIMS2, lazy("lat", np.float64, False), {"units": "degrees_north"}),
        "lon": (_DIMS2, lazy("lon", np.float64, False), {"units": "degrees_east"}),
        "bperp": ("time", scene.bperp, {"units": "m",
                                        "long_name": "perpendicular baseline to the mother"}),
    }
    stack = xr.Dataset(
        {"complex": (_DIMS3, lazy("complex", np.complex64)),
         "h2ph": (_DIMS3, lazy("h2ph", np.float32),
                  {"units": "1", "long_name": "B_perp / (R sin(theta))"})},
        coords=coords, attrs=attrs)
    truth = xr.Dataset(
        {"ps_mask": (_DIMS2, lazy("ps_mask", bool, False)),
         "velocity": (_DIMS2, lazy("velocity", np.float32, False), {"units": "m/yr"}),
         "seasonal_amplitude": (_DIMS2, lazy("seasonal_amplitude", np.float32, False),
                                {"units": "m"}),
         "height_error": (_DIMS2, lazy("height_error", np.float32, False), {"units": "m"}),
         "amplitude_dispersion": (_DIMS2, lazy("amplitude_dispersion", np.float32, False),
                                  {"units": "1"}),
         "aps": (_DIMS3, lazy("aps", np.float32), {"units": "rad"}),
         "displacement": (_DIMS3, lazy("displacement", np.float32), {"units": "m"})},
        coords=coords,
        attrs={**attrs, "phase_model": (
            "slc_phase = scatterer_phase + m2ph * (displacement + h2ph * height_error) + aps "
            "+ noise, m2ph = -4 pi / wavelength, noise ~ N(0, ps_noise_std) per epoch on PS; "
            "distributed scatterers are circular Gaussian, independent per epoch"),
            "ps_noise_std": scene.ps_noise_std})
    return stack, truth


# ----------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------

def _refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"path '{path}' already exists; pass overwrite=True to replace it")


def _move_into_place(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``path``; an old ``path`` goes only once ``tmp`` is done."""
    from depsi.io.store import move_into_place

    _refuse_existing(path, overwrite)
    move_into_place(tmp, path)


def _azimuth_blocks(ds: xr.Dataset) -> list[slice]:
    bounds = np.cumsum((0, *ds.chunks["azimuth"]))
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _spatial_part(ds: xr.Dataset, rows: slice) -> xr.Dataset:
    part = ds.isel(azimuth=rows)
    return part.drop_vars([n for n in part.variables if "azimuth" not in part[n].dims])


def write_stack_zarr(path: str | os.PathLike, *, overwrite: bool = False,
                     progress: bool = True, **simulate_kwargs: Any) -> Path:
    """Simulate a stack and write it to a Zarr v3 store, block by block, in bounded memory.

    The stack goes to the root group of ``path`` and the truth to its group ``"truth"``
    (``xr.open_zarr(path)``, ``xr.open_zarr(path, group="truth")``), chunked like the Dask
    arrays, with time in one chunk. The store is written to a hidden sibling
    ``.<name>.tmp-<id>`` and renamed into place when complete, so ``path`` never holds a
    half-written store. Metadata are consolidated.

    Parameters
    ----------
    path
        The store to create.
    overwrite
        Replace an existing ``path`` (only after the new store is complete).
    progress
        Show a tqdm progress bar over the rows of blocks.
    **simulate_kwargs
        Keyword arguments of :func:`simulate_stack` (``chunks`` sets the Zarr chunks, and with
        them the memory used: about two chunks per thread).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    FileExistsError
        When ``path`` exists and ``overwrite`` is False.

    Examples
    --------
    >>> import tempfile, pathlib, xarray as xr
    >>> store = pathlib.Path(tempfile.mkdtemp()) / "stack.zarr"
    >>> _ = write_stack_zarr(store, shape=(16, 16), n_epochs=4, progress=False)
    >>> xr.open_zarr(store)["complex"].shape, xr.open_zarr(store, group="truth")["aps"].dtype
    ((16, 16, 4), dtype('float32'))
    """
    path = Path(path)
    _refuse_existing(path, overwrite)
    stack, truth = simulate_stack(**simulate_kwargs)
    tmp = temporary_sibling(path, TEMPORARY)
    logger.info("writing simulated stack %s (%.3g GB complex) via %s", path,
                stack["complex"].nbytes / 1e9, tmp)
    try:
        groups = ((stack, None), (truth, "truth"))
        for ds, group in groups:
            ds.to_zarr(tmp, group=group, mode="w", compute=False, zarr_format=3,
                       consolidated=False)
        rows = _azimuth_blocks(stack)
        for block in tqdm(rows, desc=f"writing {path.name}", unit="block row",
                          disable=not progress):
            for ds, group in groups:
                _spatial_part(ds, block).to_zarr(tmp, group=group, region={"azimuth": block},
                                                 zarr_format=3, consolidated=False)
        with warnings.catch_warnings():
            # zarr 3 warns that consolidated metadata is not yet part of the v3 spec
            warnings.filterwarnings("ignore", message="Consolidated metadata",
                                    category=UserWarning)
            zarr.consolidate_metadata(str(tmp))
        _move_into_place(tmp, path, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %s", path)
    return path


# --- DORIS v5 like result files (their layout helpers are depsi.io.doris's) ------------------

def _ecef(lat_deg: float, lon_deg: float, height: float) -> np.ndarray:
    lat, lon = np.deg2rad(lat_deg), np.deg2rad(lon_deg)
    normal = _WGS84_A / math.sqrt(1 - _WGS84_E2 * math.sin(lat) ** 2)
    return np.array([(normal + height) * math.cos(lat) * math.cos(lon),
                     (normal + height) * math.cos(lat) * math.sin(lon),
                     (normal * (1 - _WGS84_E2) + height) * math.sin(lat)])


def _orbit_geometry() -> dict[str, Any]:
    """Satellite position, flight and baseline directions at the scene centre time (ECEF)."""
    lat, lon = np.deg2rad(SCENE_CENTRE)
    east = np.array([-math.sin(lon), math.cos(lon), 0.0])
    north = np.array([-math.sin(lat) * math.cos(lon), -math.sin(lat) * math.sin(lon),
                      math.cos(lat)])
    up = np.cross(east, north)
    heading = np.deg2rad(HEADING_DEG)
    flight = math.sin(heading) * east + math.cos(heading) * north
    look = math.cos(heading) * east - math.sin(heading) * north      # right of the track
    theta = np.deg2rad(INCIDENCE_CENTRE_DEG)
    centre = _ecef(*SCENE_CENTRE, 0.0)
    satellite = (centre - SLANT_RANGE_CENTRE * math.sin(theta) * look
                 + SLANT_RANGE_CENTRE * math.cos(theta) * up)
    radius = float(np.linalg.norm(satellite))
    radial = satellite / radius
    along = flight - flight @ radial * radial
    along /= np.linalg.norm(along)
    line_of_sight = (centre - satellite) / SLANT_RANGE_CENTRE
    perpendicular = np.cross(along, line_of_sight)
    perpendicular *= np.sign(perpendicular @ radial) / np.linalg.norm(perpendicular)
    return {"radius": radius, "radial": radial, "along": along, "look": look, "up": up,
            "perpendicular": perpendicular, "omega": math.sqrt(_GM / radius**3)}


def _orbit_lines(bperp: float, centre_second: float) -> list[str]:
    """200 state vectors, 1 s apart, of a circular orbit shifted by ``bperp`` across track."""
    geometry = _orbit_geometry()
    seconds = np.floor(centre_second) - 100 + np.arange(200)
    angle = geometry["omega"] * (seconds - centre_second)
    positions = geometry["radius"] * (np.cos(angle)[:, None] * geometry["radial"]
                                      + np.sin(angle)[:, None] * geometry["along"])
    # depsi's h2ph = -B_perp / (R sin(theta)): a positive simulated h2ph is a secondary below
    # the mother's line of sight (as in simulated_geometry)
    positions -= bperp * geometry["perpendicular"]
    lines = [" t(s)    X(m)                 Y(m)                  Z(m)                ",
             "NUMBER_OF_DATAPOINTS:       200"]
    lines += [f" {int(s)}   {x:<20.9f} {y:<21.9f} {z:<20.9f}"
              for s, (x, y, z) in zip(seconds, positions)]
    return lines


def _res_text(scene_info: dict[str, Any], t: int) -> str:
    """A DORIS v5 like ``master.res`` / ``slave_YYYYMMDD.res`` for epoch ``t``."""
    info = scene_info
    n_az, n_rg = info["shape"]
    is_mother = t == info["mother_index"]
    date = info["time"][t]
    first_time = date + np.timedelta64(int(ACQUISITION_SECOND_OF_DAY * 1e6), "us")
    interval = PIXEL_SPACING[0] / GROUND_SPEED
    centre_offset = np.timedelta64(int(round(n_az / 2 * interval * 1e6)), "us")
    slant_spacing = PIXEL_SPACING[1] * math.sin(np.deg2rad(INCIDENCE_CENTRE_DEG))
    sampling_rate = SPEED_OF_LIGHT / (2.0 * slant_spacing)
    near_time = 2.0 * info["slant_range"][0] / SPEED_OF_LIGHT
    centre_time = 2.0 * SLANT_RANGE_CENTRE / SPEED_OF_LIGHT
    days = int((date - info["time"][0]) / np.timedelta64(1, "D"))
    lat, lon = info["lat"], info["lon"]
    corners = {"ul": (0, 0), "ur": (0, -1), "lr": (-1, -1), "ll": (-1, 0)}
    data_file = info["slc_files"][t].name
    kind = "MASTER" if is_mother else "SLAVE"

    lines = ["=" * 47, f"{kind + ' RESULTFILE:':<40}",
             *_fields([("Created by", f"depsi.simulate (synthetic stack, seed {info['seed']})"),
                       ("DVersion", "Version (2015) (For TOPSAR)"),
                       ("FFTW library", "used"), ("VECLIB library", "not used"),
                       ("LAPACK library", "not used"), ("Compiled at", "XXXXXXXX"),
                       ("By GUN gcc", "XXXXXXXX")], 40),
             "=" * 47, "", "", ""]
    lines += _process_control({"readfiles": 1, "precise_orbits": 1, "crop": 1,
                               "sim_amplitude": 0, "master_timing": 0, "oversample": 0,
                               "resample": 0 if is_mother else 1, "filt_azi": 0,
                               "filt_range": 0, "NOT_USED": 0})
    readfiles = [
        ("Volume_file", "dummy"), ("Volume_ID", str(info["seed"])),
        ("Volume_identifier", "dummy"), ("Volume_set_identifier", "dummy"),
        ("Number of records in ref. file", "dummy"), ("SAR_PROCESSOR", "Sentinel-1A"),
        ("SWATH", "IW2"), ("PASS", "Ascending"), ("IMAGE_MODE", "IW"), ("polarisation", "VV"),
        ("Product type specifier", "S1A"),
        ("Logical volume generating facility", "depsi.simulate"),
        ("Location and date/time of product creation", "simulated"),
        ("Number_of_lines_Swath", n_az), ("number_of_pixels_Swath", n_rg),
        ("rangePixelSpacing", f"{slant_spacing:.6e}"),
        ("azimuthPixelSpacing", f"{PIXEL_SPACING[0]:.6e}"),
        ("total_Burst", 1), ("Burst_number_index", 1),
        ("RADAR_FREQUENCY (HZ)", f"{SPEED_OF_LIGHT / info['wavelength']:.15e}"),
        ("Scene identification", f"Orbit: {30000 + round(days * 175 / 12)}"),
        ("Scene location", f"lat: {SCENE_CENTRE[0]:.15e} lon:{SCENE_CENTRE[1]:.15e}"),
        ("Sensor platform mission identifer", "S1A"),
        ("Scene_center_heading", f"{HEADING_DEG:.15e}"),
        ("Scene_centre_latitude", repr(float(SCENE_CENTRE[0]))),
        ("Scene_centre_longitude", repr(float(SCENE_CENTRE[1]))),
        ("Radar_wavelength (m)", f"{info['wavelength']:.9f}"),
        ("Azimuth_steering_rate (deg/s)", "1.397440818000000e+00"),
        ("Pulse_Repetition_Frequency_raw_data(TOPSAR)", "1.685817302492702e+03"),
        ("First_pixel_azimuth_time (UTC)", _doris_time(first_time)),
        ("Pulse_Repetition_Frequency (computed, Hz)", f"{1.0 / interval:.15e}"),
        ("Azimuth_time_interval (s)", f"{interval:.15e}"),
        ("Total_azimuth_band_width (Hz)", f"{0.65 / interval:.15e}"),
        ("Weighting_azimuth", "Hamming"),
        ("Range_time_to_first_pixel (2way) (ms)", f"{near_time * 1e3:.15f}"),
        ("Range_sampling_rate (computed, MHz)", f"{sampling_rate / 1e6:.9f}"),
        ("Total_range_band_width (MHz)", f"{0.85 * sampling_rate / 1e6:.9f}"),
        ("Weighting_range", "Hamming"),
        ("DC_reference_azimuth_time", _doris_time(first_time + centre_offset)),
        ("DC_reference_range_time", f"{centre_time:.15e}"),
        ("Xtrack_f_DC_constant (Hz, early edge)", "0.000000e+00"),
        ("Xtrack_f_DC_linear (Hz/s, early edge)", "0.000000e+00"),
        ("Xtrack_f_DC_quadratic (Hz/s/s, early edge)", "0.000000e+00"),
        ("FM_reference_azimuth_time", _doris_time(first_time + centre_offset)),
        ("FM_reference_range_time", f"{near_time:.15e}"),
        ("FM_polynomial_constant_coeff (Hz, early edge)", "-2.049174485762047e+03"),
        ("FM_polynomial_linear_coeff (Hz/s, early edge)", "3.542453933485016e+05"),
        ("FM_polynomial_quadratic_coeff (Hz/s/s, early edge)", "-5.439588256539609e+07"),
        ("Datafile", data_file), ("Dataformat", "complex_real4"),
        ("Number_of_lines_original", n_az), ("Number_of_pixels_original", n_rg),
        *((f"Scene_{c}_corner_latitude", repr(float(lat[i, j])))
          for c, (i, j) in corners.items()),
        *((f"Scene_{c}_corner_longitude", repr(float(lon[i, j])))
          for c, (i, j) in corners.items()),
        ("deramp", 0), ("reramp", 0), ("ESD_correct", 0),
        ("First_line (w.r.t. output_image)", 1), ("Last_line (w.r.t. output_image)", n_az),
        ("First_pixel (w.r.t. output_image)", 1), ("Last_pixel (w.r.t. output_image)", n_rg),
        ("Number_of_pixels_output_image", n_rg), ("Number_of_lines_output_image", n_az),
    ]
    lines += _section("readfiles", _fields(readfiles, 58))
    centre_second = ACQUISITION_SECOND_OF_DAY + n_az / 2 * interval
    lines += _section("precise_orbits", _orbit_lines(float(info["bperp"][t]), centre_second))
    lines += _section("crop", _fields([
        ("Data_output_file", data_file), ("Data_output_format", "complex_real4"),
        ("First_line (w.r.t. original_image)", 1), ("Last_line (w.r.t. original_image)", n_az),
        ("First_pixel (w.r.t. original_image)", 1),
        ("Last_pixel (w.r.t. original_image)", n_rg)], 43))
    if not is_mother:
        lines += _section("resample", _fields([
            ("Normalization_Lines", f"1 {n_az}"), ("Normalization_Pixels", f"1 {n_rg}"),
            ("Shifted azimuth spectrum", 0), ("Data_output_file", data_file),
            ("Data_output_format", "complex_real4"),
            ("Interpolation kernel", "12 point raised cosine kernel"),
            ("First_line (w.r.t. original_master)", 1),
            ("Last_line (w.r.t. original_master)", n_az),
            ("First_pixel (w.r.t. original_master)", 1),
            ("Last_pixel (w.r.t. original_master)", n_rg)], 44))
    return "\n".join(lines[:-3]) + "\n"


def _ifgs_text(scene_info: dict[str, Any], t: int) -> str:
    """A DORIS v5 like ``ifgs.res`` with the baseline (``coarse_orbits``) of epoch ``t``."""
    info = scene_info
    n_az, n_rg = info["shape"]
    bperp = float(info["bperp"][t])
    theta = INCIDENCE_CENTRE_DEG
    days = int((info["time"][t] - info["time"][info["mother_index"]]) / np.timedelta64(1, "D"))
    ground = SLANT_RANGE_CENTRE * math.sin(np.deg2rad(theta))
    height_ambiguity = (info["wavelength"] * ground / (2.0 * bperp)) if bperp else float("inf")

    def baseline(key, unit, value, comment):
        return f"{key:<15}{unit + ':':<10}{value:<15}// {comment}"

    geometry = _orbit_geometry()
    horizontal = bperp * float(geometry["perpendicular"] @ geometry["look"])
    vertical = bperp * float(geometry["perpendicular"] @ geometry["up"])
    alpha = math.degrees(math.atan2(vertical, horizontal)) if bperp else 0.0
    lines = ["=" * 53, f"{'INTERFEROGRAM RESULTFILE:':<40}{info['ifgs_files'][t].name}",
             f"{'Created by:':<40}depsi.simulate (synthetic stack, seed {info['seed']})",
             f"{'InSAR Processor:':<40}Doris (Delft o-o Radar Interferometric Software)",
             "", "", ""]
    lines += _process_control({"coarse_orbits": 1, "coarse_correl": 0, "fine_coreg": 0,
                               "timing_error": 0, "dem_assist": 0, "comp_coregpm": 0,
                               "interfero": 0, "coherence": 0, "comp_refphase": 0,
                               "subtr_refphase": 0, "comp_refdem": 0, "subtr_refdem": 0,
                               "filtphase": 0, "unwrap": 0, "est_orbits": 0, "slant2h": 0,
                               "geocoding": 0, "dinsar": 0, "NOT_USED2": 0})
    lines += _section("coarse_orbits", [
        f"{'Some info for pixel:':<45}{n_az // 2}, {n_rg // 2} (not used)",
        baseline("Btemp:", "[days]", days, "Temporal baseline"),
        baseline("Bperp", "[m]", f"{bperp:.1f}", "Perpendicular baseline"),
        baseline("Bpar", "[m]", "0.0", "Parallel baseline"),
        baseline("Bh", "[m]", f"{horizontal:.1f}", "Horizontal baseline"),
        baseline("Bv", "[m]", f"{vertical:.1f}", "Vertical baseline"),
        baseline("B", "[m]", f"{abs(bperp):.1f}", "Baseline (distance between sensors)"),
        baseline("alpha", "[deg]", f"{alpha:.1f}", "Baseline orientation"),
        baseline("theta", "[deg]", f"{theta:.1f}", "look angle"),
        baseline("inc_angle", "[deg]", f"{theta:.1f}", "incidence angle"),
        baseline("orbitconv", "[deg]", "0", "angle between orbits"),
        baseline("Height_amb", "[m]", f"{height_ambiguity:.1f}",
                 "height = h_amb*phase/2pi (approximately)"),
        f"Control point master (line,pixel,hei) =      ({n_az // 2}, {n_rg // 2}, 0)",
        f"Control point slave  (line,pixel,hei) =      ({n_az // 2}, {n_rg // 2}, 0)",
        "Estimated translation slave w.r.t. master (slave-master):",
        "Positive offsetL:                            slave image is to the bottom",
        "Positive offsetP:                            slave image is to the right",
        f"{'Coarse_orbits_translation_lines:':<45}0",
        f"{'Coarse_orbits_translation_pixels:':<45}0"])
    return "\n".join(lines[:-3]) + "\n"


def write_stack_binary(folder: str | os.PathLike, *, overwrite: bool = False,
                       progress: bool = True, **simulate_kwargs: Any) -> dict[str, Any]:
    """Simulate a stack and write it as raw per-epoch files with DORIS v5 like metadata.

    Per epoch (``YYYYMMDD`` its date): ``slc_YYYYMMDD.raw`` (little-endian complex64,
    azimuth-major ``(n_azimuth, n_range)``), ``h2ph_YYYYMMDD.raw`` (little-endian float32, same
    layout), a result file (``master.res`` for the mother epoch, ``slave_YYYYMMDD.res`` for the
    others: ``readfiles``, ``precise_orbits``, ``crop`` and, for slaves, ``resample`` sections
    with the real DORIS v5 field names) and, for the slaves, ``ifgs_YYYYMMDD.res`` with the
    baseline to the mother (``coarse_orbits``). Rasters are written one row of blocks at a time
    (memory: one row of blocks of ``complex`` and ``h2ph``) to ``*.part`` files renamed when
    complete.

    Parameters
    ----------
    folder
        Created if absent.
    overwrite
        Replace files of the same names; otherwise they raise.
    progress
        Show a tqdm progress bar over the rows of blocks.
    **simulate_kwargs
        Keyword arguments of :func:`simulate_stack`.

    Returns
    -------
    dict
        ``folder``, ``slc_files``, ``h2ph_files``, ``res_files`` (one per epoch),
        ``ifgs_res_files`` (None at the mother), ``shape`` (n_azimuth, n_range), ``dates``
        (datetime64[ns]), ``mother_index``, ``wavelength``, ``bperp``, ``dtype``
        (``"<c8"``), ``h2ph_dtype`` (``"<f4"``).

    Raises
    ------
    FileExistsError
        When a file to write exists and ``overwrite`` is False.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> out = write_stack_binary(tempfile.mkdtemp(), shape=(8, 6), n_epochs=3, progress=False)
    >>> np.fromfile(out["slc_files"][0], dtype="<c8").reshape(out["shape"]).shape
    (8, 6)
    >>> out["res_files"][1].name
    'master.res'
    """
    folder = Path(folder)
    stack, _ = simulate_stack(**simulate_kwargs)
    time = stack["time"].values
    mother = int(np.flatnonzero(time == np.datetime64(stack.attrs["mother_time"]))[0])
    dates = [np.datetime_as_string(t, unit="D").replace("-", "") for t in time]
    slc_files = [folder / f"slc_{d}.raw" for d in dates]
    h2ph_files = [folder / f"h2ph_{d}.raw" for d in dates]
    res_files = [folder / ("master.res" if t == mother else f"slave_{d}.res")
                 for t, d in enumerate(dates)]
    ifgs_files = [None if t == mother else folder / f"ifgs_{d}.res" for t, d in enumerate(dates)]
    targets = [*slc_files, *h2ph_files, *res_files, *(p for p in ifgs_files if p)]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"files already exist in '{folder}': {existing[:3]}"
                              f"{' ...' if len(existing) > 3 else ''}; pass overwrite=True")
    folder.mkdir(parents=True, exist_ok=True)
    shape = (stack.sizes["azimuth"], stack.sizes["range"])
    logger.info("writing %d epochs of %d x %d raw SLC and h2ph files to %s",
                len(dates), *shape, folder)

    parts = [p.with_name(p.name + ".part") for p in (*slc_files, *h2ph_files)]
    try:
        with contextlib.ExitStack() as files:
            handles = [files.enter_context(open(p, "wb")) for p in parts]
            for rows in tqdm(_azimuth_blocks(stack), desc=f"writing {folder.name}",
                             unit="block row", disable=not progress):
                block = stack.isel(azimuth=rows)
                slc, h2ph = dask.compute(block["complex"].data, block["h2ph"].data)
                for t in range(len(dates)):
                    handles[t].write(np.ascontiguousarray(slc[:, :, t], dtype="<c8").tobytes())
                    handles[len(dates) + t].write(
                        np.ascontiguousarray(h2ph[:, :, t], dtype="<f4").tobytes())
        for part, final in zip(parts, (*slc_files, *h2ph_files)):
            os.replace(part, final)
    except BaseException:
        for part in parts:
            part.unlink(missing_ok=True)
        raise

    corner_rows = [0, shape[0] - 1]
    corner_cols = [0, shape[1] - 1]
    corners = stack[["lat", "lon"]].isel(azimuth=corner_rows, range=corner_cols).compute()
    info = {"shape": shape, "mother_index": mother, "time": time, "seed": stack.attrs["seed"],
            "wavelength": float(stack.attrs["wavelength"]), "bperp": stack["bperp"].values,
            "slant_range": _range_geometry(shape[1])[0], "lat": corners["lat"].values,
            "lon": corners["lon"].values, "slc_files": slc_files, "ifgs_files": ifgs_files}
    for t in range(len(dates)):
        res_files[t].write_text(_res_text(info, t))
        if ifgs_files[t] is not None:
            ifgs_files[t].write_text(_ifgs_text(info, t))
    return {"folder": folder, "slc_files": slc_files, "h2ph_files": h2ph_files,
            "res_files": res_files, "ifgs_res_files": ifgs_files, "shape": shape,
            "dates": time, "mother_index": mother, "wavelength": info["wavelength"],
            "bperp": info["bperp"], "dtype": "<c8", "h2ph_dtype": "<f4"}


def accuracy(result: xr.Dataset, points: xr.Dataset, truth: xr.Dataset, *,
             min_coherence: float = 0.8) -> dict[str, float]:
    """A chain result against a simulated truth, with the floors physics sets on the same points.

    Compared on the true PS of ``result`` with ``temporal_coherence >= min_coherence``, after
    removing the median difference (the datum). The floors come from the truth with the true
    ambiguities: a per-point least-squares fit of offset, velocity and height error to the
    interferometric noise alone (*noise floor*: the atmosphere removed perfectly) and to noise
    plus the true screen (*no-correction floor*: what a chain without an atmosphere step
    reaches). An atmosphere white in time leaks into every velocity and height; no per-point
    estimator removes that, so the no-correction floor of the velocity is also its practical
    floor.

    Parameters
    ----------
    result
        Output of :func:`depsi.processing.chain.run_ps_chain` (``point_index`` into ``points``).
    points
        The point STM given to the chain (``complex`` or single-mother ``phase``, ``h2ph``).
    truth
        The truth of :func:`simulate_stack`.

    Returns
    -------
    dict
        ``velocity_rmse`` (m/yr), ``height_rmse`` (m), their ``*_noise_floor`` and
        ``*_nocorr_floor``, ``n_compared`` and ``fraction_of_true_ps`` (true PS in the result
        over true PS in the scene).

    Examples
    --------
    >>> from depsi.processing.chain import run_ps_chain
    >>> from depsi.processing.selection import ps_selection
    >>> stack, truth = simulate_stack(shape=(100, 100), n_epochs=20, seed=1, ps_fraction=0.03)
    >>> ps = ps_selection(stack).compute()
    >>> figures = accuracy(run_ps_chain(ps, first_order=150), ps, truth)
    >>> figures["velocity_nocorr_floor"] > figures["velocity_noise_floor"]
    True
    """
    from depsi.processing.interferogram import single_mother_interferograms
    from depsi.stm.schema import years_since_mother

    if "complex" in points and "interferogram" not in points.attrs:
        points = single_mother_interferograms(points)
    index = result["point_index"].values
    az = points["azimuth"].values[index]
    rg = points["range"].values[index]
    at = {"azimuth": xr.DataArray(az, dims="space"), "range": xr.DataArray(rg, dims="space")}
    true = truth[["ps_mask", "velocity", "height_error", "aps", "displacement"]].isel(at).compute()
    compared = (true["ps_mask"].values
                & (result["temporal_coherence"].values >= min_coherence))
    years = years_since_mother(points)
    mother = int(np.argmin(np.abs(years)))
    m2ph = phase_per_metre(float(points.attrs["wavelength"]))
    phase = points["phase"].transpose("space", "time").values[index].astype(np.float64)
    h2ph = np.broadcast_to(points["h2ph"].transpose("space", ...).values[index]
                           .astype(np.float64).reshape(len(index), -1), phase.shape)
    displacement = true["displacement"].transpose("space", "time").values.astype(np.float64)
    aps = true["aps"].transpose("space", "time").values.astype(np.float64)
    model = m2ph * (displacement - displacement[:, mother:mother + 1]
                    + h2ph * true["height_error"].values[:, None]) + aps
    noise = wrap_phase(phase - model)

    def fit(observed):
        design = np.stack([np.broadcast_to(m2ph * years, phase.shape), m2ph * h2ph,
                           np.ones_like(phase)], axis=2)[compared]
        normal = np.einsum("ntp,ntq->npq", design, design)
        rhs = np.einsum("ntp,nt->np", design, observed[compared])
        solution = np.linalg.solve(normal, rhs[..., None])[..., 0]
        return solution[:, 0], solution[:, 1]

    def rms(error):
        return float(np.sqrt(np.mean((error - np.median(error)) ** 2))) if error.size else np.nan

    v_noise, h_noise = fit(noise)
    v_nocorr, h_nocorr = fit(noise + aps)
    n_true = int(truth["ps_mask"].sum())
    return {
        "velocity_rmse": rms(result["velocity"].values[compared]
                             - true["velocity"].values[compared]),
        "height_rmse": rms(result["height_error"].values[compared]
                           - true["height_error"].values[compared]),
        "velocity_noise_floor": rms(v_noise), "velocity_nocorr_floor": rms(v_nocorr),
        "height_noise_floor": rms(h_noise), "height_nocorr_floor": rms(h_nocorr),
        "n_compared": int(compared.sum()),
        "fraction_of_true_ps": float(true["ps_mask"].values.sum() / max(n_true, 1)),
    }


# ----------------------------------------------------------------------------------------------
# The simulated scene's geometry, and its stacks in the formats users bring
# ----------------------------------------------------------------------------------------------

#: State vectors of a simulated orbit: every second, this many seconds either side of the
#: scene centre's time.
ORBIT_HALF_SPAN_SECONDS = 100

#: Stack formats :func:`write_stack` writes (each read back by its reader in depsi.io).
STACK_FORMATS = ("doris", "gamma", "isce2", "dimap", "snap", "geotiff")


def _simulated_orbit(day: np.datetime64, centre_second: float, bperp: float):
    """A circular orbit over the scene centre, shifted across track so that its h2ph from the
    orbits has the sign and size of the simulator's ``h2ph = bperp / (R sin(theta))``."""
    from depsi.io.geometry import Orbit

    geometry = _orbit_geometry()
    seconds = np.floor(centre_second) - ORBIT_HALF_SPAN_SECONDS + np.arange(
        2 * ORBIT_HALF_SPAN_SECONDS + 1, dtype=np.float64)
    angle = geometry["omega"] * (seconds - centre_second)
    radius, omega = geometry["radius"], geometry["omega"]
    position = radius * (np.cos(angle)[:, None] * geometry["radial"]
                         + np.sin(angle)[:, None] * geometry["along"])
    velocity = radius * omega * (-np.sin(angle)[:, None] * geometry["radial"]
                                 + np.cos(angle)[:, None] * geometry["along"])
    # depsi's h2ph = -B_perp / (R sin(theta)) (SNAP's sign): a positive simulated h2ph is a
    # secondary below the mother's line of sight
    position = position - bperp * geometry["perpendicular"]
    return Orbit(day, seconds, position, velocity, source=f"simulated orbit of {day}")


def simulated_geometry(stack: xr.Dataset):
    """The :class:`~depsi.io.geometry.StackGeometry` of a stack from :func:`simulate_stack`.

    The mother's radar grid (line time and interval, near range and slant spacing of the
    simulated flat-Earth geometry) and, per epoch, a circular orbit over the scene centre
    offset across track by the epoch's ``bperp``, so that the h2ph computed from these orbits
    agrees in sign and within a few per cent with the stack's own ``h2ph`` (the simulated
    geometry is a flat Earth; the orbits' is the WGS84 ellipsoid). Used by :func:`write_stack`
    to write stacks whose metadata are self-consistent.

    Examples
    --------
    >>> stack, _ = simulate_stack(shape=(20, 30), n_epochs=4, seed=0)
    >>> geometry = simulated_geometry(stack)
    >>> len(geometry.orbits), geometry.mother
    (4, 2)
    """
    from depsi.io.geometry import RadarGrid, StackGeometry

    time = stack["time"].values
    mother = int(np.flatnonzero(time == np.datetime64(stack.attrs["mother_time"]))[0])
    n_az, n_rg = stack.sizes["azimuth"], stack.sizes["range"]
    interval = PIXEL_SPACING[0] / GROUND_SPEED
    slant_range = _range_geometry(n_rg)[0]
    spacing = float((slant_range[-1] - slant_range[0]) / max(n_rg - 1, 1)) if n_rg > 1 else \
        PIXEL_SPACING[1] * math.sin(math.radians(INCIDENCE_CENTRE_DEG))
    days = time.astype("datetime64[D]").astype("datetime64[ns]")
    first_line = days[mother] + np.timedelta64(int(ACQUISITION_SECOND_OF_DAY * 1e9), "ns")
    centre_second = ACQUISITION_SECOND_OF_DAY + n_az / 2 * interval
    bperp = stack["bperp"].values.astype(np.float64)
    orbits = tuple(_simulated_orbit(days[t], centre_second, bperp[t]) for t in range(len(time)))
    grid = RadarGrid(first_line, interval, float(slant_range[0]), spacing)
    return StackGeometry(grid, orbits, mother, float(stack.attrs["wavelength"]), 0.0)


def _write_geotiff_stack(folder: Path, stack: xr.Dataset, geometry) -> dict[str, Any]:
    """One complex64 GeoTIFF per epoch (``slc_YYYYMMDD.tif``), one float32 h2ph GeoTIFF per
    epoch (``h2ph_YYYYMMDD.tif``) and float64 ``lat.tif``/``lon.tif`` (geocoded from the
    geometry), as an SLC stack exported by GDAL-based tools."""
    import rasterio

    from depsi.io.geometry import radar_to_geo

    folder.mkdir(parents=True, exist_ok=True)
    dates = [np.datetime_as_string(t, unit="D") for t in stack["time"].values]
    n_az, n_rg = stack.sizes["azimuth"], stack.sizes["range"]
    values = dask.compute(stack["complex"].data, stack["h2ph"].data)
    files: dict[str, list[Path]] = {"slc_files": [], "h2ph_files": []}
    for t, day in enumerate(dates):
        for kind, data, dtype in (("slc", values[0], "complex64"), ("h2ph", values[1], "float32")):
            path = folder / f"{kind}_{day.replace('-', '')}.tif"
            part = path.with_name(path.name + ".part")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
                with rasterio.open(part, "w", driver="GTiff", width=n_rg, height=n_az, count=1,
                                   dtype=dtype) as tif:
                    tif.write(np.ascontiguousarray(data[:, :, t], dtype=dtype)[None])
            os.replace(part, path)
            files[f"{kind}_files"].append(path)
    azimuth, range_ = np.meshgrid(np.arange(n_az), np.arange(n_rg), indexing="ij")
    for name, values in zip(("lat", "lon"), radar_to_geo(geometry, azimuth, range_)):
        path = folder / f"{name}.tif"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            with rasterio.open(path, "w", driver="GTiff", width=n_rg, height=n_az, count=1,
                               dtype="float64") as tif:
                tif.write(values[None])
        files[f"{name}_file"] = path
    return files | {"dates": dates}


def write_stack(folder: str | os.PathLike, *, format: str, overwrite: bool = False,
                **simulate_kwargs: Any) -> dict[str, Any]:
    """Simulate a stack and write it in one of the formats users bring, through depsi's writers.

    Parameters
    ----------
    folder
        Where the stack goes (created; a BEAM-DIMAP product is ``folder/stack.dim``).
    format
        One of :data:`STACK_FORMATS`: ``doris`` (DORIS-5 stack folder, doris_stack layout),
        ``gamma`` (rslc + slc.par), ``isce2`` (topsStack merged/ layout), ``dimap`` (SNAP
        BEAM-DIMAP), ``snap`` (SNAP znap Zarr products, one ``YYYYMMDD-coreg.znap`` per date),
        ``geotiff`` (one complex GeoTIFF and one h2ph GeoTIFF per epoch; dates and
        wavelength then come from the configuration).
    overwrite
        Replace an existing stack (doris, dimap and snap refuse otherwise; the others
        overwrite).
    **simulate_kwargs
        Keyword arguments of :func:`simulate_stack`.

    Returns
    -------
    dict
        ``folder``, ``path`` (what a reader or ``input.path`` takes), ``format``, ``dates``
        (ISO strings), ``wavelength``, ``truth`` (the simulated truth), ``geometry``.
    """
    if format not in STACK_FORMATS:
        raise ValueError(f"format: expected one of {STACK_FORMATS}, found {format!r}")
    folder = Path(folder)
    stack, truth = simulate_stack(**simulate_kwargs)
    geometry = simulated_geometry(stack)
    raster = stack.drop_vars([n for n in stack.coords if n not in ("azimuth", "range", "time")])
    path = folder
    if format == "doris":
        from depsi.io.doris import write_doris_stack

        write_doris_stack(folder, raster, geometry, overwrite=overwrite)
    elif format == "gamma":
        from depsi.io.gamma import write_gamma

        write_gamma(folder, raster.drop_vars("h2ph"), geometry)
    elif format == "isce2":
        from depsi.io.isce2 import write_isce2

        write_isce2(folder, raster.drop_vars("h2ph"), geometry)
    elif format == "dimap":
        from depsi.io.dimap import write_dimap

        folder.mkdir(parents=True, exist_ok=True)
        path = write_dimap(folder / "stack.dim", raster, geometry, overwrite=overwrite)
    elif format == "snap":
        from depsi.io.znap import write_znap

        write_znap(folder, raster, geometry, overwrite=overwrite)
    else:
        _write_geotiff_stack(folder, raster, geometry)
    return {"folder": folder, "path": path, "format": format,
            "dates": [np.datetime_as_string(t, unit="D") for t in stack["time"].values],
            "wavelength": float(stack.attrs["wavelength"]), "truth": truth,
            "geometry": geometry}
