"""CF-style attributes (``units``, ``long_name``, ``standard_name``) for what depsi writes.

:func:`with_cf_attributes` fills them in on a copy of a Dataset from one table, ``CF``, keyed by
depsi's conventional names (docs/design.md, "Data model"). Whatever depsi hands back goes through
it: the readers' stacks, ``ps_selection``, every step of the PS chain, ``estimate_model``, and
:func:`~depsi.io.store.save_stm` and the exports, so results in memory carry the units a saved store
has (``result.velocity.plot()`` labels its axis in m year-1) and the two cannot diverge. The steps'
algorithms never read attributes. Attributes a variable already has are kept.

Sign convention (docs/concepts.md): ``phase = m2ph * (displacement + h2ph * height_error)``
with ``m2ph = -4 pi / wavelength``; a positive line-of-sight displacement is a movement
towards the satellite, negative away from it (e.g. subsidence).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

import xarray as xr

logger = logging.getLogger(__name__)

#: Line-of-sight sign convention, stated once; written as the ``comment`` of LOS variables.
LOS_SIGN_CONVENTION = ("line of sight; positive towards the satellite, negative away from it "
                       "(phase = -4 pi / wavelength * displacement)")

_LOS = {"comment": LOS_SIGN_CONVENTION}

#: name -> attributes. ``units`` follow UDUNITS ("1" dimensionless, "m year-1"); datetime
#: coordinates get their units from the CF time encoding, so none here.
CF: dict[str, dict[str, str]] = {
    # coordinates
    "time": {"long_name": "acquisition time", "standard_name": "time"},
    "lat": {"units": "degrees_north", "long_name": "latitude", "standard_name": "latitude"},
    "lon": {"units": "degrees_east", "long_name": "longitude", "standard_name": "longitude"},
    "lat_uncorrected": {"units": "degrees_north",
                        "long_name": "latitude before the height-error correction"},
    "lon_uncorrected": {"units": "degrees_east",
                        "long_name": "longitude before the height-error correction"},
    "height": {"units": "m", "long_name": "height above the WGS84 ellipsoid"},
    "incidence_angle": {"units": "degree", "long_name": "incidence angle of the line of sight"},
    "heading": {"units": "degree",
                "long_name": "heading of the flight direction, clockwise from north"},
    "los_east": {"units": "1", "long_name": "east component of the unit vector to the satellite"},
    "los_north": {"units": "1",
                  "long_name": "north component of the unit vector to the satellite"},
    "los_up": {"units": "1", "long_name": "up component of the unit vector to the satellite"},
    "x": {"units": "m", "long_name": "projected x coordinate",
          "standard_name": "projection_x_coordinate"},
    "y": {"units": "m", "long_name": "projected y coordinate",
          "standard_name": "projection_y_coordinate"},
    "azimuth": {"units": "1", "long_name": "azimuth (line) pixel index"},
    "range": {"units": "1", "long_name": "range (column) pixel index"},
    "point_id": {"long_name": "point identifier"},
    "point_index": {"units": "1", "long_name": "index of the point among the PS candidates"},
    "source": {"units": "1", "long_name": "index of the arc's first point"},
    "target": {"units": "1", "long_name": "index of the arc's second point"},
    "bperp": {"units": "m", "long_name": "perpendicular baseline to the mother epoch"},
    "order": {"units": "1", "long_name": "network order of the point (1 first order)"},
    "edge_source": {"units": "1", "long_name": "index of the network arc's first point"},
    "edge_target": {"units": "1", "long_name": "index of the network arc's second point"},
    # observations
    "complex": {"units": "1", "long_name": "single-look complex value"},
    "amplitude": {"units": "1", "long_name": "SLC amplitude"},
    "phase": {"units": "rad", "long_name": "interferometric phase, wrapped to (-pi, pi]"},
    "unwrapped_phase": {"units": "rad", "long_name": "unwrapped interferometric phase"},
    "h2ph": {"units": "1", "long_name": "height-to-phase factor B_perp / (R sin(theta))"},
    "aps": {"units": "rad", "long_name": "atmospheric phase screen"},
    "aps_observed": {"units": "rad", "long_name": "atmospheric phase observed at the point"},
    "fo_aps_observed": {"units": "rad",
                        "long_name": "atmospheric phase observed at first-order points"},
    "fo_reference_phase": {"units": "rad", "long_name": "phase of the first-order reference"},
    "residual": {"units": "rad", "long_name": "phase residual of the model"},
    "reference_noise": {"units": "rad", "long_name": "phase noise of the reference point"},
    "reference_phase": {"units": "rad",
                        "long_name": "wrapped phase of the reference point (the datum)"},
    "ambiguity": {"units": "1", "long_name": "integer phase ambiguity (cycles)"},
    # amplitude statistics and selection
    "amplitude_mean": {"units": "1", "long_name": "mean amplitude over time"},
    "amplitude_std": {"units": "1", "long_name": "standard deviation of amplitude over time"},
    "amplitude_median": {"units": "1", "long_name": "median amplitude over time"},
    "amplitude_mad": {"units": "1", "long_name": "median absolute deviation of amplitude"},
    "amp_count": {"units": "1", "long_name": "number of epochs with an amplitude"},
    "amp_sum": {"units": "1", "long_name": "sum of amplitudes over time (for updates)"},
    "amp_sumsq": {"units": "1", "long_name": "sum of squared amplitudes over time (for "
                                             "updates)"},
    "amplitude_dispersion": {"units": "1", "long_name": "normalised amplitude dispersion "
                                                         "(std / mean)"},
    "amplitude_dispersion_mad": {"units": "1", "long_name": "normalised amplitude dispersion "
                                                             "(MAD / median)"},
    "selected": {"units": "1", "long_name": "selected as PS candidate"},
    # distributed scatterers (depsi.processing.scatterers)
    "scatterer": {"units": "1", "long_name": "kind of scatterer: persistent (ps) or "
                                             "distributed (ds)"},
    "shp_count": {"units": "1", "long_name": "statistically homogeneous pixels (looks)"},
    "linked_coherence": {"units": "1",
                         "long_name": "temporal coherence of the DS's linked phase (0..1)"},
    "linked_phase_std": {"units": "rad", "long_name": "Cramér-Rao bound of the DS's linked "
                                                      "phase"},
    "ps_mask": {"units": "1", "long_name": "true persistent scatterer (simulation)"},
    # results
    "velocity": {"units": "m year-1", "long_name": "line-of-sight velocity", **_LOS},
    "displacement": {"units": "m", "long_name": "line-of-sight displacement relative to the "
                                                "first epoch", **_LOS},
    "height_error": {"units": "m", "long_name": "height relative to the reference DEM"},
    "height_error_correlated": {"units": "m",
                                "long_name": "spatially correlated part of the height error"},
    "temporal_coherence": {"units": "1", "long_name": "temporal coherence (0..1)"},
    "in_reference_area": {"units": "1", "long_name": "point in the reference area"},
    "flag": {"units": "1", "long_name": "quality flag"},
    "in_network": {"units": "1", "long_name": "point kept by the network's arc testing"},
    "removal_reason": {"units": "1", "long_name": "why the point left the network (legend "
                                                  "in attrs)"},
    "arc_kept": {"units": "1", "long_name": "arc kept by the network's arc testing"},
    "arc_removal_reason": {"units": "1", "long_name": "why the arc left the network (legend "
                                                      "in attrs)"},
    "w_statistic": {"units": "1", "long_name": "w-test statistic of the arc"},
    "length": {"units": "m", "long_name": "arc length"},
    "coherence": {"units": "1", "long_name": "coherence (0..1)"},
    "arc_coherence": {"units": "1", "long_name": "ensemble coherence of the arc (0..1)"},
    "seasonal_amplitude": {"units": "m", "long_name": "seasonal displacement amplitude",
                           **_LOS},
    # temporal model (estimate_model): coefficients and their a-posteriori standard deviations
    "offset": {"units": "m", "long_name": "displacement at the first epoch (model offset)"},
    "seasonal_sin": {"units": "m", "long_name": "annual sine term of the displacement"},
    "seasonal_cos": {"units": "m", "long_name": "annual cosine term of the displacement"},
    "sigma2": {"units": "1", "long_name": "a-posteriori variance factor"},
    # the chain's model terms (depsi.processing.motion_models; steps and breakpoints are
    # named by their dates and carry their own units)
    "semi_annual_sin": {"units": "m", "long_name": "semi-annual sine term of the displacement"},
    "semi_annual_cos": {"units": "m",
                        "long_name": "semi-annual cosine term of the displacement"},
    "thermal": {"units": "m K-1", "long_name": "displacement per kelvin of temperature"},
    "model_choice": {"units": "1", "long_name": "temporal model kept by the point's tests"},
    "model_test_ratio": {"units": "1", "long_name": "F statistic of the kept model over its "
                                                    "critical value"},
}
CF.update({f"{name}_std": {"units": CF[name]["units"],
                            "long_name": f"a-posteriori standard deviation of {name}"}
           for name in ("offset", "velocity", "height_error", "seasonal_sin", "seasonal_cos",
                        "semi_annual_sin", "semi_annual_cos", "thermal")})
# the chain's per-point uncertainty (depsi.processing.model_fit.point_uncertainty): relative to
# the reference area, as the estimates are
CF["displacement_std"] = {"units": "m", "long_name": "a-posteriori standard deviation of "
                                                    "displacement (zero at the first epoch)"}
CF["height_error_correlated_std"] = {
    "units": "m", "long_name": "standard deviation of the atmosphere's leak left in the height "
                               "error after the correlated-height correction (kriging error)"}


#: Attributes of a datetime variable that xarray's CF time encoding writes itself.
_TIME_ENCODING = ("units", "calendar")


def cf_attributes(name: Hashable) -> dict[str, str]:
    """The CF attributes of ``name`` (a copy; empty when the table has no entry)."""
    return dict(CF.get(str(name), {}))


def _fallback(var: xr.Variable, name: Hashable) -> dict[str, str]:
    """Attributes for a name the table does not know: a long_name; units "1" only for flags
    and integers (depsi's integers are indices, counts and codes, all dimensionless)."""
    attrs = {"long_name": str(name).replace("_", " ")}
    if var.dtype.kind in "biu":
        attrs["units"] = "1"
    return attrs


def with_cf_attributes(ds: xr.Dataset) -> xr.Dataset:
    """A copy of ``ds`` with ``units``/``long_name``/``standard_name`` on every variable and
    coordinate that the table ``CF`` knows (existing attributes win).

    Numbers without an entry keep what they have and get a ``long_name`` from their name
    (booleans and integers, flags and indices, also ``units`` "1"); a numeric variable left
    without ``units`` is logged once. Datetime coordinates get no ``units`` attribute: xarray
    writes their CF time units itself on save, and a ``units`` attribute beside them would make
    the store fail to write. Strings (point ids) get none either. The copy is shallow: data,
    lazy or not, is shared, never computed.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"velocity": ("space", np.zeros(2, "f4"))})
    >>> with_cf_attributes(ds).velocity.attrs["units"]
    'm year-1'
    >>> ds.velocity.attrs
    {}
    """
    out = ds.copy()  # shallow: new variables share data, attrs are copied per variable
    missing = []
    for name, var in out.variables.items():
        wanted = cf_attributes(name) or _fallback(var, name)
        attrs = dict(var.attrs)
        if var.dtype.kind in "mM":
            wanted.pop("units", None)
            # time units in attrs (as some products give them) belong to the encoding:
            # xarray refuses to write a datetime variable with a units attribute
            moved = {k: attrs.pop(k) for k in _TIME_ENCODING if k in attrs}
            var.encoding = {**moved, **var.encoding}
        elif var.dtype.kind in "USO":
            wanted.pop("units", None)
        attrs = {**wanted, **attrs}
        var.attrs = attrs
        if var.dtype.kind in "biufc" and "units" not in attrs:
            missing.append(str(name))
    if missing:
        logger.info("no units known for %s; written without a units attribute", missing)
    return out
