"""Simulated stacks of distributed scatterers with a known coherence model, for SHP selection and
phase linking tested against the truth and the Cramér-Rao bound.

Every pixel is circular complex Gaussian with the coherence magnitudes of the exponential model
with a long-term part, ``g_ij = (g0 - g_inf) exp(-|t_i - t_j| / tau) + g_inf`` (1 on the
diagonal), and the phase history of its region: ``z = sqrt(P) diag(exp(j theta)) L w`` with
``L L^T = |G|`` and ``w ~ CN(0, I)`` independent per pixel. The scene is cut into vertical
stripes across range, one homogeneous region each, with their own power ``P`` (the amplitude
statistics an SHP test has to tell apart) and their own phase history ``theta`` (zero at the
first epoch).

As for :func:`depsi.simulate.simulate_stack`, randomness is drawn per fixed tile of
``DS_TILE_SIZE`` pixels from ``SeedSequence([seed, key, tile_i, tile_j])``, so values never
depend on the chunks.
"""

from __future__ import annotations

import math
from typing import cast

import dask.array as da
import numpy as np
import xarray as xr

#: Edge (pixels) of the tiles randomness is drawn on; changing it changes the stacks.
DS_TILE_SIZE = 64

#: Mean intensity of each region (stripes across range, in order): 6 dB apart.
DEFAULT_REGION_POWERS = (1.0, 4.0, 16.0)

#: The coherence model's defaults: short-term coherence, long-term coherence and decay time (d).
DEFAULT_GAMMA0 = 0.7
DEFAULT_GAMMA_INF = 0.2
DEFAULT_TAU_DAYS = 36.0

_DIMS2 = ("azimuth", "range")
_DIMS3 = ("azimuth", "range", "time")
_KEY_LOOKS, _KEY_PHASE = 1, 2


def exponential_coherence(times_days, *, gamma0: float = DEFAULT_GAMMA0,
                          gamma_inf: float = DEFAULT_GAMMA_INF,
                          tau_days: float = DEFAULT_TAU_DAYS) -> np.ndarray:
    """The exponential-decay coherence model with a long-term part:
    ``g_ij = (g0 - g_inf) exp(-|t_i - t_j| / tau) + g_inf`` off the diagonal, 1 on it.

    Examples
    --------
    >>> exponential_coherence([0, 12, 24], gamma0=0.7, gamma_inf=0.2, tau_days=12).round(3)[0]
    array([1.   , 0.384, 0.268])
    """
    if not 0 <= gamma_inf <= gamma0 < 1:
        raise ValueError(f"coherence model: expected 0 <= gamma_inf <= gamma0 < 1, found "
                         f"gamma0={gamma0!r}, gamma_inf={gamma_inf!r}")
    if not tau_days > 0:
        raise ValueError(f"tau_days: expected > 0, found {tau_days!r}")
    t = np.asarray(times_days, dtype=np.float64)
    lag = np.abs(t[:, None] - t[None, :])
    model = (gamma0 - gamma_inf) * np.exp(-lag / tau_days) + gamma_inf
    np.fill_diagonal(model, 1.0)
    return model


def circular_gaussian_looks(coherence, phase, shape: tuple[int, ...],
                            rng: np.random.Generator) -> np.ndarray:
    """Circular Gaussian samples of unit power with coherence magnitudes ``|coherence|`` and
    phase history ``phase``: ``(*shape, T)`` complex64, ``diag(exp(j phase)) L w``,
    ``L L^T = |G|``, ``w ~ CN(0, I)``.

    Examples
    --------
    >>> g = exponential_coherence(np.arange(5) * 12.0)
    >>> circular_gaussian_looks(g, np.zeros(5), (3, 4), np.random.default_rng(0)).shape
    (3, 4, 5)
    """
    factor = np.linalg.cholesky(np.abs(np.asarray(coherence, dtype=np.float64)))
    n_epochs = factor.shape[0]
    white = (rng.standard_normal((*shape, n_epochs))
             + 1j * rng.standard_normal((*shape, n_epochs))) / math.sqrt(2.0)
    looks = np.exp(1j * np.asarray(phase))[..., :] * (white @ factor.T)
    return looks.astype(np.complex64)


def region_of_range(n_range: int, n_regions: int) -> np.ndarray:
    """Region index of each range column: ``n_regions`` stripes of (nearly) equal width.

    Examples
    --------
    >>> region_of_range(7, 3).tolist()
    [0, 0, 0, 1, 1, 2, 2]
    """
    return (np.arange(n_range) * n_regions // n_range).astype(np.int16)


def _region_phases(seed: int, n_regions: int, n_epochs: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, _KEY_PHASE]))
    phase = rng.uniform(-np.pi, np.pi, (n_regions, n_epochs))
    phase[:, 0] = 0.0
    return phase


def _tile(seed, ti, tj, coherence, phases, powers, regions, shape):
    """One whole tile of the stack, from its own random stream."""
    az = slice(ti * DS_TILE_SIZE, min((ti + 1) * DS_TILE_SIZE, shape[0]))
    rg = slice(tj * DS_TILE_SIZE, min((tj + 1) * DS_TILE_SIZE, shape[1]))
    rng = np.random.default_rng(np.random.SeedSequence([seed, _KEY_LOOKS, ti, tj]))
    n_az, n_rg = az.stop - az.start, rg.stop - rg.start
    white = circular_gaussian_looks(coherence, np.zeros(coherence.shape[0]), (n_az, n_rg), rng)
    region = regions[rg]
    rotor = np.exp(1j * phases[region]) * np.sqrt(powers[region])[:, None]
    return (white * rotor[None, :, :]).astype(np.complex64)


def _block(seed, coherence, phases, powers, regions, shape, block_info=None):
    (az0, az1), (rg0, rg1), _ = block_info[None]["array-location"]
    out = np.empty((az1 - az0, rg1 - rg0, coherence.shape[0]), np.complex64)
    for ti in range(az0 // DS_TILE_SIZE, (az1 - 1) // DS_TILE_SIZE + 1):
        for tj in range(rg0 // DS_TILE_SIZE, (rg1 - 1) // DS_TILE_SIZE + 1):
            tile = _tile(seed, ti, tj, coherence, phases, powers, regions, shape)
            a0, r0 = ti * DS_TILE_SIZE, tj * DS_TILE_SIZE
            lo_a, hi_a = max(az0, a0), min(az1, a0 + tile.shape[0])
            lo_r, hi_r = max(rg0, r0), min(rg1, r0 + tile.shape[1])
            out[lo_a - az0:hi_a - az0, lo_r - rg0:hi_r - rg0] = (
                tile[lo_a - a0:hi_a - a0, lo_r - r0:hi_r - r0])
    return out


def simulate_ds_stack(
    *,
    shape: tuple[int, int] = (64, 96),
    n_epochs: int = 30,
    revisit_days: float = 12.0,
    gamma0: float = DEFAULT_GAMMA0,
    gamma_inf: float = DEFAULT_GAMMA_INF,
    tau_days: float = DEFAULT_TAU_DAYS,
    region_powers: tuple[float, ...] = DEFAULT_REGION_POWERS,
    start: str = "2020-01-01",
    seed: int = 0,
    chunks: int | tuple[int, int] = DS_TILE_SIZE,
) -> tuple[xr.Dataset, xr.Dataset]:
    """A lazy ``(azimuth, range, time)`` stack of distributed scatterers with known coherence.

    Parameters
    ----------
    shape
        ``(n_azimuth, n_range)`` pixels.
    n_epochs, revisit_days, start
        Epochs dated ``start + k * revisit_days``.
    gamma0, gamma_inf, tau_days
        The coherence model (:func:`exponential_coherence`).
    region_powers
        Mean intensity of each region; the regions are stripes across range, in this order.
    seed
        The same seed gives the same stack, whatever the chunks.
    chunks
        Dask chunks in azimuth and range (time is one chunk).

    Returns
    -------
    stack : xarray.Dataset
        ``complex`` (complex64), coordinates ``azimuth``, ``range``, ``time``.
    truth : xarray.Dataset
        ``region`` (int16) and ``power`` per pixel, ``phase`` (rad, wrapped, zero at the first
        epoch) per pixel and epoch, ``coherence`` (``time``, ``time_other``) of the model; the
        model's parameters in attrs.

    Examples
    --------
    >>> stack, truth = simulate_ds_stack(shape=(8, 12), n_epochs=5)
    >>> stack["complex"].shape, truth["coherence"].shape
    ((8, 12, 5), (5, 5))
    """
    n_az, n_rg = (int(s) for s in shape)
    powers = np.asarray(region_powers, dtype=np.float64)
    if n_az < 1 or n_rg < powers.size or n_epochs < 2:
        raise ValueError(f"shape, n_epochs: expected at least one row, one column per region "
                         f"({powers.size}) and two epochs, found shape={shape!r}, "
                         f"n_epochs={n_epochs!r}")
    if not (powers > 0).all():
        raise ValueError(f"region_powers: expected positive intensities, found {region_powers!r}")
    days = np.arange(n_epochs) * float(revisit_days)
    coherence = exponential_coherence(days, gamma0=gamma0, gamma_inf=gamma_inf,
                                      tau_days=tau_days)
    phases = _region_phases(seed, powers.size, n_epochs)
    regions = region_of_range(n_rg, powers.size)
    chunk_az, chunk_rg = (chunks, chunks) if np.isscalar(chunks) else cast(tuple[int, int], chunks)
    template = da.empty((n_az, n_rg, n_epochs), chunks=(chunk_az, chunk_rg, -1),
                        dtype=np.complex64)
    slc = da.map_blocks(_block, seed, coherence, phases, powers, regions, (n_az, n_rg),
                        dtype=np.complex64, chunks=template.chunks,
                        meta=np.empty((0, 0, 0), np.complex64))
    time = np.datetime64(start, "ns") + (days * 86400e9).astype("timedelta64[ns]")
    coords = {"azimuth": np.arange(n_az), "range": np.arange(n_rg), "time": time}
    model = {"gamma0": gamma0, "gamma_inf": gamma_inf, "tau_days": tau_days,
             "revisit_days": revisit_days, "seed": seed}
    stack = xr.Dataset({"complex": (_DIMS3, slc)}, coords=coords,
                       attrs={"history": f"depsi.simulate.simulate_ds_stack({model})"})
    region_map = np.broadcast_to(regions, (n_az, n_rg))
    truth = xr.Dataset(
        {"region": (_DIMS2, region_map.copy()),
         "power": (_DIMS2, powers[region_map].astype(np.float32)),
         "phase": (_DIMS3, np.broadcast_to(phases[regions].astype(np.float32),
                                           (n_az, n_rg, n_epochs)), {"units": "rad"}),
         "coherence": (("time", "time_other"), coherence)},
        coords=coords, attrs=model)
    return stack, truth
