"""scripts/gpu-check.sh, prepared for the rare and short GPU loans: on this machine it must run
as a dry run (its CuPy parts reported skipped, or run where CuPy works), write every figure
file, and exit 0; its GPU branch and the kernel benchmark's GPU bookkeeping are checked with
stand-ins for CuPy on NumPy."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from depsi.kernels.backend import cupy_available

REPO = Path(__file__).resolve().parents[1]
FILES = {"summary.md", "summary.json", "kernels.json", "chain.json", "tests.log",
         "gpu-check.log"}


@pytest.mark.slow  # it runs the chain (twice, at 1,000 points)
def test_gpu_check_dry_run_writes_every_figure_and_reports_cupy_parts(tmp_path):
    # a second size far beyond the budget: skipped, and the summary says so
    summary = _run_check(tmp_path, DEPSI_GPU_CHECK_POINTS="1000 1e9")
    out = tmp_path / "out"
    status = {p["part"]: p["status"] for p in summary["parts"]}
    kernels = summary["kernels"]["cases"]
    assert len(kernels) >= 10 and all(case["numpy_s"] > 0 for case in kernels)
    compare = summary["chain"]["compare"]
    assert compare["n_common"] > 0
    if cupy_available():
        assert status["CuPy tests"] == "ok" and status["chain: cuda:0"] == "ok"
        assert all(case["cupy_s"] is not None for case in kernels)
    else:
        assert status["CuPy tests"] == "skipped" and status["chain: cuda:0"] == "skipped"
        assert all(case["cupy_s"] is None for case in kernels)
        assert "SKIPPED" in (out / "gpu-check.log").read_text()
        # the stand-in second device is a CPU one: the comparison must be exact
        assert compare["only_cpu"] == compare["only_gpu"] == 0
        assert compare["velocity"]["max_abs_diff"] == 0.0
    assert set(status.values()) <= {"ok", "skipped"}
    assert "| kernels | ok |" in (out / "summary.md").read_text()
    _assert_step_times_on_both_devices(summary, out, "cpu:1")
    skipped = summary["chains"][1]
    assert skipped["n_points"] == 10**9 and "needed" in skipped["skipped"]
    assert status["chain 1000000000: scene"] == "skipped"
    assert "## Chain (1,000,000,000 PS): skipped" in (out / "summary.md").read_text()


def _assert_step_times_on_both_devices(summary, out, second):
    """Every chain step timed on the CPU and on the second device, in summary.json, chain.json
    and summary.md's table of steps."""
    chain = json.loads((out / "chain.json").read_text())
    for record in (summary["chain"], chain):
        cpu, other = record["cpu"]["steps"], record["second"]["steps"]
        assert record["second"]["device"] == second
        assert [s["step"] for s in cpu] == [s["step"] for s in other]
        assert {"prepare", "network", "model"} <= {s["step"] for s in cpu}
        assert all(s["wall_s"] > 0 and s["cpu_s"] >= 0 for s in cpu + other)
    table = (out / "summary.md").read_text().split("### Chain steps")[1]
    assert f"| step | cpu wall s | cpu CPU s | {second} wall s | {second} CPU s |" in table
    for step in summary["chain"]["cpu"]["steps"]:
        assert f"| {step['step']} | " in table


def _run_check(tmp_path, **env):
    env = os.environ | {"DEPSI_GPU_CHECK_POINTS": "1000", "DEPSI_GPU_CHECK_SCALE": "0.005",
                        "DEPSI_GPU_CHECK_WORK": str(tmp_path / "work"),
                        "PYTHON": sys.executable} | env
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert FILES <= {p.name for p in out.iterdir()}
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow  # it runs the chain (twice, at 1,000 points)
@pytest.mark.skipif(cupy_available(), reason="a real GPU is here: the dry run covers it")
def test_gpu_check_takes_its_gpu_branch_where_cupy_works(tmp_path):
    # a NumPy stand-in for CuPy (tests/cupy_stand_in.py), so the GPU branch runs without a GPU
    package = tmp_path / "stand_in" / "cupy"
    package.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "cupy_stand_in.py", package / "__init__.py")
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    # one module's CuPy tests on the stand-in: the script's GPU branch is what this test is
    # about (all four modules on the stand-in took 130 s of the suite's time; the suite runs
    # them itself, skipping CuPy, and tests/test_phase_linking.py its kernels on the stand-in)
    summary = _run_check(tmp_path, PYTHONPATH=path,
                         DEPSI_GPU_CHECK_TESTS="tests/test_kernels_backend.py")
    status = {p["part"]: p["status"] for p in summary["parts"]}
    assert status == dict.fromkeys(["dependencies", "CuPy tests", "kernels", "chain: scene",
                                    "chain: cuda:0", "chain: cpu", "chain: compare"], "ok")
    assert all(case["cupy_s"] > 0 and case["differences"] for case in summary["kernels"]["cases"])
    assert summary["chain"]["second"]["device"] == "cuda:0"
    assert summary["chain"]["compare"]["n_common"] > 0
    _assert_step_times_on_both_devices(summary, tmp_path / "out", "cuda:0")


@pytest.fixture
def bench_gpu_kernels(monkeypatch):
    # the module fixes BLAS threads in os.environ when imported: keep that to this test
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("bench_gpu_kernels")


def _numpy_as_cupy():
    """A stand-in with the few CuPy calls the benchmark makes; the kernels then run on NumPy."""
    pool = SimpleNamespace(free_all_blocks=lambda: None)
    device = SimpleNamespace(synchronize=lambda: None)
    return SimpleNamespace(asarray=np.asarray, get_default_memory_pool=lambda: pool,
                           cuda=SimpleNamespace(Device=lambda: device))


def test_kernel_benchmark_records_times_and_differences_per_output(bench_gpu_kernels):
    cases = bench_gpu_kernels.cases(0.0005)
    assert {"lstsq_batched", "periodogram", "invert_network", "statistics_block"} <= {
        case["name"].split(",")[0] for case in cases}
    for case in cases:
        record = bench_gpu_kernels.run_case(case, 1, _numpy_as_cupy())
        assert "error" not in record, (case["name"], record.get("error"))
        assert record["cupy_s"] > 0 and record["speedup"] > 0
        for name, diff in record["differences"].items():  # the same code on the same data
            assert diff.get("max_abs_diff", 0.0) == 0.0, (case["name"], name)
            assert diff.get("fraction_differing", 0.0) == 0.0, (case["name"], name)


def test_kernel_benchmark_without_gpu_leaves_the_cupy_columns_empty(bench_gpu_kernels):
    case = bench_gpu_kernels.cases(0.0005)[0]
    record = bench_gpu_kernels.run_case(case, 1, None)
    assert record["numpy_s"] > 0
    assert record["cupy_s"] is None and record["differences"] is None


def test_differences_count_nan_mismatches_and_differing_integers(bench_gpu_kernels):
    cpu = {"x": np.array([1.0, 2.0, np.nan]), "flag": np.array([0, 1, 2], np.int8)}
    gpu = {"x": np.array([1.0, 2.5, 3.0]), "flag": np.array([0, 1, 1], np.int8)}
    diff = bench_gpu_kernels.differences(gpu, cpu)
    assert diff["x"] == {"max_abs_diff": 0.5, "max_rel_diff": 0.25, "finite_mismatch": 1}
    assert diff["flag"]["fraction_differing"] == pytest.approx(1 / 3)


def test_gpu_check_without_its_dependencies_exits_2_and_says_why(tmp_path):
    python = tmp_path / "python-without-site"  # no site-packages: NumPy and Dask are missing
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = os.environ | {"PYTHON": str(python), "DEPSI_WHEELHOUSE": str(tmp_path / "none"),
                        "DEPSI_GPU_CHECK_WORK": str(tmp_path / "work")}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout[-3000:]
    assert "no wheelhouse" in done.stdout and "cannot be imported" in done.stdout
    assert "| dependencies | failed |" in (out / "summary.md").read_text()
