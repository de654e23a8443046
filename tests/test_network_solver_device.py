"""The network solver's device path: the dense factorisation of a tile and the sparse triangular
solves of the whole network, written over the array namespace, run here on NumPy (and in a
child process on the CuPy stand-in) and held to the host reference: the same values and
leverage to 1e-9, the same arcs rejected."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from depsi.kernels.backend import Device, cupy_available
from depsi.processing import arc_testing, integration, network_solver
from depsi.processing.arcs import estimate_arcs
from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network
from scenes import simulated_points

REPO = Path(__file__).resolve().parents[1]
#: The device formulation on NumPy.
NUMPY_DEVICE = Device("cpu")


def _grid_network(side=30, seed=11):
    """A grid with diagonals, random weights and 90 % of its arcs: a network's sparsity."""
    rng = np.random.default_rng(seed)
    grid = np.arange(side * side).reshape(side, side)
    pairs = np.vstack([np.c_[grid[:, :-1].ravel(), grid[:, 1:].ravel()],
                       np.c_[grid[:-1].ravel(), grid[1:].ravel()],
                       np.c_[grid[:-1, :-1].ravel(), grid[1:, 1:].ravel()]])
    weights = rng.uniform(0.5, 4.0, len(pairs))
    rhs = rng.normal(size=(len(pairs), 7)).astype(np.float32)
    kept = np.flatnonzero(rng.random(len(pairs)) < 0.9)
    return pairs[:, 0], pairs[:, 1], weights, rhs, kept, side * side


def _normal(side=30):
    source, target, weights, _, kept, n = _grid_network(side)
    A = network_solver.incidence_matrix(source[kept], target[kept], n)[:, 1:]
    return (A.T @ A.multiply(weights[kept][:, None])).tocsc()


def _assert_close(got, expected, rtol=1e-9):
    """Equal to ``rtol`` of the largest magnitude (values near zero have no relative error)."""
    np.testing.assert_allclose(got, expected, rtol=0, atol=rtol * np.max(np.abs(expected)))


@pytest.mark.parametrize("factor", [network_solver._DeviceDense, network_solver._DeviceLDL])
def test_device_factorisations_solve_as_the_host_one(factor):
    normal = _normal()
    rng = np.random.default_rng(1)
    solved = factor(normal, NUMPY_DEVICE)
    host = network_solver._factorise(normal)
    for b in (rng.normal(size=normal.shape[0]), rng.normal(size=(normal.shape[0], 21))):
        x = solved.solve(b)
        assert type(x) is np.ndarray and x.shape == b.shape
        _assert_close(x, host.solve(b))
        _assert_close(normal @ x, b)


def test_a_normal_matrix_that_is_not_positive_definite_is_refused():
    singular = sp.csc_matrix(np.array([[1.0, -1.0], [-1.0, 1.0]]))  # no reference removed
    with pytest.raises(np.linalg.LinAlgError):
        network_solver._DeviceDense(singular, NUMPY_DEVICE)


@pytest.mark.parametrize("dense", [True, False], ids=["tile (dense)", "whole network (LDL)"])
def test_network_solve_on_a_device_agrees_with_the_host(monkeypatch, dense):
    """Values, leverage by probes and the Woodbury update through the device's
    factorisation: the host's to 1e-9."""
    monkeypatch.setattr(network_solver, "EXACT_REDUNDANCY_POINTS", 10)  # the probes' solves
    monkeypatch.setattr(network_solver, "DEVICE_DENSE_MAX_UNKNOWNS", 10**6 if dense else 10)
    source, target, weights, rhs, kept, n = _grid_network()
    args = (source, target, weights, rhs, kept, n, np.ones(n, bool), 17)
    host = network_solver._NetworkSolve(*args)
    device = network_solver._NetworkSolve(*args, device=NUMPY_DEVICE)
    assert isinstance(device.lu, network_solver._DeviceDense if dense
                      else network_solver._DeviceLDL)
    _assert_close(device.values(), host.values())
    _assert_close(device.leverage(), host.leverage())
    removed = kept[[3, 40, 41, 700]]
    assert host.without(removed) and device.without(removed)
    _assert_close(device.values(), host.values())
    _assert_close(device.leverage(), host.leverage())


@pytest.mark.parametrize("columns", [64, 3])
def test_whole_networks_solution_in_place_on_a_device_agrees_with_the_host(monkeypatch,
                                                                           columns):
    """The whole network's one solve (``solution_only``) in groups of right-hand sides on
    the device: the host's values to 1e-9, NaN off the network, 0 at the reference."""
    monkeypatch.setattr(network_solver, "DEVICE_DENSE_MAX_UNKNOWNS", 10)
    monkeypatch.setattr(network_solver, "DEVICE_SOLVE_COLUMNS", columns)
    source, target, weights, rhs, kept, n = _grid_network()
    point_ok = np.ones(n, bool)
    point_ok[:30] = False  # the first row of the grid off the network
    kept = kept[point_ok[source[kept]] & point_ok[target[kept]]]
    args = (source, target, weights, rhs, kept, n, point_ok, 45)
    host = network_solver._NetworkSolve(*args, solution_only=True).values()
    got = network_solver._NetworkSolve(*args, solution_only=True, device=NUMPY_DEVICE).values()
    assert np.isnan(got[:30]).all() and (got[45] == 0).all()
    _assert_close(got[30:], host[30:])


def _scene_with_slips(shape=(200, 200), slips=30):
    points, _ = simulated_points(aps_std=0.0, shape=shape)
    arcs = estimate_arcs(form_network(points, method="redundant")).compute()
    bad = np.random.default_rng(5).choice(arcs.sizes["arc"], slips, replace=False)
    ambiguity = arcs["ambiguity"].values.copy()
    ambiguity[bad, -8:] += 1
    return points, arcs.assign(ambiguity=(arcs["ambiguity"].dims, ambiguity)), bad


def _spy_factorisations(monkeypatch, devices=None):
    """Counts of the factorisations built, by class name (and the devices given them, in
    ``devices``)."""
    built: dict[str, int] = {}
    for name in ("_DeviceDense", "_DeviceLDL", "_LDL", "_Cholesky"):
        cls = getattr(network_solver, name)

        def counting(self, *args, name=name, init=cls.__init__, **kwargs):
            built[name] = built.get(name, 0) + 1
            if devices is not None and len(args) > 1:
                devices.setdefault(name, set()).add(args[1])
            init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    return built


@pytest.mark.parametrize("tiled", [False, True], ids=["whole network", "tiles"])
def test_arc_testing_on_a_device_rejects_the_same_arcs_as_the_host(monkeypatch, tiled):
    """Planted cycle slips, the w-test iterated on the whole network or tile by tile and the
    whole network solved once: the device formulation rejects the same arcs with the same
    values to 1e-9, and it did factorise (no host factorisation was built); the tiles spread
    over two devices, the whole network on the first."""
    points, arcs, bad = _scene_with_slips()
    if tiled:
        monkeypatch.setattr(arc_testing, "TILE_POINTS", points.sizes["space"] // 5)
        # the tiles dense, the whole network (almost every point) by its sparse factors
        monkeypatch.setattr(network_solver, "DEVICE_DENSE_MAX_UNKNOWNS",
                            int(0.9 * points.sizes["space"]))
    host, host_arcs = integrate_network(points, arcs, return_arcs=True)
    used: dict[str, set] = {}
    built = _spy_factorisations(monkeypatch, used)
    two = (Device("cpu", 0), Device("cpu", 1))  # the device formulation on NumPy, twice
    monkeypatch.setattr(integration, "_solver_devices", lambda devices: two)
    device, device_arcs = integrate_network(points, arcs, return_arcs=True,
                                            devices=["cuda:0", "cuda:1"])
    assert built.get("_DeviceDense", 0) >= (4 if tiled else 1), built
    assert tiled == (built.get("_DeviceLDL", 0) == 1), built  # the whole network after tiles
    assert used == ({"_DeviceDense": set(two), "_DeviceLDL": {two[0]}} if tiled
                    else {"_DeviceDense": {two[0]}}), used
    assert not built.get("_LDL") and not built.get("_Cholesky"), built
    np.testing.assert_array_equal(device_arcs.arc_removal_reason.values,
                                  host_arcs.arc_removal_reason.values)
    assert (device_arcs.arc_removal_reason.values[bad] == 2).mean() > 0.9
    np.testing.assert_array_equal(device.in_network.values, host.in_network.values)
    keep = host.in_network.values
    for name in ("velocity", "height_error", "unwrapped_phase"):
        _assert_close(device[name].values[keep], host[name].values[keep])


def test_integration_without_a_cuda_device_takes_the_host_path(monkeypatch):
    """CPU devices only: no device factorisation, the host's result to the bit."""
    points, arcs, _ = _scene_with_slips(shape=(100, 100), slips=10)
    reference = integrate_network(points, arcs)
    built = _spy_factorisations(monkeypatch)
    for devices in (["cpu"], ["cpu:0", "cpu:1"]):
        result = integrate_network(points, arcs, devices=devices)
        for name in ("velocity", "height_error", "unwrapped_phase", "in_network"):
            np.testing.assert_array_equal(result[name].values, reference[name].values)
    assert not built.get("_DeviceDense") and not built.get("_DeviceLDL"), built


@pytest.mark.skipif(cupy_available(), reason="CuPy works here: a CUDA device is asked for")
def test_a_cuda_device_without_cupy_is_refused_before_any_work():
    points, arcs, _ = _scene_with_slips(shape=(100, 100), slips=0)
    with pytest.raises(RuntimeError, match="cannot be used"):
        integrate_network(points, arcs, devices=["cuda:0"])


_STAND_IN_RUN = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from scenes import simulated_points
from depsi.processing import arc_testing, network_solver
from depsi.processing.arcs import estimate_arcs
from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network

points, _ = simulated_points(aps_std=0.0, shape=(100, 100))
arcs = estimate_arcs(form_network(points, method="redundant")).compute()
bad = np.random.default_rng(5).choice(arcs.sizes["arc"], 10, replace=False)
ambiguity = arcs["ambiguity"].values.copy()
ambiguity[bad, -8:] += 1
arcs = arcs.assign(ambiguity=(arcs["ambiguity"].dims, ambiguity))
arc_testing.TILE_POINTS = points.sizes["space"] // 4
# the tiles dense, the whole network by its sparse factors
network_solver.DEVICE_DENSE_MAX_UNKNOWNS = int(0.9 * points.sizes["space"])
seen = []
for cls, held in ((network_solver._DeviceDense, lambda f: f.factor),
                  (network_solver._DeviceLDL, lambda f: f.lower.data)):
    def solve(self, b, cls=cls, held=held, real=cls.solve):
        seen.append((cls.__name__, type(held(self)).__module__))
        return real(self, b)
    cls.solve = solve
host, host_arcs = integrate_network(points, arcs, return_arcs=True, devices=["cpu"])
n_host = len(seen)
device, device_arcs = integrate_network(points, arcs, return_arcs=True, devices=["cuda:0"])
keep = host.in_network.values
print(json.dumps({{
    "n_host": n_host, "seen": sorted(set(map(tuple, seen))),
    "same_rejected": bool(np.array_equal(host_arcs.arc_removal_reason.values,
                                         device_arcs.arc_removal_reason.values)),
    "n_rejected": int((host_arcs.arc_removal_reason.values == 2).sum()),
    "max_rel": float(np.max(np.abs(device.unwrapped_phase.values[keep]
                                   - host.unwrapped_phase.values[keep]))
                     / np.max(np.abs(host.unwrapped_phase.values[keep]))),
}}))
"""


@pytest.mark.skipif(cupy_available(), reason="a real GPU is here: the stand-in is not needed")
def test_the_device_path_runs_on_the_cupy_stand_in(tmp_path):
    """With tests/cupy_stand_in.py as ``cupy`` (and its ``cupyx``) in a child process,
    ``devices=["cuda:0"]`` takes the device path: its factors are held in the stand-in's
    (device) arrays, the same arcs are rejected as on the host and the values agree."""
    package = tmp_path / "stand_in" / "cupy"
    package.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "cupy_stand_in.py", package / "__init__.py")
    path = os.pathsep.join(filter(None, [str(package.parent), str(REPO),
                                         os.environ.get("PYTHONPATH")]))
    env = os.environ | {"PYTHONPATH": path, "DEPSI_FUSED_KERNELS": "0"}
    done = subprocess.run([sys.executable, "-c",
                           _STAND_IN_RUN.format(tests=str(REPO / "tests"))],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["n_host"] == 0  # CPU devices: the host path, no device factorisation
    assert outcome["seen"] == [["_DeviceDense", "cupy"], ["_DeviceLDL", "cupy"]]
    assert outcome["same_rejected"] and outcome["n_rejected"] > 0
    assert outcome["max_rel"] < 1e-9


def test_the_integration_step_solves_on_the_runs_devices(monkeypatch):
    """The chain's integration step hands the run's devices to the network's solve."""
    from depsi.pipeline.chain_config import chain_config
    from depsi.pipeline.steps import StepContext, run_step
    from depsi.pipeline.steps import integration as integration_step
    from depsi.pipeline.steps.selection import prepare_points
    from depsi.processing import ps_selection
    from depsi.simulate import simulate_stack

    stack, _ = simulate_stack(shape=(40, 40), n_epochs=12, seed=0)
    points = prepare_points(ps_selection(stack).compute())
    config = chain_config(network={"first_order": 60})
    network = run_step("network", config, selection=points)
    arcs = run_step("arcs", config, network=network)
    asked = []
    real = integration_step.integrate_network

    def recording(*args, devices=None, **kwargs):
        asked.append(devices)
        return real(*args, devices=devices, **kwargs)

    monkeypatch.setattr(integration_step, "integrate_network", recording)
    run_step("integration", config, context=StepContext(devices=["cpu:0", "cpu:1"]),
             network=network, arcs=arcs)
    assert asked == [["cpu:0", "cpu:1"]]
