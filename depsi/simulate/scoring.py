"""A chain result scored against a simulated truth, with the floors physics sets on the same
points."""

from __future__ import annotations

import numpy as np
import xarray as xr

from depsi.conventions import phase_per_metre, wrap_phase


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
        Output of :func:`depsi.pipeline.chain.run_ps_chain` (``point_index`` into ``points``).
    points
        The point STM given to the chain (``complex`` or single-mother ``phase``, ``h2ph``).
    truth
        The truth of :func:`~depsi.simulate.simulate_stack`.

    Returns
    -------
    dict
        ``velocity_rmse`` (m/yr), ``height_rmse`` (m), their ``*_noise_floor`` and
        ``*_nocorr_floor``, ``n_compared`` and ``fraction_of_true_ps`` (true PS in the result
        over true PS in the scene).

    Examples
    --------
    >>> from depsi.pipeline.chain import run_ps_chain
    >>> from depsi.simulate import simulate_stack
    >>> from depsi.processing.selection import ps_selection
    >>> stack, truth = simulate_stack(shape=(100, 100), n_epochs=20, seed=1, ps_fraction=0.03)
    >>> ps = ps_selection(stack).compute()
    >>> figures = accuracy(run_ps_chain(ps, network={"first_order": 150}), ps, truth)
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

