"""SAR imaging geometry from orbit state vectors: a stack's orbits and radar grid
(:mod:`~depsi.geometry.orbit`), the WGS84 ellipsoid (:mod:`~depsi.geometry.ellipsoid`),
range-Doppler geocoding, baselines, h2ph and the line of sight
(:mod:`~depsi.geometry.range_doppler`), the checks that refuse an impossible geometry
(:mod:`~depsi.geometry.checks`) and the geocoding of point STMs, on a DEM too
(:mod:`~depsi.geometry.geocoding`). The same laid on a raster stack is
:mod:`depsi.io.raster_geometry`.
"""

from depsi.geometry.checks import (
    INCIDENCE_RANGE,
    check_orbits_cover_epochs,
    check_scene_geometry,
)
from depsi.geometry.ellipsoid import ecef_to_geodetic, enu_basis, geodetic_to_ecef
from depsi.geometry.geocoding import (
    POINT_GEOMETRY,
    check_dem_covers,
    correct_positions,
    geocode_points,
    geocode_with_dem,
    open_dem,
)
from depsi.geometry.orbit import (
    GEOMETRY_ATTR,
    POSITIONS_ATTR,
    GeometryError,
    GeometryMode,
    LookSide,
    Orbit,
    RadarGrid,
    StackGeometry,
)
from depsi.geometry.range_doppler import (
    baselines,
    geo_to_radar,
    look_geometry,
    radar_to_geo,
    zero_doppler_time,
)

__all__ = [
    "GEOMETRY_ATTR",
    "INCIDENCE_RANGE",
    "POINT_GEOMETRY",
    "POSITIONS_ATTR",
    "GeometryError",
    "GeometryMode",
    "LookSide",
    "Orbit",
    "RadarGrid",
    "StackGeometry",
    "baselines",
    "check_dem_covers",
    "check_orbits_cover_epochs",
    "check_scene_geometry",
    "correct_positions",
    "ecef_to_geodetic",
    "enu_basis",
    "geo_to_radar",
    "geocode_points",
    "geocode_with_dem",
    "geodetic_to_ecef",
    "look_geometry",
    "open_dem",
    "radar_to_geo",
    "zero_doppler_time",
]
