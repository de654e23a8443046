"""Scene families for accuracy tests: an SLC stack generator independent of ``depsi.simulate``.

The chain must be right on scenes it was not tuned on, so this generator shares no code with
:mod:`depsi.simulate` and draws its statistics differently: atmospheric screens as Gaussian
random fields with an *exponential* covariance of a chosen correlation length (FFT synthesis on a
padded grid, so the field is not periodic over the scene), perpendicular baselines through a
slant-range geometry whose ``1 / (R sin(theta))`` varies by a chosen fraction across range,
velocity as a bowl plus a planar ramp, height errors either spatially white or shared by blocks
of buildings (one DEM error per block), and PS phase noise drawn straight in radians. The
families of :data:`ATMOSPHERE_FAMILIES` draw other screens by spectral synthesis
(Gaussian covariance, von Karman power laws of both turbulent regimes, anisotropic) and add a
stratified part ``k_t * terrain height`` on a terrain raster given in the stack.

:func:`oracle_floors` computes, from a scene's truth and with the true ambiguities, what a
least-squares fit of offset, velocity and height error reaches per point

- with the atmosphere removed perfectly (*noise floor*), and
- with the atmosphere left in (*no-correction floor*: a chain without an atmosphere step),

and :func:`score` measures a chain result against the truth the same way (after removing the
median difference, the datum), so each test can assert against floors it computed itself.

The last section is the other kind of shared scene: :func:`simulated_points`, the small point STM
(the true PS of a :func:`depsi.simulate.simulate_stack` stack) with its truth that the chain's
unit tests share, and :func:`predicted_arc_std`, an arc's noise-derived std on it. Test modules
import shared scenes from here, never from each other (tests/test_suite_habits.py).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import asdict, dataclass, replace

import numpy as np
import xarray as xr

from depsi.stm.schema import years_since_mother

WAVELENGTH = 0.05546576
M2PH = -4.0 * np.pi / WAVELENGTH
PIXEL = 10.0  # m, both directions
SLANT_RANGE = 850e3
INCIDENCE = np.deg2rad(37.0)
BPERP_STD = 120.0  # m


@dataclass(frozen=True)
class Family:
    """One scene family: what real scenes vary, in physical units."""

    name: str
    shape: tuple[int, int] = (400, 400)
    n_epochs: int = 60
    revisit_days: int = 12
    aps_std: float = 1.0            # rad, per epoch
    aps_length: float = 400.0       # m, exponential covariance correlation length
    ps_fraction: float = 0.03
    noise_std: float = 0.35         # rad, per PS and epoch
    h2ph_variation: float = 0.4     # fraction of 1 / (R sin theta) across the range extent
    height_std: float = 8.0         # m
    height_blocks: float = 0.0      # m; > 0: blocks of this size share one DEM error
    velocity_max: float = 0.02      # m/yr, bowl depth
    ramp: float = 0.004             # m/yr across the scene (planar ramp)
    seed: int = 0
    # atmospheres we have not tuned to: see _screen_spectrum and kriging_floor
    atmosphere: str = "exponential"  # or "gaussian", "power-law", "anisotropic"
    aps_slope: float = 5.0 / 3.0    # power-law: slope of the 1-D spectrum (5/3 or 8/3)
    aps_outer: float = 3000.0       # m, power-law: outer scale (von Karman)
    aps_ratio: float = 1.0          # anisotropic: short / long correlation length
    aps_angle: float = 0.0          # deg, anisotropic: long axis from the range axis
    stratified_rate: float = 0.0    # rad/m, std of the per-epoch k_t of k_t * terrain height
    terrain_std: float = 150.0      # m, relief of the terrain height raster
    terrain_length: float = 800.0   # m, Gaussian correlation length of the terrain
    # motion beyond a straight line: drawn from a stream of their own, so a family
    # with them has the same screens, noise and heights as the family without
    seasonal_amplitude: tuple[float, float] = (0.0, 0.0)  # m, annual amplitude drawn in range
    thermal_coefficient: tuple[float, float] = (0.0, 0.0)  # m/K, |coefficient| drawn in range
    temperature_range: float = 20.0  # K, the annual swing of the temperature series

    def with_seed(self, seed: int) -> Family:
        return replace(self, seed=seed)


def _exponential_field(rng, shape, length_px, n_fields):
    """``n_fields`` zero-mean unit-variance fields with covariance ``exp(-r / length)``."""
    pad = [int(2 ** np.ceil(np.log2(s + 2 * length_px))) for s in shape]
    ky = np.fft.fftfreq(pad[0])[:, None]
    kx = np.fft.rfftfreq(pad[1])[None, :]
    k = 2 * np.pi * np.hypot(ky, kx)
    # 2-D power spectrum of exp(-r/L): 2 pi L^2 / (1 + (k L)^2)^(3/2)
    amplitude = np.sqrt(2 * np.pi * length_px**2 / (1.0 + (k * length_px) ** 2) ** 1.5)
    out = np.empty((n_fields, *shape), dtype=np.float64)
    for i in range(n_fields):
        white = rng.standard_normal(pad)
        field = np.fft.irfft2(np.fft.rfft2(white) * amplitude, s=pad)[: shape[0], : shape[1]]
        out[i] = field
    out -= out.mean(axis=(1, 2), keepdims=True)
    out /= out.std(axis=(1, 2), keepdims=True)
    return out


def _padded(shape, reach_px):
    return [int(2 ** np.ceil(np.log2(s + 2 * reach_px))) for s in shape]


def _screen_spectrum(family, pad):
    """Amplitude (square root of the 2-D power spectrum, any scale) of ``family``'s
    non-exponential screens on the ``rfft2`` grid of ``pad`` pixels.

    - ``gaussian``: covariance ``exp(-(r / L)^2)``, spectrum ``exp(-k^2 L^2 / 4)``;
    - ``power-law``: von Karman spectrum ``(k^2 + k0^2)^(-(slope + 1) / 2)``, ``k0 = 2 pi /
      outer``: a 1-D spectrum of slope ``-5/3`` (structure function ``r^(2/3)``, the thin
      turbulent layer of scales above a few km) or ``-8/3`` (``r^(5/3)``, 3-D Kolmogorov
      turbulence at 0.5-2 km), Hanssen (2001) section 4.7; the covariance a Matern one;
    - ``anisotropic``: ``exp(-sqrt((u / L)^2 + (v / (ratio L))^2))``, ``(u, v)`` the
      coordinates along and across the long axis at ``angle`` from range; spectrum
      ``(1 + (k_u L)^2 + (k_v ratio L)^2)^(-3/2)``.
    """
    f = family
    ky = 2 * np.pi * np.fft.fftfreq(pad[0])[:, None]
    kx = 2 * np.pi * np.fft.rfftfreq(pad[1])[None, :]
    length = f.aps_length / PIXEL
    if f.atmosphere == "gaussian":
        power = np.exp(-(ky**2 + kx**2) * length**2 / 4.0)
    elif f.atmosphere == "power-law":
        k0 = 2 * np.pi / (f.aps_outer / PIXEL)
        power = (ky**2 + kx**2 + k0**2) ** (-(f.aps_slope + 1.0) / 2.0)
    elif f.atmosphere == "anisotropic":
        angle = np.deg2rad(f.aps_angle)
        ku = np.cos(angle) * kx + np.sin(angle) * ky
        kv = -np.sin(angle) * kx + np.cos(angle) * ky
        power = (1.0 + (ku * length) ** 2 + (kv * f.aps_ratio * length) ** 2) ** -1.5
    else:
        raise ValueError(f"family {f.name}: atmosphere expected 'exponential', 'gaussian', "
                         f"'power-law' or 'anisotropic', found {f.atmosphere!r}")
    return np.sqrt(power)


def _screen_pad(family):
    f = family
    reach = {"gaussian": 2 * f.aps_length, "power-law": f.aps_outer,
             "anisotropic": 2 * f.aps_length}[f.atmosphere]
    return _padded(f.shape, reach / PIXEL)


def _spectral_fields(rng, family, n_fields):
    """``n_fields`` zero-mean fields of unit *ensemble* variance with the spectrum of
    :func:`_screen_spectrum` (FFT synthesis on a padded grid, cropped: not periodic over the
    scene). Scaled by the generator's exact variance, not each field's sample std, so that
    :func:`screen_correlation` is their exact covariance."""
    pad = _screen_pad(family)
    amplitude = _screen_spectrum(family, pad)
    scale = 1.0 / np.sqrt(_correlation_table(family)[0, 0])
    shape = family.shape
    out = np.empty((n_fields, *shape), dtype=np.float64)
    for i in range(n_fields):
        white = rng.standard_normal(pad)
        out[i] = np.fft.irfft2(np.fft.rfft2(white) * amplitude, s=pad)[: shape[0], : shape[1]]
    return out * scale


@functools.lru_cache(maxsize=8)
def _correlation_table(family):
    """The generator's exact covariance per lag (pad grid, lags modulo the pad): the inverse
    FFT of the squared amplitude, ``E[x_a x_b] = irfft2(A^2)[a - b]`` for white input."""
    pad = _screen_pad(family)
    return np.fft.irfft2(_screen_spectrum(family, pad) ** 2, s=pad)


def screen_correlation(family: Family, azimuth, range_) -> np.ndarray:
    """Correlation ``(N, N)`` of ``family``'s screens between the pixels ``(azimuth, range)``:
    ``exp(-d / L)`` for exponential screens; for the others the generator's exact covariance
    per lag (:func:`_correlation_table`), relative to its variance."""
    if family.atmosphere == "exponential":
        pos = np.column_stack([azimuth, range_]) * PIXEL
        dist = np.hypot(pos[:, None, 0] - pos[None, :, 0], pos[:, None, 1] - pos[None, :, 1])
        return np.exp(-dist / family.aps_length)
    table = _correlation_table(family)
    d_az = np.subtract.outer(azimuth, azimuth) % table.shape[0]
    d_rg = np.subtract.outer(range_, range_) % table.shape[1]
    return table[d_az, d_rg] / table[0, 0]


def _terrain(rng, family):
    """Terrain height raster (m): a Gaussian-covariance field of ``terrain_std`` and
    ``terrain_length``, plus a slope across azimuth of the same relief (valley to ridge)."""
    f = family
    terrain_family = replace(f, atmosphere="gaussian", aps_length=f.terrain_length)
    field = _spectral_fields(rng, terrain_family, 1)[0]
    field = (field - field.mean()) / field.std()
    slope = np.linspace(-1.0, 1.0, f.shape[0])[:, None]
    return f.terrain_std * (field + slope)


def make_scene(family: Family) -> tuple[xr.Dataset, dict]:
    """SLC stack ``(azimuth, range, time)`` of one scene and its truth.

    Returns the stack (``complex`` complex64, ``h2ph`` float32 per pixel and epoch, attrs
    ``wavelength``, 10 m ``azimuth_spacing``/``range_spacing``, ``mother_time`` = the middle
    epoch) and a truth dict of per-PS arrays: ``azimuth``, ``range``, ``velocity`` (m/yr),
    ``height_error`` (m), ``aps`` (rad, PS x epoch, zero at the mother), ``noise`` (rad, PS x
    epoch, interferometric: zero at the mother), ``h2ph`` (PS x epoch), ``years``.
    """
    f = family
    rng = np.random.default_rng(
        np.random.SeedSequence([20261130, f.seed, zlib.crc32(f.name.encode())]))
    n_az, n_rg = f.shape
    T = f.n_epochs
    mother = T // 2
    time = np.datetime64("2021-01-04") + np.arange(T) * np.timedelta64(f.revisit_days, "D")
    years = (time - time[mother]) / np.timedelta64(1, "D") / 365.25

    # PS positions: a random subset of pixels
    n_ps = int(round(f.ps_fraction * n_az * n_rg))
    flat = np.sort(rng.choice(n_az * n_rg, n_ps, replace=False))
    az, rg = np.divmod(flat, n_rg)

    # geometry: 1 / (R sin theta) varies linearly by h2ph_variation across range
    factor = (1.0 / (SLANT_RANGE * np.sin(INCIDENCE))) * (
        1.0 + f.h2ph_variation * (np.arange(n_rg) / max(n_rg - 1, 1) - 0.5))
    bperp = rng.normal(0.0, BPERP_STD, T)
    bperp -= bperp[mother]
    h2ph_rg = factor[:, None] * bperp[None, :]                      # (range, time)

    # deformation: bowl + planar ramp
    yy = (az - n_az / 2) / n_az
    xx = (rg - n_rg / 2) / n_rg
    bowl = -f.velocity_max * np.exp(-((yy - 0.1) ** 2 + (xx + 0.15) ** 2) / (2 * 0.18**2))
    velocity = bowl + f.ramp * (0.6 * xx + 0.8 * yy)
    motion = _nonlinear_motion(f, time, n_ps)

    # height errors: white, or one DEM error per block of buildings (plus 10 % white)
    if f.height_blocks > 0:
        size = max(1, int(round(f.height_blocks / PIXEL)))
        blocks = rng.normal(0.0, f.height_std, ((n_az // size) + 1, (n_rg // size) + 1))
        height = blocks[az // size, rg // size] + rng.normal(0.0, 0.1 * f.height_std, n_ps)
    else:
        height = rng.normal(0.0, f.height_std, n_ps)

    # atmosphere: one field per epoch (exponential covariance unless the family says another),
    # plus k_t * terrain height where the family is stratified; relative to the mother
    if f.atmosphere == "exponential":
        screens = f.aps_std * _exponential_field(rng, f.shape, f.aps_length / PIXEL, T)
    else:
        screens = f.aps_std * _spectral_fields(rng, f, T)
    aps = screens[:, az, rg].T
    terrain = None
    if f.stratified_rate > 0:
        terrain = _terrain(rng, f)
        rate = rng.normal(0.0, f.stratified_rate, T)
        aps = aps + terrain[az, rg][:, None] * rate[None, :]
    aps = aps - aps[:, mother:mother + 1]

    slc_noise = rng.normal(0.0, f.noise_std, (n_ps, T))
    noise = slc_noise - slc_noise[:, mother:mother + 1]
    h2ph = h2ph_rg[rg]
    scatterer = rng.uniform(-np.pi, np.pi, n_ps)
    phase = (scatterer[:, None] + M2PH * (velocity[:, None] * years[None, :]
                                          + h2ph * height[:, None] + motion["displacement"])
             + aps + slc_noise)
    nad = rng.uniform(0.08, 0.2, n_ps)
    gain = np.exp(rng.uniform(np.log(3.0), np.log(20.0), n_ps))
    ps_amp = gain[:, None] * np.abs(1.0 + nad[:, None] * rng.standard_normal((n_ps, T)))

    # clutter everywhere else: circular Gaussian (Rayleigh amplitude, NAD about 0.52)
    slc = ((rng.standard_normal((n_az, n_rg, T), dtype=np.float32)
            + 1j * rng.standard_normal((n_az, n_rg, T), dtype=np.float32))
           * np.float32(np.sqrt(0.5))).astype(np.complex64)
    # SLC phases -4 pi R / wavelength (docs/concepts.md): the conjugate of the model's, and the
    # stack's h2ph per SLC (SNAP's sign) minus the interferograms' h2ph_rg
    slc[az, rg] = (ps_amp * np.exp(-1j * phase)).astype(np.complex64)
    h2ph_stack = np.broadcast_to(-h2ph_rg[None].astype(np.float32), (n_az, n_rg, T))
    stack = xr.Dataset(
        {"complex": (("azimuth", "range", "time"), slc),
         "h2ph": (("azimuth", "range", "time"), h2ph_stack)},
        coords={"azimuth": np.arange(n_az), "range": np.arange(n_rg), "time": time},
        attrs={"wavelength": WAVELENGTH, "azimuth_spacing": PIXEL, "range_spacing": PIXEL,
               "mother_time": str(time[mother]), "scene_family": f.name})
    truth = {"azimuth": az, "range": rg, "velocity": velocity, "height_error": height,
             "aps": aps, "noise": noise, "h2ph": h2ph, "years": years, "family": asdict(f),
             **motion}
    # the interferometric phase without the scatterer's own: what unwrapping must recover
    truth["unwrapped"] = (M2PH * (velocity[:, None] * years[None, :] + h2ph * height[:, None]
                                  + motion["displacement"]
                                  - motion["displacement"][:, mother:mother + 1])
                          + aps + noise)
    if terrain is not None:
        # a DEM in radar geometry, as the readers give it: the coordinate ``height`` (m)
        stack = stack.assign_coords(height=(("azimuth", "range"), terrain.astype(np.float32),
                                            {"units": "m"}))
        truth["terrain_height"] = terrain[az, rg]
    return stack, truth


def _nonlinear_motion(f: Family, time: np.ndarray, n_ps: int) -> dict:
    """Seasonal and thermal displacement of each PS (m, PS x epoch), their coefficients, and
    the temperature series (K): an annual swing of ``temperature_range`` peaking in mid-July
    plus weather of 2.5 K std. Drawn from a stream keyed on the seed alone."""
    rng = np.random.default_rng(np.random.SeedSequence([20261202, f.seed]))
    day = (time - time.astype("datetime64[Y]")) / np.timedelta64(1, "D")
    calendar = ((time - np.datetime64(str(time.min())[:4] + "-01-01"))
                / np.timedelta64(1, "D") / 365.25)
    temperature = (12.0 + 0.5 * f.temperature_range * np.cos(2 * np.pi * (day - 196) / 365.25)
                   + rng.normal(0.0, 2.5, len(time)))
    amplitude = rng.uniform(*f.seasonal_amplitude, n_ps)
    peak = rng.uniform(0.0, 2 * np.pi, n_ps)
    seasonal_sin, seasonal_cos = amplitude * np.cos(peak), amplitude * np.sin(peak)
    thermal = rng.uniform(*f.thermal_coefficient, n_ps) * rng.choice([-1.0, 1.0], n_ps)
    anomaly = temperature - temperature.mean()
    displacement = (seasonal_sin[:, None] * np.sin(2 * np.pi * calendar)[None, :]
                    + seasonal_cos[:, None] * np.cos(2 * np.pi * calendar)[None, :]
                    + thermal[:, None] * anomaly[None, :])
    return {"displacement": displacement, "seasonal_sin": seasonal_sin,
            "seasonal_cos": seasonal_cos, "thermal": thermal, "temperature": temperature,
            "calendar": calendar}


def write_temperature(truth: dict, time: np.ndarray, path) -> str:
    """The truth's temperature series as the CSV ``model.temperature`` reads; its path."""
    lines = ["date,temperature"] + [f"{str(t)[:10]},{value:.3f}"
                                    for t, value in zip(time, truth["temperature"])]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return str(path)


def motion_bounds(truth: dict, which: np.ndarray, columns: dict) -> dict:
    """Cramer-Rao bound (std) of each coefficient of the full model ``[t, h2ph, 1] +
    columns`` (name to (T,) regressor) on PS ``which``, for errors white in time of the
    scene's noise and screen variance per epoch (the phase with its atmosphere, as the
    chain's final fit sees it): the root mean over the PS of each coefficient's variance."""
    f = truth["family"]
    h2ph, years = truth["h2ph"][which], truth["years"]
    n, T = h2ph.shape
    variance = f["noise_std"] ** 2 + f["aps_std"] ** 2  # rad^2, per epoch
    design = np.stack([np.broadcast_to(years, (n, T)), h2ph, np.ones((n, T))]
                      + [np.broadcast_to(g, (n, T)) for g in columns.values()], axis=2)
    inverse = np.linalg.inv(np.einsum("ntp,ntq->npq", design, design))
    diagonal = variance / M2PH ** 2 * np.einsum("npp->np", inverse)
    names = ["velocity", "height_error", "offset"] + list(columns)
    return {name: float(np.sqrt(diagonal[:, i].mean())) for i, name in enumerate(names)}


def wrong_ambiguities(result: xr.Dataset, truth: dict) -> int:
    """PS of the result with at least one epoch a whole cycle off the true unwrapped phase
    (after the common reference series and each PS's constant are removed)."""
    idx = truth_index(truth, result["azimuth"].values, result["range"].values)
    ok = idx >= 0
    found = (result["unwrapped_phase"] + result["aps"]).transpose("space", "time").values[ok]
    difference = found.astype(np.float64) - truth["unwrapped"][idx[ok]]
    difference -= np.median(difference, axis=0)[None, :]  # the reference's series
    difference -= np.median(difference, axis=1)[:, None]  # each PS's constant
    return int((np.abs(np.rint(difference / (2 * np.pi))) > 0).any(axis=1).sum())


def _fit(h2ph, years, phase):
    """Per-point least squares of ``[m2ph t, m2ph h2ph_t, 1]`` to ``phase (N, T)``:
    returns ``(velocity, height)`` arrays."""
    n, T = phase.shape
    design = np.stack([np.broadcast_to(M2PH * years, (n, T)), M2PH * h2ph, np.ones((n, T))],
                      axis=2)                                         # (N, T, 3)
    normal = np.einsum("ntp,ntq->npq", design, design)
    rhs = np.einsum("ntp,nt->np", design, phase)
    solution = np.linalg.solve(normal, rhs[..., None])[..., 0]
    return solution[:, 0], solution[:, 1]


def _leak_rows(h2ph, years):
    """Rows ``g_i`` of the fit's pseudo-inverse that give the height error: ``(N, T)``."""
    n, T = h2ph.shape
    design = np.stack([np.broadcast_to(M2PH * years, (n, T)), M2PH * h2ph, np.ones((n, T))],
                      axis=2)
    normal = np.einsum("ntp,ntq->npq", design, design)
    return np.einsum("nq,ntq->nt", np.linalg.inv(normal)[:, 1, :], design)


def kriging_floor(truth: dict, which: np.ndarray) -> float:
    """Height RMSE (about the median) on PS ``which`` after the best linear prediction of the
    atmosphere's projection on the baselines from the oracle heights of *every* true PS, with
    the exact covariances of this generator (dense global kriging, true ambiguities).

    What any linear correction of the heights reaches at best: ``cov(leak_i, leak_j) =
    aps_std^2 rho(i, j) g_i . g_j`` (screens independent in time; the mother's common term
    falls in the offset), observation covariance that plus the heights' own (white, or shared
    per block) plus the noise leak ``noise_std^2 g_i . g_i``. ``rho`` is
    :func:`screen_correlation`: ``exp(-d_ij / aps_length)`` for exponential screens, and for
    the Gaussian, power-law and anisotropic ones the generator's exact covariance per lag (the
    inverse FFT of its squared spectral amplitude on the padded grid, so the finite grid and
    the outer scale of power-law screens are in it: no structure function or ensemble estimate
    is needed). A stratified family adds ``stratified_rate^2 z_i z_j g_i . g_j`` with ``z`` the
    terrain height at each PS (the raster is given, ``k_t`` independent in time).
    """
    f = truth["family"]
    g = _leak_rows(truth["h2ph"], truth["years"])
    gram = g @ g.T
    correlation = screen_correlation(Family(**{**f, "shape": tuple(f["shape"])}),
                                     truth["azimuth"], truth["range"])
    leak_cov = f["aps_std"] ** 2 * correlation * gram
    del correlation
    if f["stratified_rate"] > 0:
        # k_t independent in time; the mother's k * height falls in the offset
        terrain = truth["terrain_height"]
        leak_cov += f["stratified_rate"] ** 2 * np.outer(terrain, terrain) * gram
    if f["height_blocks"] > 0:
        size = max(1, int(round(f["height_blocks"] / PIXEL)))
        block = (truth["azimuth"] // size) * 100000 + truth["range"] // size
        height_cov = (f["height_std"] ** 2 * (block[:, None] == block[None, :])
                      + np.diag(np.full(len(block), (0.1 * f["height_std"]) ** 2)))
    else:
        height_cov = np.diag(np.full(len(g), f["height_std"] ** 2))
    cov = leak_cov + height_cov + f["noise_std"] ** 2 * np.diag(np.diag(gram))
    del height_cov
    _, observed = _fit(truth["h2ph"], truth["years"], truth["noise"] + truth["aps"])
    observed = observed + truth["height_error"]
    from scipy.linalg import cho_factor, cho_solve

    predicted = leak_cov @ cho_solve(cho_factor(cov, lower=True, overwrite_a=True),
                                     observed - observed.mean())
    return _rms_about_median((observed - predicted - truth["height_error"])[which])


def _rms_about_median(error):
    error = np.asarray(error, dtype=np.float64)
    return float(np.sqrt(np.mean((error - np.median(error)) ** 2)))


def truth_index(truth: dict, azimuth, range_) -> np.ndarray:
    """Index into the truth's PS of each (azimuth, range); -1 where the pixel is no PS."""
    n_rg = int(truth["range"].max()) + 1 if len(truth["range"]) else 1
    n_rg = max(n_rg, int(np.max(range_)) + 1)
    keys = truth["azimuth"].astype(np.int64) * n_rg + truth["range"]
    query = np.asarray(azimuth, np.int64) * n_rg + np.asarray(range_, np.int64)
    pos = np.searchsorted(keys, query)
    pos = np.minimum(pos, len(keys) - 1)
    return np.where(keys[pos] == query, pos, -1)


def oracle_floors(truth: dict, which: np.ndarray) -> dict:
    """Velocity and height RMSE (about the median) of the two oracle fits on PS ``which``."""
    h2ph, years = truth["h2ph"][which], truth["years"]
    noise = truth["noise"][which]
    v_n, h_n = _fit(h2ph, years, noise)
    v_a, h_a = _fit(h2ph, years, noise + truth["aps"][which])
    return {"velocity_noise": _rms_about_median(v_n), "height_noise": _rms_about_median(h_n),
            "velocity_nocorr": _rms_about_median(v_a), "height_nocorr": _rms_about_median(h_a)}


def score(result: xr.Dataset, truth: dict, *, min_coherence: float = 0.8) -> dict:
    """A chain result against the truth: RMSEs on coherent true PS, floors on the same PS,
    the fraction of true PS in the result and NaN counts."""
    idx = truth_index(truth, result["azimuth"].values, result["range"].values)
    coherent = (result["temporal_coherence"].values >= min_coherence) & (idx >= 0)
    which = idx[coherent]
    v_err = result["velocity"].values[coherent] - truth["velocity"][which]
    h_err = result["height_error"].values[coherent] - truth["height_error"][which]
    n_nan = sum(int(np.isnan(result[v].values).sum())
                for v in ("velocity", "height_error", "displacement", "temporal_coherence"))
    figures = {
        "n_true_ps": int(len(truth["azimuth"])),
        "true_ps_in_result": int((idx >= 0).sum()),
        "false_points_in_result": int((idx < 0).sum()),
        "coherent_true_ps": int(coherent.sum()),
        "velocity_rmse": _rms_about_median(v_err),
        "height_rmse": _rms_about_median(h_err),
        "n_nan": n_nan,
    }
    figures.update(oracle_floors(truth, which))
    return figures


def format_figures(figures: dict) -> str:
    """One line: velocity in mm/yr and height in m, each with its two floors."""
    f = figures
    return (f"velocity {f['velocity_rmse'] * 1e3:.2f} mm/yr (floors {f['velocity_noise'] * 1e3:.2f}"
            f" / {f['velocity_nocorr'] * 1e3:.2f}), height {f['height_rmse']:.2f} m (floors "
            f"{f['height_noise']:.2f} / {f['height_nocorr']:.2f}), true PS in result "
            f"{f['true_ps_in_result']}/{f['n_true_ps']}, coherent {f['coherent_true_ps']}, "
            f"false {f['false_points_in_result']}, NaN {f['n_nan']}")


#: The issue's three families (first: h2ph varying across range).
ISSUE_FAMILIES = (
    Family("issue-a", shape=(500, 500), n_epochs=60, revisit_days=12, aps_std=1.0,
           aps_length=400.0, ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4),
    Family("issue-b", shape=(400, 400), n_epochs=90, revisit_days=6, aps_std=1.5,
           aps_length=1500.0, ps_fraction=0.015, noise_std=0.5, h2ph_variation=0.0),
    Family("issue-c", shape=(400, 400), n_epochs=30, revisit_days=24, aps_std=0.5,
           aps_length=200.0, ps_fraction=0.03, noise_std=0.3, h2ph_variation=0.0),
)

#: Families of the default test suite (3 km x 3 km, a few thousand PS): what real scenes vary.
FAST_FAMILIES = (
    Family("short-weak", shape=(300, 300), n_epochs=30, revisit_days=24, aps_std=0.5,
           aps_length=200.0, ps_fraction=0.03, noise_std=0.3, h2ph_variation=0.4, seed=1),
    Family("long-strong", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=2.0,
           aps_length=3000.0, ps_fraction=0.02, noise_std=0.4, h2ph_variation=0.2,
           ramp=0.008, seed=2),
    Family("dense-6-day", shape=(250, 250), n_epochs=120, revisit_days=6, aps_std=1.0,
           aps_length=800.0, ps_fraction=0.05, noise_std=0.5, h2ph_variation=0.4, seed=3),
    Family("sparse", shape=(400, 400), n_epochs=90, revisit_days=12, aps_std=1.5,
           aps_length=1500.0, ps_fraction=0.01, noise_std=0.35, h2ph_variation=0.0, seed=4),
    Family("building-blocks", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=1.0,
           aps_length=400.0, ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4,
           height_blocks=200.0, seed=5),
)

#: Larger families for the slow tests: the issue's three, and correlated DEM errors at size.
SLOW_FAMILIES = ISSUE_FAMILIES + (
    Family("building-blocks-large", shape=(500, 500), n_epochs=60, revisit_days=12,
           aps_std=1.0, aps_length=400.0, ps_fraction=0.03, noise_std=0.35,
           h2ph_variation=0.4, height_blocks=300.0, seed=6),
)

#: Atmospheres we have not tuned to, white height errors: smooth (Gaussian), turbulent
#: power-law screens of both regimes, anisotropic, and a stratified part on a terrain raster.
ATMOSPHERE_FAMILIES = (
    Family("gaussian", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=1.0,
           aps_length=600.0, ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4,
           atmosphere="gaussian", seed=11),
    Family("power-law-5/3", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=0.6,
           ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4, atmosphere="power-law",
           aps_slope=5.0 / 3.0, aps_outer=3000.0, seed=12),
    Family("power-law-8/3", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=1.5,
           ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4, atmosphere="power-law",
           aps_slope=8.0 / 3.0, aps_outer=3000.0, seed=13),
    Family("anisotropic", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=1.0,
           aps_length=1500.0, ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4,
           atmosphere="anisotropic", aps_ratio=0.15, aps_angle=30.0, seed=14),
    Family("stratified", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=0.5,
           aps_length=400.0, ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4,
           stratified_rate=0.004, terrain_std=150.0, terrain_length=800.0, seed=15),
)


# --- small simulated point STMs through depsi.simulate (the chain's unit tests share them) ---

PS_NOISE = 0.3  # rad per SLC epoch in the simulator; an arc carries sqrt(2) of it per epoch


def predicted_arc_std(points):
    """Std of an arc's (velocity, height error) from its LSQ covariance with noise
    sqrt(2) * PS_NOISE per epoch (the mother's noise is a constant, absorbed by the offset)."""
    m2ph = -4 * np.pi / points.attrs["wavelength"]
    years = years_since_mother(points)
    h2ph = points.h2ph.values.mean(axis=0)
    design = np.column_stack([m2ph * years, m2ph * h2ph, np.ones_like(years)])
    cov = 2 * PS_NOISE**2 * np.linalg.inv(design.T @ design)
    return np.sqrt(cov[0, 0]), np.sqrt(cov[1, 1])


@functools.lru_cache(maxsize=8)
def _simulated(shape, n_epochs, seed, ps_fraction, aps_std, ps_noise_std, height_error_std,
               velocity_max):
    from depsi.simulate import PIXEL_SPACING, simulate_stack

    stack, truth = simulate_stack(shape=shape, n_epochs=n_epochs, seed=seed,
                                  ps_fraction=ps_fraction, aps_std=aps_std,
                                  ps_noise_std=ps_noise_std, height_error_std=height_error_std,
                                  velocity_max=velocity_max)
    stack, truth = stack.compute(), truth.compute()
    az, rg = np.nonzero(truth["ps_mask"].values)
    mother = int(np.flatnonzero(stack.time.values == np.datetime64(stack.attrs["mother_time"]))[0])
    slc = stack["complex"].values[az, rg]
    h2ph = stack["h2ph"].values[az, rg]
    ifg = slc[:, mother:mother + 1] * np.conj(slc)
    coords = {"azimuth": ("space", az.astype(np.int64)), "range": ("space", rg.astype(np.int64)),
              "lat": ("space", stack["lat"].values[az, rg]),
              "lon": ("space", stack["lon"].values[az, rg]), "time": stack["time"].values}
    # phase and h2ph are the interferograms' (slc_mother * conj(slc)), complex the SLCs': the
    # attribute has the chain take phase and h2ph as they are (the SLCs' own h2ph is minus
    # this one, zero at the mother)
    attrs = {"wavelength": stack.attrs["wavelength"], "mother_time": stack.attrs["mother_time"],
             "azimuth_spacing": PIXEL_SPACING[0], "range_spacing": PIXEL_SPACING[1],
             "interferogram": "phase and h2ph of slc_mother * conj(slc); complex: the SLCs"}
    points = xr.Dataset(
        {"complex": (("space", "time"), slc.astype(np.complex64)),
         "phase": (("space", "time"), np.angle(ifg).astype(np.float32)),
         "h2ph": (("space", "time"), (h2ph[:, mother:mother + 1] - h2ph).astype(np.float32)),
         "amplitude_dispersion": ("space", truth["amplitude_dispersion"].values[az, rg])},
        coords=coords, attrs=attrs)
    true = xr.Dataset(
        {"velocity": ("space", truth["velocity"].values[az, rg].astype(np.float64)),
         "height_error": ("space", truth["height_error"].values[az, rg].astype(np.float64)),
         "aps": (("space", "time"), truth["aps"].values[az, rg].astype(np.float64)),
         "displacement": (("space", "time"),
                          truth["displacement"].values[az, rg].astype(np.float64))},
        coords=coords, attrs={"ps_noise_std": ps_noise_std})
    return points, true


def simulated_points(*, shape=(100, 100), n_epochs=30, seed=1, ps_fraction=0.03, aps_std=1.0,
                     ps_noise_std=0.3, height_error_std=5.0, velocity_max=0.02):
    """Point STM of the true PS of a simulated stack, and their truth (cached, copies)."""
    points, true = _simulated(tuple(shape), n_epochs, seed, ps_fraction, aps_std, ps_noise_std,
                              height_error_std, velocity_max)
    return points.copy(deep=True), true.copy(deep=True)


# --- a mixed PS + DS scene: depsi.simulate's DS patches beside its PS --------------------------

#: The mixed scene of the DS tests: 1 km x 1 km, 30 epochs, about 300 PS and three 24 x 24
#: patches of distributed scatterers; an atmosphere of 0.5 rad so that the phase noise is not
#: hidden under it (both floors matter).
MIXED_SCENE = {"shape": (100, 100), "n_epochs": 30, "seed": 5, "ps_fraction": 0.03,
               "aps_std": 0.5, "ds_regions": 3, "ds_region_size": 24}


@functools.lru_cache(maxsize=2)
def _mixed(items):
    from depsi.simulate import simulate_stack

    stack, truth = simulate_stack(**dict(items))
    return stack.compute(), truth.compute()


def mixed_scene(**overrides):
    """The stack and truth of :data:`MIXED_SCENE` (with ``overrides``), computed (cached,
    copies)."""
    stack, truth = _mixed(tuple(sorted({**MIXED_SCENE, **overrides}.items())))
    return stack.copy(deep=True), truth.copy(deep=True)


def _true_looks(truth: xr.Dataset, azimuth, range_, window) -> np.ndarray:
    """Pixels of each point's own DS patch (PS excepted) in its SHP window: the looks a
    perfect SHP test would give it."""
    half = (window[0] // 2, window[1] // 2)
    region = np.pad(np.where(truth["ps_mask"].values, -2, truth["ds_region"].values),
                    [(half[0],) * 2, (half[1],) * 2], constant_values=-2)
    da_, dr = np.meshgrid(np.arange(window[0]), np.arange(window[1]), indexing="ij")
    cells = region[np.asarray(azimuth)[:, None] + da_.ravel(),
                   np.asarray(range_)[:, None] + dr.ravel()]
    own = truth["ds_region"].values[azimuth, range_]
    return (cells == own[:, None]).sum(axis=1)


def scatterer_floors(stack: xr.Dataset, truth: xr.Dataset, azimuth, range_, kind,
                     window=(11, 11)) -> dict:
    """Velocity floors (m/yr, RMS about the median) of the points at ``(azimuth, range_)`` of
    the mixed scene, per kind (``kind`` 0 PS, 1 DS), from its truth.

    A point's velocity is fitted by least squares with offset and height error: its error is
    ``g . e`` with ``g`` the velocity row of the fit's pseudo-inverse and ``e`` its phase error.
    *Noise floor*: ``sqrt(mean g C g)`` with ``C`` the phase noise covariance: ``sigma^2 I`` on
    a PS (``ps_noise_std`` per SLC epoch; the mother's noise is common, in the offset), and on a
    DS the Cramér-Rao bound of its linked phase, ``(2 L (|G|^-1 o |G| - I))^-1`` with the
    scene's true coherence ``|G|`` and ``L`` the pixels of its patch in its window (one epoch
    fixed; the offset takes it). *No-correction floor*: that and the fit of the true atmosphere
    at the point (its spatial spread, RMS about the median) added in quadrature.
    """
    from depsi.conventions import phase_per_metre, years_since
    from depsi.simulate.ds import exponential_coherence

    azimuth, range_, kind = (np.asarray(a) for a in (azimuth, range_, kind))
    time = stack["time"].values
    years = years_since(time, time[0])
    m2ph = phase_per_metre(stack.attrs["wavelength"])
    h2ph = stack["h2ph"].values[azimuth, range_].astype(np.float64)
    n, n_epochs = h2ph.shape
    design = np.stack([np.broadcast_to(m2ph * years, (n, n_epochs)), m2ph * h2ph,
                       np.ones((n, n_epochs))], axis=2)
    g = np.linalg.pinv(design)[:, 0, :]
    atmosphere = np.einsum("nt,nt->n", g, truth["aps"].values[azimuth, range_])
    days = (time - time[0]) / np.timedelta64(1, "D")
    coherence = exponential_coherence(days, gamma0=truth.attrs["ds_gamma0"],
                                      gamma_inf=truth.attrs["ds_gamma_inf"],
                                      tau_days=truth.attrs["ds_tau_days"])
    fisher = 2.0 * (np.linalg.inv(coherence) * coherence - np.eye(n_epochs))  # one look
    bound = np.zeros((n_epochs, n_epochs))
    bound[1:, 1:] = np.linalg.inv(fisher[1:, 1:])
    variance = np.where(kind == 0, truth.attrs["ps_noise_std"] ** 2 * (g**2).sum(axis=1), 0.0)
    ds = kind == 1
    looks = _true_looks(truth, azimuth[ds], range_[ds], window)
    variance[ds] = np.einsum("nt,ts,ns->n", g[ds], bound, g[ds]) / looks
    floors = {}
    for name, value in (("ps", 0), ("ds", 1)):
        which = kind == value
        noise = float(np.sqrt(variance[which].mean()))
        spread = _rms_about_median(atmosphere[which])
        floors[name] = {"noise": noise, "nocorr": float(np.hypot(noise, spread))}
    return floors


def integrated_result(n: int = 120_000, n_epochs: int = 30, seed: int = 0) -> xr.Dataset:
    """A first-order result as integration gives it (float32 series, every point kept), of
    random values at random grid positions: for what a step holds beside its input, not for
    accuracy."""
    rng = np.random.default_rng(seed)
    side = int(np.sqrt(n)) + 1
    azimuth, range_ = np.divmod(rng.permutation(side * side)[:n], side)
    time = np.datetime64("2020-01-01") + np.arange(n_epochs) * np.timedelta64(12, "D")
    return xr.Dataset(
        {"unwrapped_phase": (("space", "time"),
                             rng.normal(0, 3, (n, n_epochs)).astype(np.float32)),
         "velocity": ("space", rng.normal(0, 0.01, n).astype(np.float32)),
         "height_error": ("space", rng.normal(0, 5, n).astype(np.float32)),
         "h2ph": (("space", "time"), rng.normal(0, 1e-3, (n, n_epochs)).astype(np.float32)),
         "reference_phase": ("time", np.zeros(n_epochs, np.float32)),
         "in_network": ("space", np.ones(n, bool))},
        coords={"time": time, "azimuth": ("space", azimuth), "range": ("space", range_)},
        attrs={"wavelength": 0.0555, "mother_time": str(time[0]), "azimuth_spacing": 10.0,
               "range_spacing": 10.0})
