"""Property: a mutated input gives a clear error before work, or the result of a fresh run.

Valid stacks are mutated as a careless user, a flaky disk or a wrong file would (truncate a
raster, rewrite h2ph as float64, drop a file, zero a block, edit the wavelength) under a
finished workspace. Then ``depsi run --resume`` must either refuse before any work with a
message naming the file, or give exactly what a fresh run on the mutated input gives: never a
stale or silent result.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depsi.cli import main
from depsi.io import open_stm
from depsi.simulate import write_stack_binary

SCENE = {"shape": (48, 48), "n_epochs": 10, "seed": 3, "ps_fraction": 0.06}
MUTATIONS = ("truncate_slc", "h2ph_as_float64", "drop_h2ph", "zero_block", "edit_wavelength",
             "new_wavelength", "drop_epoch")


def _config(folder: Path, stack: Path, workspace: Path) -> Path:
    path = folder / f"{workspace.name}.yaml"
    path.write_text(yaml.safe_dump({
        "input": {"format": "binary", "path": str(stack)},
        "output": {"workspace": str(workspace), "exports": []},
        "compute": {"scheduler": "threads", "threads": 2}}))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A binary stack and a workspace after one complete run on it."""
    folder = tmp_path_factory.mktemp("finished")
    info = write_stack_binary(folder / "stack", progress=False, **SCENE)
    config = _config(folder, info["folder"], folder / "ws")
    assert main(["run", str(config), "--no-progress"]) == 0
    return folder, info


def _mutate(stack: Path, kind: str, epoch: int, fraction: float) -> None:
    slcs = sorted(stack.glob("slc_*.raw"))
    h2phs = sorted(stack.glob("h2ph_*.raw"))
    mothers = {p.name[len("slc_"):-len(".raw")] for p in slcs} - {
        p.name[len("slave_"):-len(".res")] for p in stack.glob("slave_*.res")}
    secondaries = [p for p in slcs if p.name[4:12] not in mothers]
    target = secondaries[epoch % len(secondaries)]
    day = target.name[4:12]
    if kind == "truncate_slc":
        size = target.stat().st_size
        with open(target, "r+b") as f:
            f.truncate(max(8, int(size * fraction)) // 8 * 8 - 8)
    elif kind == "h2ph_as_float64":
        path = stack / f"h2ph_{day}.raw"
        np.fromfile(path, "<f4").astype("<f8").tofile(path)
    elif kind == "drop_h2ph":
        (stack / f"h2ph_{day}.raw").unlink()
    elif kind == "zero_block":
        data = np.fromfile(target, "<c8")
        start = int(fraction * (data.size - 64))
        data[start:start + 64 * 48] = 0
        data.tofile(target)
    elif kind == "edit_wavelength":
        res = stack / f"slave_{day}.res"
        text = re.sub(r"(Radar_wavelength \(m\):\s*)(\S+)", r"\g<1>0.0311", res.read_text())
        res.write_text(text)
    elif kind == "new_wavelength":  # every .res, consistently: a stack of another band
        for res in stack.glob("*.res"):
            text = re.sub(r"(Radar_wavelength \(m\):\s*)(\S+)", r"\g<1>0.031000000",
                          res.read_text())
            text = re.sub(r"(RADAR_FREQUENCY \(HZ\):\s*)(\S+)",
                          rf"\g<1>{299_792_458.0 / 0.031:.15e}", text)
            res.write_text(text)
    elif kind == "drop_epoch":
        target.unlink()
        (stack / f"h2ph_{day}.raw").unlink()
        (stack / f"slave_{day}.res").unlink()
        for ifgs in stack.glob(f"ifgs_{day}.res"):
            ifgs.unlink()
    assert h2phs or kind == "drop_h2ph"


@pytest.mark.slow
@pytest.mark.parametrize("kind", MUTATIONS)
@settings(max_examples=1, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(epoch=st.integers(0, 8), fraction=st.floats(0.1, 0.9))
def test_a_mutated_input_gives_a_clear_error_or_the_fresh_result(finished, tmp_path_factory,
                                                                  kind, epoch, fraction):
    folder, info = finished
    work = tmp_path_factory.mktemp("mutated")
    stack = work / "stack"
    shutil.copytree(info["folder"], stack)
    resumed_ws = work / "ws"
    shutil.copytree(folder / "ws", resumed_ws)
    _mutate(stack, kind, epoch, fraction)

    fresh_code = main(["run", str(_config(work, stack, work / "fresh")), "--no-progress"])
    resumed_code = main(["run", str(_config(work, stack, resumed_ws)), "--resume",
                         "--no-progress"])
    assert fresh_code == resumed_code, kind
    if fresh_code != 0:
        # refused before any work: the fresh workspace holds no product
        assert not (work / "fresh" / "ps.zarr").exists(), kind
        return
    fresh = open_stm(work / "fresh" / "stm.zarr").compute()
    resumed = open_stm(resumed_ws / "stm.zarr").compute()
    for name in ("velocity", "height_error", "temporal_coherence"):
        np.testing.assert_array_equal(resumed[name].values, fresh[name].values,
                                      err_msg=f"{kind}: {name} stale after --resume")
    assert resumed.attrs["wavelength"] == fresh.attrs["wavelength"], kind
    if kind == "new_wavelength":
        assert fresh.attrs["wavelength"] == pytest.approx(0.031)
