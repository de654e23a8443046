"""The documentation site builds with ``mkdocs build --strict`` (no warnings), and the capacity
table of the GPU guide equals the formula it states, from the kernels' own byte counts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Device memory (bytes) of the GPUs in the table, and the share a batch may use.
GPU_MEMORY = {"80 GB": 80e9, "141 GB": 141e9}
SAFETY = 0.5


def bytes_per_item() -> dict:
    """Bytes per item B(T) of each step, as docs/gpu.md states them."""
    from depsi.kernels.lstsq import lstsq_bytes_per_problem
    from depsi.kernels.network_inversion import invert_bytes_per_pixel
    from depsi.kernels.periodogram import periodogram_bytes_per_item

    def arc(T):
        return periodogram_bytes_per_item(T, 50, 50, 2)

    return {
        "amplitude statistics": lambda T: 33 * T + 64,
        "arc estimation": arc,
        "densification": lambda T: 3 * (arc(T) + 8 * T),
        "temporal model": lambda T: lstsq_bytes_per_problem(T, 3, shared_design=False) + 32 * T,
        "network inversion": lambda T: invert_bytes_per_pixel(3 * T, T, 6),
    }


def items_per_gpu(step: str, n_epochs: int, memory: float) -> int:
    """floor(safety * memory / B(T))."""
    return int(SAFETY * memory // bytes_per_item()[step](n_epochs))


def test_gpu_capacity_table_matches_the_formula():
    text = (ROOT / "docs" / "gpu.md").read_text()
    rows = {}
    for line in text.splitlines():
        for step in bytes_per_item():
            if line.startswith(f"| {step} ("):
                rows[step] = [int(cell.replace(",", "")) for cell in line.split("|")[2:-1]]
    assert set(rows) == set(bytes_per_item()), f"table rows found: {sorted(rows)}"
    columns = [(T, memory) for T in (100, 300) for memory in GPU_MEMORY.values()]
    for step, numbers in rows.items():
        expected = [items_per_gpu(step, T, memory) for T, memory in columns]
        assert numbers == expected, f"{step}: table {numbers}, formula {expected}"


def test_gpu_guide_per_epoch_figures_match():
    """The "per epoch (T=300)" column of the bytes table is B(300) / 300, rounded."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    first_column = {"amplitude statistics": "amplitude statistics, PS selection",
                    "arc estimation": "arc estimation", "densification": "densification",
                    "temporal model": "temporal model",
                    "network inversion": "interferogram-network inversion"}
    for step, f in bytes_per_item().items():
        match = re.search(rf"^\| {first_column[step]} \|.*\| ([\d,]+) B \|$", text, flags=re.M)
        assert match, f"no row for {step!r} in the bytes table of docs/gpu.md"
        assert int(match[1].replace(",", "")) == round(f(300) / 300), step


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    if shutil.which("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    for module in ("material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[docs]')")
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    log = completed.stdout + completed.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert completed.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + log
    assert (tmp_path / "site" / "index.html").is_file()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (tmp_path / "site" / "notebooks" / notebook.stem / "index.html").is_file(), notebook
