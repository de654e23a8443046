"""A reference run of the peer processor dolphin 0.42.9's whole displacement workflow (phase
linking, interferogram network, snaphu, inversion, velocity) on the real ``psps_houston_crop``
stack, in a virtual environment of dolphin's own with real GDAL bindings.

dolphin must never be installed in our environment. ``ensure_dolphin_gdal_venv`` creates (once,
then reuses) a venv, by default ``~/.cache/depsi-bench/dolphin-gdal``: Debian's ``libgdal-dev``
and ``gdal-bin`` (apt, as root), then ``numpy<2`` and ``dolphin==0.42.9`` from PyPI, then the
``GDAL`` bindings of the system's version (``gdal-config --version``), built from source against
that numpy (``--no-build-isolation``). dolphin brings ``snaphu`` (snaphu-py) and JAX itself.

``run_dolphin_workflow`` starts ``_dolphin_workflow_driver.py`` with that venv's python under
``/usr/bin/time -v`` (when present) and ``PJRT_NPROC`` set (jaxlib's default pool of one XLA
thread a core deadlocks on 2 cores, see ``_dolphin_driver.py``), and returns its arrays and
timings. Not part of the test suite.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

DOLPHIN_VERSION = "0.42.9"
DEFAULT_VENV = Path.home() / ".cache" / "depsi-bench" / "dolphin-gdal"
#: The real stack: ``$DEPSI_REALDATA/psps_houston_crop`` (the whole 200 x 200 crop) where set,
#: else the repository's 64 x 64 piece of it (tests/data/README.md).
DEFAULT_CROP = (Path(os.environ["DEPSI_REALDATA"]) if os.environ.get("DEPSI_REALDATA")
                else Path(__file__).resolve().parents[1] / "tests" / "data") / "psps_houston_crop"
DRIVER = Path(__file__).with_name("_dolphin_workflow_driver.py")
#: XLA's intra-op threads for dolphin (``PJRT_NPROC``), as in ``bench_phase_linking.py``.
DOLPHIN_XLA_THREADS = 8
APT_PACKAGES = ("libgdal-dev", "gdal-bin")
_CHECK = ("from importlib.metadata import version; from osgeo import gdal, gdal_array; "
          "import snaphu; print(version('dolphin'))")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    logger.info("running %s", " ".join(command))
    return subprocess.run(command, check=True, **kwargs)


def _gdal_version() -> str:
    """The system GDAL's version (``gdal-config``), installing Debian's packages if needed."""
    if shutil.which("gdal-config") is None:
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], env=env)
    done = _run(["gdal-config", "--version"], capture_output=True, text=True)
    return done.stdout.strip()


def ensure_dolphin_gdal_venv(venv: Path = DEFAULT_VENV) -> Path:
    """dolphin 0.42.9's venv with real GDAL bindings, created and filled once; its python.

    An existing venv is reused when dolphin's version is right and ``osgeo`` and ``snaphu``
    import. Installing the system packages needs root (``apt-get``).
    """
    venv = Path(venv)
    python = venv / "bin" / "python"
    if python.exists():
        done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == DOLPHIN_VERSION:
            return python
    gdal_version = _gdal_version()
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "-q"]
    _run([*pip, "--upgrade", "pip", "setuptools", "wheel"])
    _run([*pip, "numpy<2", f"dolphin=={DOLPHIN_VERSION}"])
    _run([*pip, "--no-build-isolation", f"GDAL=={gdal_version}"])
    _run([str(python), "-c", _CHECK], capture_output=True)
    return python


def _parse_time_v(text: str) -> dict[str, float]:
    """Wall time (s) and peak RSS (GB) from ``/usr/bin/time -v``'s report, where present."""
    out = {}
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", text)
    if wall:
        hours, minutes, seconds = wall.groups()
        out["process_wall_s"] = int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if rss:
        out["process_peak_rss_gb"] = int(rss.group(1)) / 1e6
    return out


def run_dolphin_workflow(work_dir: Path, out_path: Path, *, crop_dir: Path = DEFAULT_CROP,
                         venv: Path = DEFAULT_VENV, timeout_s: float = 3600.0,
                         options: dict | None = None) -> dict:
    """Run dolphin's displacement workflow on the crop in ``work_dir``; its results.

    ``work_dir`` gets the pseudo-SLCs (``slcs/``), dolphin's outputs (``dolphin/``), its
    configuration and log (``dolphin_config.yaml``, ``dolphin.log``) and the driver's output
    (``driver.log``, with ``/usr/bin/time -v``'s report). ``out_path`` is the driver's ``.npz``
    (see ``_dolphin_workflow_driver.main``); the returned dict holds its arrays plus
    ``process_wall_s`` and ``process_peak_rss_gb`` (the whole driver process, from
    ``/usr/bin/time -v`` when it is installed).
    """
    python = ensure_dolphin_gdal_venv(venv)
    work_dir, out_path = Path(work_dir), Path(out_path)
    work_dir.mkdir(parents=True, exist_ok=True)
    command = [str(python), str(DRIVER), str(crop_dir), str(work_dir), str(out_path),
               json.dumps(options or {})]
    if Path("/usr/bin/time").exists():
        command = ["/usr/bin/time", "-v", *command]
    env = os.environ | {"PJRT_NPROC": str(DOLPHIN_XLA_THREADS)}
    logger.info("running dolphin's workflow in %s", work_dir)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
    (work_dir / "driver.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"dolphin's workflow driver failed:\n{done.stderr[-3000:]}")
    with np.load(out_path) as out:
        result = {key: out[key] for key in out.files}
    for key in ("wall_s", "slc_write_s", "peak_rss_gb"):
        result[key] = float(result[key])
    result.update(_parse_time_v(done.stderr))
    return result
