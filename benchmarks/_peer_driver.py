"""Driver of TU Delft DePSI 0.1.2's core chain for ``bench_peer.py``; runs in the peer's venv only.

Reads the SLC stack that ``bench_peer.py`` wrote to Zarr, runs ``ps_selection``,
``network_stm_selection``, ``form_network``, ``periodogram``, ``spatial_integration`` and
``estimate_model_params`` (no atmosphere step: the peer's core chain has none) and writes the
per-point velocity (m/yr) and height (m) with azimuth/range and the wall times to an ``.npz``.
It imports the *peer's* ``depsi``: never run it with our package on the path.

Usage: ``peer-venv/bin/python _peer_driver.py STORE OUT.npz PARAMS_JSON``.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version

import dask.array as da
import numpy as np
import xarray as xr
from depsi.arc_estimation import periodogram
from depsi.classification import network_stm_selection, ps_selection
from depsi.model_estimation import estimate_model_params
from depsi.network import form_network, spatial_integration
from depsi.utils import stm_compute_single_time_differences

import depsi

PEER_VERSION = "0.1.2"


def _check_peer():
    found = version("depsi")
    if found != PEER_VERSION or "site-packages" not in depsi.__file__:
        raise RuntimeError(f"peer driver: expected TU Delft depsi {PEER_VERSION} from a venv's "
                           f"site-packages, found {found} at {depsi.__file__}")


def _read_stack(store):
    """The stack as the peer expects it: ``complex``, ``amplitude``, ``phase``, ``h2ph``."""
    slcs = xr.open_zarr(store)
    slcs = slcs.assign(
        amplitude=slcs["complex"].copy(data=da.absolute(slcs["complex"].data)),
        phase=slcs["complex"].copy(data=da.angle(slcs["complex"].data)))
    return slcs


def run(store, params):
    stages = {}
    start = last = time.perf_counter()
    cpu_start = time.process_time()

    def lap(name):
        nonlocal last
        now = time.perf_counter()
        stages[name] = now - last
        last = now

    slcs = _read_stack(store)
    mother = np.datetime64(slcs.attrs["mother_time"], "D")
    candidates = ps_selection(slcs, threshold=params["threshold"], method="nad",
                              output_chunks=10000, mem_persist=True)
    candidates = stm_compute_single_time_differences(
        candidates, single_difference_mother=str(mother).replace("-", ""))
    years = (candidates["time"].values - mother) / np.timedelta64(1, "D") / 365.25
    candidates = candidates.assign(temporal_baseline=("time", years))
    candidates.attrs["wavelength"] = float(slcs.attrs["wavelength"])
    n_candidates = candidates.sizes["space"]
    lap("ps_selection")

    # the peer's own workflow drops the mother epoch before the network: there sd_h2ph is 0 for
    # every arc and periodogram's height correction median(h2ph / mean h2ph) turns into NaN
    candidates = candidates.sel(time=candidates["time"] != candidates["time"].sel(time=mother))
    points = network_stm_selection(
        candidates, min_dist=params["min_dist"], sortby_var="time_selection_nad", crs="radar",
        azimuth_spacing=float(slcs.attrs["azimuth_spacing"]),
        range_spacing=float(slcs.attrs["range_spacing"])).compute()
    lap("network_stm_selection")

    arcs = form_network(points, key_phase="sd_phase", key_h2ph="sd_h2ph",
                        key_Btemporal="temporal_baseline", key_xcrds="azimuth",
                        key_ycrds="range", network_method=params["network_method"],
                        max_length=params["max_length"], min_links=params["min_links"],
                        num_partitions=params["num_partitions"], dphase_method="subtract")
    lap("form_network")

    _, ambiguities, _, _, coherence = periodogram(
        arcs, key_dphase="d_phase", key_h2ph="h2ph", key_Btemporal="Btemp")
    arcs["ambiguities"] = ambiguities
    arcs["temp_coh"] = coherence
    arcs = arcs.compute()
    lap("periodogram")

    _, integrated = spatial_integration(points, arcs, key_sdphase="sd_phase",
                                        threshold_arc_quality=params["min_arc_coherence"])
    lap("spatial_integration")

    estimated, _ = estimate_model_params(integrated, key_observations="unwrapped_phase",
                                         key_h2ph="sd_h2ph", key_time="temporal_baseline")
    estimated = estimated.compute()
    lap("estimate_model_params")
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start

    residual = estimated["phase_residuals"].values
    return {
        "azimuth": estimated["azimuth"].values, "range": estimated["range"].values,
        "velocity": estimated["pnt_velocity"].values, "height": estimated["pnt_height"].values,
        "model_coherence": np.abs(np.exp(1j * residual).mean(axis=1)),
        "seconds": seconds, "cpu_seconds": cpu_seconds, "n_candidates": n_candidates,
        "n_network_points": points.sizes["space"], "n_arcs": arcs.sizes["space"],
        "stages": json.dumps(stages), "peer_version": version("depsi"),
    }


def main(argv):
    store, out, params = argv[1], argv[2], json.loads(argv[3])
    _check_peer()
    np.savez(out, **run(store, params))


if __name__ == "__main__":
    main(sys.argv)
