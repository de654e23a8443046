"""How far GAMMA's ``sar_to_earth_center`` lies from the file's own state vectors, and from the
vectors of every other date of the stack, on the real Sentinel-1 headers of the test data.

    python scripts/gamma_orbit_radius.py

The first figure bounds what :data:`depsi.io.gamma.SAR_RADIUS_TOLERANCE` must accept, the second
what it must refuse (state vectors swapped between two dates' parameter files).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from depsi.io.gamma import _orbit
from depsi.io.gamma_par import parse_par

HEADERS = Path(__file__).resolve().parents[1] / "tests" / "data" / "gamma_s1_mexico" / "headers"


def main() -> None:
    pars = [parse_par(p) for p in sorted(HEADERS.glob("r*_VV_slc.par"))]
    orbits = [_orbit(par, "par") for par in pars]
    own, other = [], []
    for par in pars:
        for k, orbit in enumerate(orbits):
            position = orbit.state(np.array([par["center_time"]]))[0]
            gap = abs(float(np.linalg.norm(position)) - par["sar_to_earth_center"])
            (own if pars[k] is par else other).append(gap)
    print(f"{len(pars)} dates: own vectors within {max(own):.2e} m of sar_to_earth_center; "
          f"another date's vectors {min(other):.2f} to {max(other):.2f} m away")


if __name__ == "__main__":
    main()
