"""Shared fixtures: where the real data lives, a one-node SLURM cluster.

Shared scenes (simulated stacks and point STMs) are functions in tests/scenes.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Real SAR/InSAR data kept in the repository (``tests/data``, provenance in its README.md);
#: ``$DEPSI_REALDATA`` points the tests at another copy of the same layout.
REALDATA = Path(os.environ.get("DEPSI_REALDATA", REPO / "tests" / "data"))
#: State folder of scripts/slurm-up.sh (pid files, the clients' env).
SLURM_STATE = Path(os.environ.get("DEPSI_SLURM_DIR", "/tmp/depsi-slurm"))
# Numba's kernels compiled where a test's process finds them in no cache: one path whatever the
# cache holds (tests/test_kernels_first_run.py sets the default, the background, itself)
os.environ.setdefault("DEPSI_NUMBA_COMPILE", "inline")


#: Test modules that run one test at a time, all in one worker, when the suite runs on several
#: (pytest-xdist's ``--dist loadgroup``, as scripts/test.sh runs it): clusters, SLURM jobs,
#: processes killed at chosen moments, small memory limits and locks with timeouts, whose
#: timing another module's load beside them would move. Tests marked ``slurm`` join them.
SERIAL_MODULES = frozenset({
    "test_cluster.py", "test_dask_tools.py", "test_driver_memory.py", "test_faults.py",
    "test_kernels_periodogram_fused.py", "test_runner.py", "test_slurm.py",
    "test_store_safety.py",
})


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.path.name in SERIAL_MODULES or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("serial"))


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Path to the real data (``tests/data``); fails, never skips, when it is not there."""
    if not REALDATA.is_dir():
        pytest.fail(f"real data folder {REALDATA} is absent: expected the repository's "
                    f"tests/data (or $DEPSI_REALDATA pointing at a copy of it)")
    return REALDATA


def _slurm_running() -> bool:
    for name in ("slurmctld.pid", "slurmd.pid"):
        pid_file = SLURM_STATE / name
        try:
            os.kill(int(pid_file.read_text()), 0)
        except (OSError, ValueError):
            return False
    return True


def _read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        if key.strip():
            env[key.strip()] = value.strip()
    return env


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """Start SLURM with scripts/slurm-up.sh (a no-op when already up) and point clients at it.

    Stops it again at the end only when this fixture was the one that started it.
    """
    started_here = not _slurm_running()
    up = subprocess.run(["bash", str(REPO / "scripts" / "slurm-up.sh")],
                        capture_output=True, text=True, timeout=900, check=False)
    if up.returncode == 2:
        reason = up.stderr.strip().splitlines()[-1] if up.stderr.strip() else "unknown reason"
        pytest.skip(f"SLURM unavailable: {reason}")
    if up.returncode != 0:
        pytest.fail(f"scripts/slurm-up.sh failed (exit {up.returncode}):\n{up.stderr}")
    env = _read_env(SLURM_STATE / "env")
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if started_here:
        subprocess.run(["bash", str(REPO / "scripts" / "slurm-down.sh")],
                       capture_output=True, timeout=120, check=False)


class TerminalHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (pytest swaps it between a test's phases)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


@pytest.fixture
def console(capsys):
    """The log lines as a user's terminal shows them (``depsi``'s own handler is pytest's)."""
    from depsi.cli import LOG_FORMAT

    handler = TerminalHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    try:
        yield lambda: capsys.readouterr().err
    finally:
        logging.getLogger().removeHandler(handler)
