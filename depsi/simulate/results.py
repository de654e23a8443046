"""A result-shaped STM of any size without running the chain: the variables, flags and
attributes of ``depsi run``'s ``stm.zarr`` with simple known values, for the viewer's tests and
benchmarks at 10^6 points.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depsi.conventions import years_since
from depsi.processing.motion_models import ModelConfig, temporal_model
from depsi.processing.scatterers import SCATTERER_ATTRS, SCATTERER_DTYPE
from depsi.simulate.scene import SCENE_CENTRE

#: Side of the square patch the points cover, degrees (about 11 km).
RESULT_SPAN_DEG = 0.1
#: The models a result-like point may keep, as the model step names them.
RESULT_MODELS = ("linear", "seasonal")


def result_like(n_points: int, *, n_epochs: int = 30, seed: int = 0,
                centre: tuple[float, float] = SCENE_CENTRE) -> xr.Dataset:
    """A result STM of ``n_points`` random points over a square around ``centre`` (lat, lon).

    Each point's displacement is exactly its velocity times the years since the first epoch
    plus its seasonal term (``seasonal_sin``/``seasonal_cos``, non-zero where it keeps the
    ``seasonal`` model) and noise of ``displacement_std``. A quarter of the points are
    distributed scatterers; the reference point is the one nearest to ``centre``.

    Examples
    --------
    >>> result = result_like(100, n_epochs=5)
    >>> dict(result.sizes), str(result["velocity"].attrs["units"])
    ({'space': 100, 'time': 5}, 'm/yr')
    """
    rng = np.random.default_rng(seed)
    lat0, lon0 = centre
    side = int(np.ceil(np.sqrt(n_points)))
    cell = rng.choice(side * side, n_points, replace=False)
    azimuth, range_ = cell // side, cell % side
    lat = lat0 + RESULT_SPAN_DEG * (azimuth / side - 0.5)
    lon = lon0 + RESULT_SPAN_DEG * (range_ / side - 0.5)
    time = np.datetime64("2021-01-01", "ns") + np.arange(n_epochs) * np.timedelta64(12, "D")
    years = years_since(time, time[0])
    distance = np.hypot(lat - lat0, (lon - lon0) * np.cos(np.radians(lat0))) / RESULT_SPAN_DEG
    # a subsidence bowl at the centre, uplift at the edges
    velocity = (-0.02 * np.exp(-((distance / 0.2) ** 2)) + 0.004 * distance
                + rng.normal(0, 0.001, n_points)).astype(np.float32)
    choice = (rng.random(n_points) < 0.3).astype(np.int8)
    seasonal_sin = np.where(choice == 1, rng.uniform(-0.005, 0.005, n_points), 0.0)
    seasonal_cos = np.where(choice == 1, rng.uniform(-0.005, 0.005, n_points), 0.0)
    seasonal = temporal_model(ModelConfig(terms=["seasonal"]), time).regressors
    std = rng.uniform(0.001, 0.004, n_points).astype(np.float32)
    displacement = (velocity[:, None] * years[None, :]
                    + seasonal_sin[:, None] * seasonal["seasonal_sin"][None, :]
                    + seasonal_cos[:, None] * seasonal["seasonal_cos"][None, :]
                    + rng.normal(0, 1, (n_points, n_epochs)) * std[:, None]).astype(np.float32)
    displacement[:, 0] = 0.0
    reference = int(np.argmin(distance))
    scatterer = (rng.random(n_points) < 0.25).astype(SCATTERER_DTYPE)
    model_flags = {"flag_values": np.arange(len(RESULT_MODELS), dtype=np.int8),
                   "flag_meanings": " ".join(RESULT_MODELS),
                   "long_name": "temporal model kept by the point's tests"}
    space = ("space",)
    return xr.Dataset(
        {
            "velocity": (space, velocity, {"units": "m/yr"}),
            "velocity_std": (space, rng.uniform(2e-4, 1e-3, n_points).astype(np.float32),
                             {"units": "m/yr"}),
            "height_error": (space, rng.normal(0, 3, n_points).astype(np.float32),
                             {"units": "m"}),
            "height_error_std": (space, rng.uniform(0.5, 2, n_points).astype(np.float32),
                                 {"units": "m"}),
            "temporal_coherence": (space, rng.beta(6, 2, n_points).astype(np.float32),
                                   {"units": "1"}),
            "scatterer": (space, scatterer, dict(SCATTERER_ATTRS)),
            "model_choice": (space, choice, model_flags),
            "seasonal_sin": (space, seasonal_sin.astype(np.float32), {"units": "m"}),
            "seasonal_cos": (space, seasonal_cos.astype(np.float32), {"units": "m"}),
            "in_reference_area": (space, distance < 0.03, {"units": "1"}),
            "displacement": (("space", "time"), displacement, {"units": "m"}),
            "displacement_std": (("space", "time"),
                                 np.broadcast_to(std[:, None], displacement.shape).copy(),
                                 {"units": "m"}),
        },
        coords={
            "time": ("time", time),
            "azimuth": (space, azimuth.astype(np.int64)),
            "range": (space, range_.astype(np.int64)),
            "lat": (space, lat, {"units": "degrees_north"}),
            "lon": (space, lon, {"units": "degrees_east"}),
            "point_index": (space, np.arange(n_points, dtype=np.int64)),
        },
        attrs={"wavelength": 0.0556, "reference": reference,
               "model_terms": ["seasonal"], "model_columns": ["seasonal_sin", "seasonal_cos"],
               "model_names": list(RESULT_MODELS)},
    )
