"""Every stack format users bring, from a YAML file alone through ``depsi run`` to a map.

Each stack is simulated, written by depsi's writer of that format (headers in the real
layouts, orbits and timing self-consistent) and read back by its reader inside ``depsi run``;
the result is checked against the simulated truth, its positions against the orbits' geocoding,
and the three exports are opened.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from depsi.cli import main
from depsi.geometry import StackGeometry, radar_to_geo
from depsi.io import open_stm
from depsi.simulate import STACK_FORMATS, write_stack

SCENE = {"shape": (80, 80), "n_epochs": 36, "seed": 7, "ps_fraction": 0.05}


@pytest.fixture(scope="module")
def simulated_route(tmp_path_factory):
    """The same scene through ``format: simulated`` (no reader, no orbits): the reference."""
    folder = tmp_path_factory.mktemp("simulated")
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({
        "input": {"simulate": {k: list(v) if isinstance(v, tuple) else v
                               for k, v in SCENE.items()}},
        "output": {"workspace": str(folder / "ws"), "exports": []}}))
    assert main(["run", str(path), "--no-progress"]) == 0
    return open_stm(folder / "ws" / "stm.zarr").compute()


def _config(tmp_path, written, fmt):
    section = {"format": fmt, "path": str(written["path"])}
    if fmt == "geotiff":
        section |= {"dates": [str(d) for d in written["dates"]],
                    "wavelength": written["wavelength"]}
    data = {"input": section,
            "output": {"workspace": str(tmp_path / "ws"), "exports": ["csv", "gpkg", "geotiff"]},
            "compute": {"scheduler": "threads", "threads": 2}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", STACK_FORMATS)
def test_depsi_run_takes_the_format_to_gpkg_geotiff_and_csv(tmp_path, fmt, simulated_route):
    written = write_stack(tmp_path / "stack", format=fmt, **SCENE)
    config = _config(tmp_path, written, fmt)
    assert main(["run", str(config), "--no-progress"]) == 0

    result = open_stm(tmp_path / "ws" / "stm.zarr").compute()
    exports = tmp_path / "ws" / "exports"
    table = pd.read_csv(next(exports.glob("*.csv")))
    assert len(table) == result.sizes["space"] > 100
    assert np.isfinite(table[["lat", "lon"]].to_numpy()).all()

    import geopandas

    assert len(geopandas.read_file(next(exports.glob("*.gpkg")))) == result.sizes["space"]
    import rioxarray

    grid = rioxarray.open_rasterio(next(exports.glob("*.tif")))
    assert np.isfinite(grid.values).sum() > 50

    # the same science as the scene without a reader: the same points, the same velocities
    # (h2ph from the orbits, for gamma and isce2, agrees with the simulated one to 1e-6)
    ours = result["velocity"].to_series().set_axis(
        pd.MultiIndex.from_arrays([result["azimuth"].values, result["range"].values]))
    reference = simulated_route["velocity"].to_series().set_axis(pd.MultiIndex.from_arrays(
        [simulated_route["azimuth"].values, simulated_route["range"].values]))
    common = ours.index.intersection(reference.index)
    assert len(common) >= 0.95 * len(reference)
    difference = (ours[common] - reference[common]).to_numpy()
    assert np.sqrt(np.mean(difference**2)) < 1e-4  # m/yr
    # and against the simulated truth: 2.3 mm/yr RMS on this scene (its atmosphere's floor)
    truth = written["truth"]["velocity"].values
    true_velocity = truth[result["azimuth"].values, result["range"].values]
    good = result["temporal_coherence"].values > 0.8
    error = result["velocity"].values[good] - true_velocity[good]
    assert np.sqrt(np.mean((error - np.median(error)) ** 2)) < 0.003

    if fmt == "geotiff":  # no orbits: positions are the lat.tif/lon.tif values, as given
        geometry = written["geometry"]
        lat, lon = radar_to_geo(geometry, result["azimuth"].values, result["range"].values)
        np.testing.assert_allclose(result["lat"].values, lat, atol=1e-9)
        assert "los_east" not in result.coords
        return
    # positions: every point carries its line of sight, and its position from the product or
    # the orbits before the height correction (the writers' lat/lon are the orbits' own)
    for name in ("los_east", "los_north", "los_up", "incidence_angle", "heading",
                 "lat_uncorrected"):
        assert name in result.coords, name
    norm = np.sqrt(sum(result[c].values.astype(float) ** 2
                       for c in ("los_east", "los_north", "los_up")))
    np.testing.assert_allclose(norm, 1.0, atol=1e-6)
    geometry = StackGeometry.from_attrs(result.attrs)
    lat, lon = radar_to_geo(geometry, result["azimuth"].values, result["range"].values)
    np.testing.assert_allclose(result["lat_uncorrected"].values, lat, atol=1e-6)
    np.testing.assert_allclose(result["lon_uncorrected"].values, lon, atol=1e-6)


def test_geotiff_without_dates_fails_before_any_work(tmp_path, caplog):
    written = write_stack(tmp_path / "stack", format="geotiff", shape=(20, 20), n_epochs=4,
                          seed=1)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"input": {"format": "geotiff",
                                              "path": str(written["path"])},
                                    "output": {"workspace": str(tmp_path / "ws")}}))
    assert main(["run", str(path), "--no-progress"]) != 0
    assert "dates" in caplog.text and "wavelength" in caplog.text
    assert not (tmp_path / "ws" / "ps.zarr").exists()


def test_geotiff_without_h2ph_fails_naming_the_folder(tmp_path, caplog):
    written = write_stack(tmp_path / "stack", format="geotiff", shape=(20, 20), n_epochs=4,
                          seed=1)
    for path in written["path"].glob("h2ph_*.tif"):
        path.unlink()
    config = _config(tmp_path, written, "geotiff")
    assert main(["run", str(config), "--no-progress"]) != 0
    assert "h2ph" in caplog.text and str(written["path"]) in caplog.text
    assert not (tmp_path / "ws" / "ps.zarr").exists()


def test_a_stack_without_positions_or_orbits_is_refused_before_selection(tmp_path, caplog):
    from depsi.simulate import simulate_stack

    stack, _ = simulate_stack(shape=(20, 20), n_epochs=4, seed=1)
    store = tmp_path / "slc.zarr"
    stack.drop_vars(["lat", "lon"]).to_zarr(store, zarr_format=2, consolidated=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"input": {"format": "zarr", "path": str(store)},
                                    "output": {"workspace": str(tmp_path / "ws"),
                                               "exports": ["csv", "gpkg"]}}))
    assert main(["run", str(path), "--no-progress"]) != 0
    assert "lat/lon rasters or orbit state vectors" in caplog.text and "'gpkg'" in caplog.text
    assert not (tmp_path / "ws" / "ps.zarr").exists()


def test_the_flat_doris_folder_gets_its_geometry_from_the_res_orbits(tmp_path):
    from depsi.geometry import baselines
    from depsi.io import open_binary_folder
    from depsi.simulate import write_stack_binary

    info = write_stack_binary(tmp_path / "flat", shape=(30, 40), n_epochs=5, progress=False)
    stack = open_binary_folder(info["folder"])
    geometry = StackGeometry.from_attrs(stack.attrs)
    h2ph = baselines(geometry, np.array([15.0]), np.array([20.0]))["h2ph"][0]
    np.testing.assert_allclose(h2ph, stack["h2ph"].values[15, 20], rtol=1e-4, atol=1e-9)


def test_simulated_geometry_h2ph_matches_the_simulated_h2ph():
    from depsi.geometry import baselines
    from depsi.simulate import simulate_stack, simulated_geometry

    stack, _ = simulate_stack(shape=(30, 40), n_epochs=5, seed=3)
    ours = baselines(simulated_geometry(stack), np.array([0.0, 15.0, 29.0]),
                     np.array([0.0, 20.0, 39.0]))["h2ph"]
    simulated = stack["h2ph"].values[[0, 15, 29], [0, 20, 39]]
    np.testing.assert_allclose(ours, simulated, rtol=1e-4, atol=1e-9)
    assert isinstance(stack, xr.Dataset)


@pytest.mark.slow
def test_reference_by_lon_lat_picks_the_nearest_first_order_point():
    from depsi.pipeline import ChainConfig, run_ps_chain
    from depsi.processing.selection import ps_selection
    from depsi.simulate import simulate_stack

    stack, _ = simulate_stack(shape=(80, 80), n_epochs=24, seed=5, ps_fraction=0.05)
    points = ps_selection(stack).compute()
    first = run_ps_chain(points)
    candidates = np.flatnonzero(first["order"].values == 1)
    chosen = candidates[len(candidates) // 3]
    lon, lat = float(first["lon"].values[chosen]), float(first["lat"].values[chosen])
    config = ChainConfig.model_validate({"integration": {"reference_lonlat": [lon, lat]}})
    again = run_ps_chain(points, config)
    assert again.attrs["reference"] == int(first["point_index"].values[chosen])
    far = ChainConfig.model_validate({"integration": {"reference_lonlat": [lon + 1, lat]}})
    with pytest.raises(ValueError, match=r"reference_lonlat: expected a first-order point "
                                         r"within 2000 m .* found the nearest \d+ m away"):
        run_ps_chain(points, far)


def test_depsi_simulate_offers_every_stack_format():
    from depsi.cli import build_parser

    action = next(a for a in build_parser()._subparsers._group_actions[0].choices["simulate"]
                  ._actions if a.dest == "format")
    assert set(action.choices) == {"zarr", "binary", *STACK_FORMATS}
