"""Side by side with the peer: TU Delft DePSI 0.1.2's core chain and ours on
the same simulated scene, accuracy against the truth and wall time of both, in one run.

The peer's PyPI name is also ``depsi``, so it must never be installed in our environment: this
script creates (once, then reuses) a virtual environment of its own, by default
``~/.cache/depsi-bench/peer-venv``, installs ``depsi==0.1.2`` there and runs the peer in a
subprocess with that venv's python and without our ``PYTHONPATH`` (``_peer_driver.py``).

1. Scene: ``tests/scenes.py``'s generator (independent of ``depsi.simulate``), family
   ``issue-a`` by default (500 x 500 px, 60 epochs, about 7,500 PS), written once to a
   temporary Zarr store (``complex``, ``h2ph``, times, wavelength) that both sides read.
2. Peer: ``ps_selection`` (NAD < 0.25) -> single differences to the scene's mother ->
   ``network_stm_selection`` -> ``form_network`` -> ``periodogram`` -> ``spatial_integration``
   -> ``estimate_model_params`` (offset, velocity, height). No atmosphere step: the peer's core
   chain has none. Parameters set here: see ``PEER_PARAMS``; everything else is the peer's
   default.
3. Ours: ``ps_selection(stack, method="nad", threshold=0.25)`` + ``run_ps_chain`` (defaults).
4. Figures: velocity RMSE (mm/yr) and height RMSE (m) after removing the median difference (the
   datum), with the noise and no-correction floors of ``scenes.oracle_floors`` on the same
   points. Ours: on true PS with temporal coherence >= 0.8 (``scenes.score``).
   Peer: on every point it reports that is a true PS (it has no per-point coherence; the points
   passed its network testing). Times: from opening the store to the estimates in memory, wall
   and CPU (process time, all threads: steadier on a shared machine); ratios are peer / ours.

Run: ``python benchmarks/bench_peer.py [--family issue-a] [--skip-peer] [--venv PATH]``.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

from depsi import run_ps_chain
from depsi.processing.selection import ps_selection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from scenes import (  # noqa: E402
    ISSUE_FAMILIES,
    SLOW_FAMILIES,
    make_scene,
    oracle_floors,
    score,
    truth_index,
)

PEER_VERSION = "0.1.2"
DEFAULT_VENV = Path.home() / ".cache" / "depsi-bench" / "peer-venv"
DRIVER = Path(__file__).with_name("_peer_driver.py")
NAD_THRESHOLD = 0.25
#: What we set for the peer (its defaults otherwise). ``min_dist`` (m) thins the ~7,500
#: candidates to about 1,200 network points; Delaunay keeps the peer's dense-matrix network
#: testing (arcs x arcs) within minutes, its default redundant network of 16 links per point
#: does not on two cores; ``max_length`` in pixels (10 m); ``min_arc_coherence`` is
#: ``spatial_integration``'s default ``threshold_arc_quality``.
PEER_PARAMS = {"threshold": NAD_THRESHOLD, "min_dist": 100.0, "network_method": "delaunay",
               "max_length": 100.0, "min_links": 16, "num_partitions": 8,
               "min_arc_coherence": 0.5}
#: The peer's requirements less ``drama`` and ``asf_search`` (orbit and download helpers the core
#: chain does not import): the fallback when the plain install fails.
PEER_CORE_DEPS = ["matplotlib", "pydantic", "pykrige", "sarxarray>=1.2.3", "scipy",
                  "stmtools>=0.1.4", "ruptures", "networkx", "sparse", "scikit-learn"]
CORE_MODULES = ("depsi.classification", "depsi.network", "depsi.arc_estimation",
                "depsi.model_estimation", "depsi.utils")


def _peer_env():
    """Environment for the peer's python: without our ``PYTHONPATH`` (it would shadow the
    peer's ``depsi`` with ours)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _peer_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _peer_ready(venv: Path) -> bool:
    python = _peer_python(venv)
    if not python.exists():
        return False
    check = (f"import importlib.metadata as m, {', '.join(CORE_MODULES)}; "
             f"assert m.version('depsi') == '{PEER_VERSION}'")
    return subprocess.run([python, "-c", check], env=_peer_env(), cwd=tempfile.gettempdir(),
                          capture_output=True).returncode == 0


def ensure_peer_venv(venv: Path) -> Path:
    """Create ``venv`` with the peer installed, unless it is already there; its python."""
    if _peer_ready(venv):
        return _peer_python(venv)
    print(f"creating the peer's venv in {venv} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [_peer_python(venv), "-m", "pip", "install", "--quiet"]
    if subprocess.run([*pip, f"depsi=={PEER_VERSION}"], env=_peer_env()).returncode != 0:
        print("plain install failed: installing the peer without drama/asf_search", flush=True)
        subprocess.run([*pip, "--no-deps", f"depsi=={PEER_VERSION}"], env=_peer_env(),
                       check=True)
        subprocess.run([*pip, *PEER_CORE_DEPS], env=_peer_env(), check=True)
    if not _peer_ready(venv):
        raise RuntimeError(f"peer venv {venv}: expected depsi {PEER_VERSION} whose core modules "
                           f"import, found it unusable")
    return _peer_python(venv)


def write_scene(family, workdir: Path):
    """Scene of ``family`` written to ``workdir/stack.zarr``; the store's path and the truth."""
    stack, truth = make_scene(family)
    store = workdir / "stack.zarr"
    stack.chunk({"azimuth": 250, "range": 250, "time": -1}).to_zarr(store, mode="w")
    return store, truth


def run_ours(store: Path):
    start, cpu_start = time.perf_counter(), time.process_time()
    stack = xr.open_zarr(store)
    ps = ps_selection(stack, method="nad", threshold=NAD_THRESHOLD).compute()
    result = run_ps_chain(ps)
    return result, time.perf_counter() - start, time.process_time() - cpu_start


def run_peer(python: Path, store: Path, workdir: Path) -> dict:
    out = workdir / "peer.npz"
    subprocess.run([python, DRIVER, store, out, json.dumps(PEER_PARAMS)], env=_peer_env(),
                   cwd=workdir, check=True)
    with np.load(out) as loaded:
        return {k: loaded[k] for k in loaded.files}


def _rms_about_median(error):
    return float(np.sqrt(np.mean((error - np.median(error)) ** 2)))


def score_peer(peer: dict, truth: dict) -> dict:
    """The peer's points against the truth, as ``scenes.score`` but on all its true PS."""
    idx = truth_index(truth, peer["azimuth"], peer["range"])
    which = idx[idx >= 0]
    figures = {
        "points": int(len(idx)), "true_ps_in_result": int(len(which)),
        "false_points_in_result": int((idx < 0).sum()),
        "n_nan": int(np.isnan(peer["velocity"]).sum() + np.isnan(peer["height"]).sum()),
        "velocity_rmse": _rms_about_median(peer["velocity"][idx >= 0] - truth["velocity"][which]),
        "height_rmse": _rms_about_median(peer["height"][idx >= 0]
                                         - truth["height_error"][which]),
    }
    figures.update(oracle_floors(truth, which))
    return figures


def _line(name, f, seconds, cpu_seconds, scored_on):
    return (f"{name}: {f['points']} points ({f['true_ps_in_result']} true PS, "
            f"{f['false_points_in_result']} false), scored on {scored_on}: velocity "
            f"{f['velocity_rmse'] * 1e3:.2f} mm/yr (floors {f['velocity_noise'] * 1e3:.2f} / "
            f"{f['velocity_nocorr'] * 1e3:.2f}), height {f['height_rmse']:.2f} m (floors "
            f"{f['height_noise']:.2f} / {f['height_nocorr']:.2f}), NaN {f['n_nan']}, "
            f"{seconds:.1f} s wall, {cpu_seconds:.1f} s CPU")


def main(argv=None):
    families = {f.name: f for f in SLOW_FAMILIES + ISSUE_FAMILIES}
    parser = argparse.ArgumentParser(
        description="TU Delft DePSI 0.1.2 and ours on one simulated scene: accuracy and time.")
    parser.add_argument("--family", default="issue-a", choices=sorted(families))
    parser.add_argument("--skip-peer", action="store_true", help="run ours only")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help=f"the peer's venv, created if absent (default {DEFAULT_VENV})")
    args = parser.parse_args(argv)
    family = families[args.family]

    python = None if args.skip_peer else ensure_peer_venv(args.venv)
    with tempfile.TemporaryDirectory(prefix="depsi-bench-peer-") as tmp:
        workdir = Path(tmp)
        store, truth = write_scene(family, workdir)
        print(f"scene {family.name}: {family.shape[0]} x {family.shape[1]} px, "
              f"{family.n_epochs} epochs, {len(truth['azimuth'])} true PS; store {store}",
              flush=True)

        result, ours_seconds, ours_cpu = run_ours(store)
        ours = score(result, truth)
        ours["points"] = int(result.sizes["space"])
        print(_line("ours", ours, ours_seconds, ours_cpu,
                    f"{ours['coherent_true_ps']} with coherence >= 0.8"), flush=True)
        if python is None:
            return
        peer = run_peer(python, store, workdir)
    peer_figures = score_peer(peer, truth)
    peer_seconds, peer_cpu = float(peer["seconds"]), float(peer["cpu_seconds"])
    print(_line(f"peer (TU Delft depsi {peer['peer_version']})", peer_figures, peer_seconds,
                peer_cpu, f"all {peer_figures['true_ps_in_result']} true PS"))
    print(f"peer: {int(peer['n_candidates'])} candidates, {int(peer['n_network_points'])} "
          f"network points, {int(peer['n_arcs'])} arcs; stage seconds "
          + ", ".join(f"{k} {v:.1f}" for k, v in json.loads(str(peer["stages"])).items()))
    print(f"time ratio peer / ours: {peer_seconds / ours_seconds:.1f}x wall, "
          f"{peer_cpu / ours_cpu:.1f}x CPU "
          f"(parameters set for the peer: {PEER_PARAMS})")


if __name__ == "__main__":
    main()
