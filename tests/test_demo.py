"""`depsi demo` runs the whole chain on a simulated stack and writes what it promises."""

import pandas as pd
import pytest

from depsi.cli import main
from depsi.io import open_stm


@pytest.mark.slow
def test_demo_writes_products_and_recovers_the_velocity_field(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--size", "128", "--epochs", "24"]) == 0
    assert str(out.resolve()) in capsys.readouterr().out
    for name in ("stack", "ps.zarr", "stm.zarr", "points.csv", "velocity.png"):
        assert (out / name).exists(), name
    result = open_stm(out / "stm.zarr")
    assert result.sizes["space"] > 100
    assert not result["velocity"].isnull().any()
    table = pd.read_csv(out / "points.csv")
    assert len(table) == result.sizes["space"]
    assert sum(c.startswith("d_") for c in table.columns) == 24
    assert (out / "velocity.png").stat().st_size > 10_000


def test_a_small_demo_writes_every_product(tmp_path, capsys):
    """The quick subset's demo: the same chain and products on a 64 x 64 scene of 12 epochs."""
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--size", "64", "--epochs", "12"]) == 0
    assert str(out.resolve()) in capsys.readouterr().out
    for name in ("stack", "ps.zarr", "stm.zarr", "points.csv", "velocity.png"):
        assert (out / name).exists(), name
    result = open_stm(out / "stm.zarr")
    assert result.sizes["space"] > 20 and not result["velocity"].isnull().any()
    assert len(pd.read_csv(out / "points.csv")) == result.sizes["space"]
