"""Simulated SLC stacks with a known truth, to test and benchmark depsi end to end.

``simulate_stack`` builds a lazy, chunk-independent (azimuth, range, time) stack of persistent
and distributed scatterers with a known deformation, height error and atmosphere, deterministic
by seed; :func:`simulated_geometry` gives its radar grid and orbits. Writing it to disk is
:mod:`depsi.simulate.stacks`'s, scoring a result against its truth
:mod:`depsi.simulate.scoring`'s.

Phase model (docs/concepts.md), per pixel and epoch ``t``: the SLC phase of every processor,
``-4 pi R / wavelength``, of a scatterer whose range is ``R_t = R_0 - displacement_t +
h2ph_t * height_error`` (``displacement`` towards the satellite, ``h2ph_t = d(R_t -
R_mother)/dh``, SNAP's sign)::

    m2ph          = -4 * pi / wavelength
    slc_phase_t   = -(scatterer_phase + m2ph * (displacement_t - h2ph_t * height_error)
                      + aps_t + noise_t)                                (wrapped)
    ifg_phase_t   = angle(slc_mother * conj(slc_t))
                  = wrap(m2ph * (displacement_t - displacement_mother
                                 + (h2ph_mother - h2ph_t) * height_error)
                         + aps_t + noise_t - noise_mother)

with ``h2ph_t = -bperp_t / (R sin(theta))`` (SNAP's sign; zero at the mother epoch; the
interferograms' ``h2ph`` is ``h2ph_mother - h2ph_t = bperp_t / (R sin(theta))``,
:mod:`depsi.processing.interferogram`), ``aps_mother = 0`` and
``displacement_t = velocity * tau_t + seasonal_amplitude * sin(2 pi tau_t)``, ``tau_t`` the time
since the first epoch in years of 365.25 days, so ``displacement`` is zero at the first epoch.
Persistent scatterers (PS) follow this model with ``noise_t ~ N(0, ps_noise_std)`` per epoch
(so the interferometric noise has standard deviation ``sqrt(2) * ps_noise_std`` off the mother
epoch); the background is circular complex Gaussian, independent per epoch (Rayleigh amplitude,
uniform phase), i.e. fully decorrelated. With ``ds_regions``, square patches of distributed
scatterers (DS) sit in the background: each pixel circular complex Gaussian with the
exponential-decay coherence of :mod:`depsi.simulate.ds`, ``z = sqrt(P) exp(j phi) L w``
(``L L^T = |G|``, ``w ~ CN(0, I)`` per pixel), its phase ``phi`` the same model as a PS's
(deformation, the patch's height error, atmosphere) plus a constant per pixel, and its power
``P`` the patch's (:data:`DS_REGION_GAIN` times the background's), so an SHP test can tell a
patch from the background around it.

Randomness is drawn per fixed internal tile of ``TILE_SIZE`` x ``TILE_SIZE`` pixels from
``SeedSequence([seed, key, tile_i, tile_j, ...])`` and every tile is always computed whole, so a
value never depends on how the stack is chunked.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import phase_per_metre, years_since
from depsi.simulate.ds import (
    DEFAULT_GAMMA0,
    DEFAULT_GAMMA_INF,
    DEFAULT_TAU_DAYS,
    exponential_coherence,
)

logger = logging.getLogger(__name__)

#: Edge (pixels) of the fixed tiles that randomness is drawn on; changing it changes the stacks.
TILE_SIZE = 256

#: Defaults of a simulated scene (also those of ``input.simulate`` in ``depsi run``).
DEFAULT_SHAPE = (200, 200)
DEFAULT_N_EPOCHS = 30
DEFAULT_SEED = 0
#: First acquisition and revisit interval of a simulated stack (Sentinel-1's 12 days).
DEFAULT_START = "2020-01-01"
DEFAULT_REVISIT_DAYS = 12
DEFAULT_PS_FRACTION = 0.02

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

#: Distributed-scatterer patches of a scene: none by default (the stacks of earlier releases).
DEFAULT_DS_REGIONS = 0
#: Edge (pixels) of a square DS patch: 24 pixels hold a whole 11 x 11 SHP window around most of
#: their pixels.
DEFAULT_DS_REGION_SIZE = 24
#: Mean intensity of a DS patch over the background's: log-uniform between these (6-12 dB), well
#: beyond what the SHP test's threshold tells apart at 30 epochs.
DS_REGION_GAIN = (4.0, 16.0)
#: Pixels kept free between two DS patches (and between a patch and the scene's edge).
DS_REGION_GAP = 4

_WGS84_A = 6378137.0
_WGS84_E2 = 6.69437999014e-3
_GM = 3.986004418e14

# keys that separate the random streams: SeedSequence([seed, key, ...])
_KEY_BPERP, _KEY_FIELD, _KEY_APS, _KEY_TILE_STATIC, _KEY_TILE_EPOCH = 1, 2, 3, 4, 5
_KEY_DS_REGIONS, _KEY_TILE_DS = 6, 7

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
    ds_corner: np.ndarray       # (R, 2) first (azimuth, range) pixel of each DS patch
    ds_size: int                # edge of a DS patch (pixels)
    ds_power: np.ndarray        # (R,) mean intensity of each patch
    ds_height: np.ndarray       # (R,) height error (m) of each patch
    ds_factor: np.ndarray       # (T, T) Cholesky factor of the patches' |coherence|

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


def _ds_regions(shape: tuple[int, int], seed: int, n_regions: int, size: int,
                height_error_std: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Corners, powers and height errors of ``n_regions`` DS patches that do not touch."""
    corners = np.zeros((n_regions, 2), dtype=np.int64)
    if n_regions == 0:
        return corners, np.zeros(0), np.zeros(0)
    if not isinstance(size, (int, np.integer)) or size < 3:
        raise ValueError(f"ds_region_size: expected an integer >= 3 pixels, found {size!r}")
    rng = _rng(seed, _KEY_DS_REGIONS)
    free = [n - size - 2 * DS_REGION_GAP for n in shape]
    placed = 0
    for _ in range(200 * n_regions):  # rejection sampling of a few patches, not of pixels
        if placed == n_regions or min(free) < 0:
            break
        corner = DS_REGION_GAP + np.array([rng.integers(0, f + 1) for f in free])
        apart = np.abs(corners[:placed] - corner).max(axis=1) >= size + DS_REGION_GAP
        if apart.all():
            corners[placed] = corner
            placed += 1
    if placed < n_regions:
        raise ValueError(f"ds_regions: expected {n_regions} patches of {size} x {size} pixels "
                         f"{DS_REGION_GAP} pixels apart to fit in a scene of {shape}, found "
                         f"room for {placed}")
    low, high = np.log10(DS_REGION_GAIN)
    power = DS_RMS_AMPLITUDE**2 * 10.0 ** rng.uniform(low, high, n_regions)
    height = rng.standard_normal(n_regions) * height_error_std
    return corners, power, height


def _build_scene(*, shape, n_epochs, seed, ps_fraction, wavelength, start, revisit_days,
                 mother_index, velocity_max, seasonal_amplitude, height_error_std, aps_std,
                 ps_noise_std, ds_regions=DEFAULT_DS_REGIONS,
                 ds_region_size=DEFAULT_DS_REGION_SIZE, ds_coherence=None) -> _Scene:
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
    if not isinstance(ds_regions, (int, np.integer)) or ds_regions < 0:
        raise ValueError(f"ds_regions: expected a number of patches >= 0, found {ds_regions!r}")
    corners, ds_power, ds_height = _ds_regions(shape, seed, int(ds_regions), ds_region_size,
                                               float(height_error_std))
    ds_factor = np.eye(n_epochs)
    extra: tuple[Any, ...] = ()
    if ds_regions:
        days = (time - time[0]) / np.timedelta64(1, "D")
        ds_factor = np.linalg.cholesky(exponential_coherence(days, **(ds_coherence or {})))
        extra = (int(ds_regions), int(ds_region_size), sorted((ds_coherence or {}).items()))
    token = dask.base.tokenize(shape, n_epochs, seed, ps_fraction, wavelength, str(first),
                               revisit_days, mother, sorted(stds.items()), TILE_SIZE,
                               APS_MODES, *extra)
    return _Scene(
        shape=shape, n_epochs=int(n_epochs), seed=int(seed), ps_fraction=float(ps_fraction),
        wavelength=float(wavelength), mother_index=mother,
        height_error_std=float(height_error_std), ps_noise_std=float(ps_noise_std),
        time=time, years=years, seasonal_sine=np.sin(2.0 * np.pi * years), bperp=bperp,
        h2ph_factor=1.0 / (slant_range * np.sin(incidence)), slant_range=slant_range,
        incidence=incidence, bowl_az=bowl[0], bowl_rg=bowl[1],
        bowl_depth=-BOWL_SHARE * float(velocity_max), trend_az=trend[0], trend_rg=trend[1],
        seasonal_amplitude=float(seasonal_amplitude), aps_k_az=k_az, aps_k_rg=k_rg,
        aps_phase=aps_phase, aps_amplitude=aps_amplitude, token=token, ds_corner=corners,
        ds_size=int(ds_region_size), ds_power=ds_power, ds_height=ds_height,
        ds_factor=ds_factor)


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


def _ds_region(scene: _Scene, az: slice, rg: slice) -> np.ndarray:
    """Index of the DS patch of each pixel (int16, -1 outside every patch)."""
    rows, cols = np.arange(az.start, az.stop), np.arange(rg.start, rg.stop)
    region = np.full((rows.size, cols.size), -1, dtype=np.int16)
    for index, (a0, r0) in enumerate(scene.ds_corner):  # a few patches, each a slab of pixels
        inside_az = (rows >= a0) & (rows < a0 + scene.ds_size)
        inside_rg = (cols >= r0) & (cols < r0 + scene.ds_size)
        region[np.ix_(inside_az, inside_rg)] = index
    return region


def _h2ph(scene: _Scene, rg: slice) -> np.ndarray:
    """h2ph (float32, (range, time)): ``-B_perp / (R sin(theta))``, SNAP's per-SLC sign
    (``d(R_t - R_mother)/dh``, :mod:`depsi.geometry`)."""
    return (-scene.h2ph_factor[rg, None] * scene.bperp.astype(np.float64)).astype(np.float32)


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
    low, high = np.log10(PS_AMPLITUDE_GAIN)
    gain = 10.0 ** rng.uniform(low, high, full)
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
    crop = (slice(0, az.stop - az.start), slice(0, rg.stop - rg.start))
    static = _tile_static(scene, ti, tj)
    values = static[name][crop]
    if name == "height_error" and scene.ds_corner.size:
        # a DS pixel's height error is its patch's
        region = _ds_region(scene, az, rg)
        ds = (region >= 0) & ~static["ps_mask"][crop]
        return np.where(ds, scene.ds_height[np.maximum(region, 0)], values)
    return values


def _tile_ds_mask(scene: _Scene, ti: int, tj: int) -> np.ndarray:
    """True DS pixels of the tile's part of the scene: in a patch, not a PS."""
    az, rg = _tile_bounds(scene, ti, tj)
    return (_ds_region(scene, az, rg) >= 0) & ~_tile_truth(scene, ti, tj, "ps_mask")


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
    model = scene.m2ph * (displacement - h2ph * height_error[:, None])
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
    if scene.ds_corner.size:
        _add_ds(scene, ti, tj, static, out)
    # the SLCs' phase is -4 pi R / wavelength (module docstring): the conjugate of the model's
    return np.conj(out, out=out)


def _add_ds(scene: _Scene, ti: int, tj: int, static: dict, out: np.ndarray) -> None:
    """Write the DS patches' pixels (PS excepted) of a tile into ``out``, in place."""
    az, rg = _tile_bounds(scene, ti, tj)
    whole = (slice(az.start, az.start + TILE_SIZE), slice(rg.start, rg.start + TILE_SIZE))
    region = _ds_region(scene, *whole)
    # every DS pixel of the whole tile draws, so the draws never depend on the scene's crop
    da_, dr = np.nonzero((region >= 0) & ~static["ps_mask"])
    if not da_.size:
        return
    rng = _rng(scene.seed, _KEY_TILE_DS, ti, tj)
    white = rng.standard_normal((2, da_.size, scene.n_epochs))
    looks = ((white[0] + 1j * white[1]) / math.sqrt(2.0)) @ scene.ds_factor.T
    inside = (da_ < az.stop - az.start) & (dr < rg.stop - rg.start)
    ia, ir = da_[inside], dr[inside]
    patch = region[ia, ir]
    displacement = _displacement(_velocity(scene, az, rg)[ia, ir],
                                 _seasonal(scene, az, rg)[ia, ir], scene)
    h2ph = _h2ph(scene, rg)[ir].astype(np.float64)
    aps = _tile_aps_all(scene, ti, tj)[ia, ir].astype(np.float64)
    phase = (static["scatterer_phase"][ia, ir, None] + aps
             + scene.m2ph * (displacement - h2ph * scene.ds_height[patch][:, None]))
    amplitude = np.sqrt(scene.ds_power[patch])[:, None]
    out[ia, ir] = (amplitude * np.exp(1j * phase) * looks[inside]).astype(np.complex64)


_TILE_FUNCTIONS: dict[str, Callable[[_Scene, int, int], np.ndarray]] = {
    "complex": _tile_complex,
    "aps": _tile_aps_all,
    "ps_mask": partial(_tile_truth, name="ps_mask"),
    "height_error": partial(_tile_truth, name="height_error"),
    "amplitude_dispersion": partial(_tile_truth, name="amplitude_dispersion"),
    "ds_mask": _tile_ds_mask,
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
    if variable == "ds_region":
        return _ds_region(scene, az, rg)
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
    shape: tuple[int, int] = DEFAULT_SHAPE,
    n_epochs: int = DEFAULT_N_EPOCHS,
    seed: int = DEFAULT_SEED,
    ps_fraction: float = DEFAULT_PS_FRACTION,
    wavelength: float = 0.0556,
    start: str | np.datetime64 = DEFAULT_START,
    revisit_days: float = DEFAULT_REVISIT_DAYS,
    mother_index: int | None = None,
    velocity_max: float = 0.02,
    seasonal_amplitude: float = 0.0,
    height_error_std: float = 5.0,
    aps_std: float = 1.0,
    ps_noise_std: float = 0.3,
    ds_regions: int = DEFAULT_DS_REGIONS,
    ds_region_size: int = DEFAULT_DS_REGION_SIZE,
    ds_gamma0: float = DEFAULT_GAMMA0,
    ds_gamma_inf: float = DEFAULT_GAMMA_INF,
    ds_tau_days: float = DEFAULT_TAU_DAYS,
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
    ds_regions
        Square patches of distributed scatterers, placed at random, apart from each other and
        from the edges (:data:`DS_REGION_GAP`); 0 (default): none, the stack of earlier
        releases. A patch's pixels carry the PS's phase model (the scene's deformation and
        atmosphere, one height error per patch drawn with ``height_error_std``) with the
        coherence of :func:`depsi.simulate.ds.exponential_coherence` and a power
        :data:`DS_REGION_GAIN` times the background's; PS inside a patch stay PS.
    ds_region_size
        Edge (pixels) of a DS patch.
    ds_gamma0, ds_gamma_inf, ds_tau_days
        The patches' coherence model (short-term, long-term coherence, decay time in days).
    chunks
        Dask chunks in azimuth and range (time is one chunk): ``"auto"`` (tile multiples of
        about ``CHUNK_BYTES`` of ``complex`` per chunk), an int, ``(n_azimuth, n_range)`` or a
        dict with keys ``azimuth`` and ``range``. The default differs from ``input.simulate``'s
        ``chunks`` (null) on purpose: YAML has no ``"auto"`` for a pair, and null means it.

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
        off PS and DS), ``amplitude_dispersion`` (expected NAD: per-PS value, ``RAYLEIGH_NAD``
        elsewhere), ``aps`` (rad, zero at the mother) and ``displacement`` (m, zero at the
        first epoch), the last two per epoch. With ``ds_regions``: also ``ds_region`` (int16,
        the patch of each pixel, -1 outside) and ``ds_mask`` (bool, true DS pixels: in a
        patch and no PS), the coherence model in attrs (``ds_gamma0``, ...).

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
    coherence = {"gamma0": ds_gamma0, "gamma_inf": ds_gamma_inf, "tau_days": ds_tau_days}
    scene = _build_scene(shape=shape, n_epochs=n_epochs, seed=seed, ps_fraction=ps_fraction,
                         wavelength=wavelength, start=start, revisit_days=revisit_days,
                         mother_index=mother_index, velocity_max=velocity_max,
                         seasonal_amplitude=seasonal_amplitude,
                         height_error_std=height_error_std, aps_std=aps_std,
                         ps_noise_std=ps_noise_std, ds_regions=ds_regions,
                         ds_region_size=ds_region_size, ds_coherence=coherence)
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
    if ds_regions:
        args += (f", ds_regions={ds_regions}, ds_region_size={ds_region_size}, "
                 f"ds_gamma0={ds_gamma0}, ds_gamma_inf={ds_gamma_inf}, "
                 f"ds_tau_days={ds_tau_days}")
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
            "slc_phase = -(scatterer_phase + m2ph * (displacement - h2ph * height_error) + aps "
            "+ noise), m2ph = -4 pi / wavelength, noise ~ N(0, ps_noise_std) per epoch on PS; "
            "distributed scatterers are circular Gaussian, independent per epoch"),
            "ps_noise_std": scene.ps_noise_std})
    if ds_regions:
        truth = truth.assign(
            ds_region=(_DIMS2, lazy("ds_region", np.int16, False),
                       {"long_name": "DS patch of the pixel (-1: none)", "units": "1"}),
            ds_mask=(_DIMS2, lazy("ds_mask", bool, False),
                     {"long_name": "true distributed scatterer (simulation)", "units": "1"}))
        truth.attrs.update({f"ds_{name}": float(value) for name, value in coherence.items()})
    return stack, truth


# ----------------------------------------------------------------------------------------------
# The simulated scene's geometry: orbits over its centre, its radar grid
# ----------------------------------------------------------------------------------------------

#: State vectors of a simulated orbit: every second, this many seconds either side of the
#: scene centre's time.
ORBIT_HALF_SPAN_SECONDS = 100


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


def _simulated_orbit(day: np.datetime64, centre_second: float, bperp: float):
    """A circular orbit over the scene centre, shifted across track so that its h2ph from the
    orbits has the sign and size of the simulator's ``h2ph = -bperp / (R sin(theta))``."""
    from depsi.geometry import Orbit

    geometry = _orbit_geometry()
    seconds = np.floor(centre_second) - ORBIT_HALF_SPAN_SECONDS + np.arange(
        2 * ORBIT_HALF_SPAN_SECONDS + 1, dtype=np.float64)
    angle = geometry["omega"] * (seconds - centre_second)
    radius, omega = geometry["radius"], geometry["omega"]
    position = radius * (np.cos(angle)[:, None] * geometry["radial"]
                         + np.sin(angle)[:, None] * geometry["along"])
    velocity = radius * omega * (-np.sin(angle)[:, None] * geometry["radial"]
                                 + np.cos(angle)[:, None] * geometry["along"])
    # depsi's h2ph = -B_perp / (R sin(theta)) (SNAP's sign, as the stack's): B_perp positive
    # is a secondary above the mother's line of sight
    position = position + bperp * geometry["perpendicular"]
    return Orbit(day, seconds, position, velocity, source=f"simulated orbit of {day}")


def simulated_geometry(stack: xr.Dataset):
    """The :class:`~depsi.geometry.StackGeometry` of a stack from :func:`simulate_stack`.

    The mother's radar grid (line time and interval, near range and slant spacing of the
    simulated flat-Earth geometry) and, per epoch, a circular orbit over the scene centre
    offset across track by the epoch's ``bperp``, so that the h2ph computed from these orbits
    agrees in sign and within a few per cent with the stack's own ``h2ph`` (the simulated
    geometry is a flat Earth; the orbits' is the WGS84 ellipsoid). Used by
    :func:`~depsi.simulate.write_stack` to write stacks whose metadata are self-consistent.

    Examples
    --------
    >>> stack, _ = simulate_stack(shape=(20, 30), n_epochs=4, seed=0)
    >>> geometry = simulated_geometry(stack)
    >>> len(geometry.orbits), geometry.mother
    (4, 2)
    """
    from depsi.geometry import RadarGrid, StackGeometry

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

