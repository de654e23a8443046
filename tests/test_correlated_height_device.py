"""The correlated height's kriging on a device: the host's path is what it was, bit for bit
(to round-off where its compiled substitution runs); the device formulation, run on NumPy,
agrees with it to round-off; and asked for a CUDA device (a NumPy stand-in for CuPy in a child
process) the kriging and the network's neighbour search really run the device formulation on
device arrays, never the host's path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from depsi.kernels.backend import Device
from depsi.processing import correlated_height as module
from depsi.processing.correlated_height import _predict, kriging_devices

REPO = Path(__file__).resolve().parents[1]
SIGNAL = {"sill": 1.0, "range": 300.0, "shape": 1.5, "offset": 0.1}
NOISE = {"nugget": 1.0, "extra_sill": 0.3, "extra_range": 200.0}


# ---- the kriging batch as it was before the device path: the reference the host keeps -------
def _distances_before(a, b):
    dx = a[:, :, None, 0] - b[:, None, :, 0]
    dy = a[:, :, None, 1] - b[:, None, :, 1]
    dx *= dx
    dy *= dy
    dx += dy
    return np.sqrt(dx, out=dx)


def _signal_covariance_before(distance, signal):
    distance *= np.float32(1.0 / signal["range"])
    if signal["shape"] != 1.0:
        np.power(distance, np.float32(signal["shape"]), out=distance)
    np.negative(distance, out=distance)
    cov = np.exp(distance).astype(np.float64)
    cov *= signal["sill"]
    cov -= signal["offset"]
    return cov


def _krige_batch_before(nb, values, tp, valid, *, signal, noise, prior):
    k = nb.shape[1]
    nugget, extra_sill, extra_range = noise["nugget"], noise["extra_sill"], noise["extra_range"]
    d_nn = _distances_before(nb, nb)
    if extra_sill > 0:
        cov = extra_sill * np.exp(d_nn * np.float32(-1.0 / extra_range))
        cov += _signal_covariance_before(d_nn, signal)
    else:
        cov = _signal_covariance_before(d_nn, signal)
    del d_nn
    cov[:, np.arange(k), np.arange(k)] += nugget
    c_nt = _signal_covariance_before(_distances_before(nb, tp), signal)
    rhs = np.concatenate([values[..., None], c_nt], axis=2)
    try:
        lower = np.linalg.cholesky(cov)
        whitened = np.stack([solve_triangular(lower[b], rhs[b], lower=True, check_finite=False)
                             for b in range(len(lower))])
        predicted = np.einsum("bk,bkw->bw", whitened[..., 0], whitened[..., 1:])
        explained = np.einsum("bkw,bkw->bw", whitened[..., 1:], whitened[..., 1:])
    except np.linalg.LinAlgError:
        solved = np.linalg.solve(cov, rhs)
        predicted = np.einsum("bk,bkw->bw", solved[..., 0], c_nt)
        explained = np.einsum("bkw,bkw->bw", solved[..., 1:], c_nt)
    return predicted, np.where(valid, np.maximum(prior - explained, 0.0), 0.0)


def _scene(seed=5, n=6000):
    """Points over 4 km with a dense town: cells of very different fill."""
    rng = np.random.default_rng(seed)
    positions = np.concatenate([rng.uniform(0, 4000, (n - n // 3, 2)),
                                rng.normal(2000, 150, (n // 3, 2))])
    return positions, rng.standard_normal(n)


#: Relative tolerance, of the largest |prediction| or variance, of the host's kriging against
#: the batch before the device path where the compiled substitution runs
#: (:mod:`depsi.kernels.kriging_numba`: the same operations in another order). Measured:
#: 4.5e-15 on these scenes (k = 60), 5.7e-15 at k = 128; the substitution's error bound,
#: ``k eps cond(L)`` with the nugget keeping ``cond(L)`` to tens, is ~1e-12.
COMPILED_RTOL = 1e-12


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("extra_sill", [0.0, 0.3])
def test_host_kriging_is_the_batch_before_the_device_path(monkeypatch, extra_sill, compiled):
    """SciPy's solves (the reference, where Numba does not run): the batch before, bit for bit;
    the compiled substitution: that batch to round-off."""
    monkeypatch.setattr(module, "_compiled_kriging", lambda: compiled)
    positions, values = _scene()
    noise = NOISE | {"extra_sill": extra_sill}
    now = _predict(positions, values, positions[::2], signal=SIGNAL, noise=noise, k=60)
    monkeypatch.setattr(module, "_krige_batch", _krige_batch_before)
    before = _predict(positions, values, positions[::2], signal=SIGNAL, noise=noise, k=60)
    for got, expected in zip(now, before):
        if compiled:
            assert not np.array_equal(got, expected)  # the compiled pass ran
            np.testing.assert_allclose(got, expected, rtol=0,
                                       atol=COMPILED_RTOL * float(np.abs(expected).max()))
        else:
            np.testing.assert_array_equal(got, expected)


def test_without_a_cuda_device_the_kriging_takes_the_host_path():
    assert kriging_devices(["cpu"]) is None
    assert kriging_devices([Device("cpu", 0), Device("cpu", 1)]) is None


def _no_host_batch(*args, **kwargs):
    raise AssertionError("the device path ran the host's kriging batch")


@pytest.mark.parametrize("shape", [1.0, 1.5])
def test_device_kriging_on_numpy_agrees_with_the_host_to_1e10(monkeypatch, shape):
    positions, values = _scene(seed=9)
    signal = SIGNAL | {"shape": shape}
    monkeypatch.setattr(module, "_BATCH_ELEMENTS", 60 * 120 * 10)  # many batches, 2 devices
    host = _predict(positions, values, positions, signal=signal, noise=NOISE, k=60)
    monkeypatch.setattr(module, "_krige_batch", _no_host_batch)
    device = _predict(positions, values, positions, signal=signal, noise=NOISE, k=60,
                      placed=[Device("cpu", 0), Device("cpu", 1)])
    for got, expected in zip(device, host):
        assert np.isfinite(got).all() and expected.std() > 0
        np.testing.assert_allclose(got, expected, rtol=0,
                                   atol=1e-10 * float(np.abs(expected).max()))


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import xarray as xr
    from depsi.kernels import backend, neighbours
    from depsi.processing import correlated_height as module, network
    from depsi.processing.correlated_height import estimate_correlated_height

    seen = {"systems": [], "neighbours": []}
    solved = module._solved_systems
    def recording_solve(cov, *args):
        seen["systems"].append(backend.is_cupy_array(cov))
        return solved(cov, *args)
    nearest = neighbours.nearest_neighbours
    def recording_nearest(points, queries, k, **kwargs):
        seen["neighbours"].append(backend.is_cupy_array(points))
        return nearest(points, queries, k, **kwargs)
    host_batch = module._krige_batch
    def no_host_batch(*args, **kwargs):
        raise AssertionError("the device path ran the host's kriging batch")

    rng = np.random.default_rng(0)
    n, T = 3000, 20
    ds = xr.Dataset(
        {"height_error": ("space", rng.normal(0, 5, n)),
         "h2ph": (("space", "time"), np.tile(rng.normal(0, 2e-4, T), (n, 1)))},
        coords={"x": ("space", rng.uniform(0, 5000, n)), "y": ("space", rng.uniform(0, 5000, n)),
                "time": np.datetime64("2021-01-01") + 12 * np.arange(T).astype("timedelta64[D]")},
        attrs={"wavelength": 0.0555})
    kwargs = {"screen_variance": 1.0, "screen_range": 500.0}
    host = estimate_correlated_height(ds, devices=["cpu"], **kwargs)
    module._solved_systems, module._krige_batch = recording_solve, no_host_batch
    module.nearest_neighbours = network.nearest_neighbours = recording_nearest
    device = estimate_correlated_height(ds, devices=["cuda:0"], **kwargs)
    positions = network.point_positions(ds)
    edges_host = network.redundant_edges(positions)
    edges_device = network.redundant_edges(
        positions, device=network.search_device(["cuda:0"]))
    from depsi.pipeline.steps.network import with_edges
    searches = len(seen["neighbours"])
    step_host = with_edges(ds, network.NetworkConfig(), ["cpu"])
    step_device = with_edges(ds, network.NetworkConfig(), ["cuda:0"])
    scale = float(np.abs(host["height_error_correlated"].values).max())
    json.dump({
        "systems_on_device": seen["systems"], "neighbours_on_device": seen["neighbours"],
        "field_max_diff": float(np.abs(device["height_error_correlated"].values
                                       - host["height_error_correlated"].values).max()),
        "field_scale": scale,
        "edges_equal": all(np.array_equal(a, b) for a, b in zip(edges_host, edges_device)),
        "step_searches_on_device": len(seen["neighbours"]) - searches,
        "step_edges_equal": all(np.array_equal(step_host[name].values, step_device[name].values)
                                for name in ("edge_source", "edge_target")),
    }, sys.stdout)
""")


def test_a_cuda_device_runs_the_device_kriging_and_search_on_device_arrays(tmp_path):
    """With the NumPy stand-in for CuPy (tests/cupy_stand_in.py) a child process asks for
    ``cuda:0``: every kriging system and neighbour search (the kriging's, the network's, the
    network step's) sees device arrays, the host's batch is never called (it raises there),
    and the results are the host's."""
    package = tmp_path / "stand_in" / "cupy"
    package.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "cupy_stand_in.py", package / "__init__.py")
    path = os.pathsep.join(filter(None, [str(package.parent), str(REPO),
                                         os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _CHILD], env=os.environ | {"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["systems_on_device"] and all(seen["systems_on_device"])
    assert len(seen["neighbours_on_device"]) >= 2 and all(seen["neighbours_on_device"])
    assert seen["field_max_diff"] <= 1e-6 * seen["field_scale"]  # float32 outputs
    assert seen["edges_equal"]
    # the network step passes its devices down: its search ran once more, on the device
    assert seen["step_searches_on_device"] >= 1 and seen["step_edges_equal"]
