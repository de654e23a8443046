"""SLC stack readers: values equal a direct read, lazy small graphs, clear errors before work."""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr
from scipy.ndimage import uniform_filter

from depsi.io.binary import from_binary, open_binary_folder
from depsi.io.bounded import MetadataError
from depsi.io.geotiff import from_geotiff
from depsi.io.metadata import SPEED_OF_LIGHT
from depsi.io.slc_zarr import open_slc_zarr
from depsi.io.znap import _interpolate_tie_points, _open_znap, _tie_point_geometry, from_snap
from depsi.stm.schema import STMValidationError

SNAP_DATES = np.array(["2023-03-19", "2023-03-31"], dtype="datetime64[ns]")


def raw_snap_band(product: Path, band: str) -> np.ndarray:
    """A SNAP znap band read with NumPy alone: one uncompressed big-endian float32 chunk."""
    meta = json.loads((product / band / ".zarray").read_text())
    assert meta["compressor"] is None and meta["chunks"] == meta["shape"]
    return np.fromfile(product / band / "0.0", dtype=meta["dtype"]).reshape(meta["shape"])


@pytest.fixture(scope="module")
def slc_dir(realdata: Path) -> Path:
    return realdata / "sarxarray_slc"


@pytest.fixture(scope="module")
def snap_products(slc_dir: Path) -> list[Path]:
    return [slc_dir / "zarrs" / "20230319-coreg.znap", slc_dir / "zarrs" / "20230331-coreg.znap"]


@pytest.fixture(scope="module")
def snap(snap_products: list[Path]) -> xr.Dataset:
    return from_snap(snap_products)


def write_raw(path: Path, values: np.ndarray) -> Path:
    values.tofile(path)
    return path


# --- raw binary --------------------------------------------------------------------------------

@pytest.mark.realdata
def test_binary_real_scenes_equal_a_direct_numpy_read(slc_dir: Path) -> None:
    files = [slc_dir / "scene_0.binaray", slc_dir / "scene_1.binaray"]
    ds = from_binary(files, (100, 100), dates=["2020-01-01", "2020-01-13"], wavelength=0.0555,
                     chunks=(32, 48))
    assert ds.complex.dims == ("azimuth", "range", "time") and ds.complex.dtype == np.complex64
    assert ds.azimuth.dtype == np.int64 and ds.time.dtype == np.dtype("datetime64[ns]")
    values = ds.complex.values
    for k, f in enumerate(files):
        np.testing.assert_array_equal(values[:, :, k], np.fromfile(f, "<c8").reshape(100, 100))


@pytest.mark.realdata
def test_binary_takes_dates_and_wavelength_from_doris_metadata(slc_dir: Path) -> None:
    res = [slc_dir / "metadata" / "meta_doris5" / d / "metadata.res"
           for d in ("20180312", "20180306")]
    files = [slc_dir / "scene_0.binaray", slc_dir / "scene_1.binaray"]
    ds = from_binary(files, (100, 100), metadata=res)
    np.testing.assert_array_equal(ds.time.values,
                                  np.array(["2018-03-06", "2018-03-12"], "datetime64[ns]"))
    assert ds.attrs["wavelength"] == 0.055465760
    # epochs are sorted by date, each file staying with its own metadata
    np.testing.assert_array_equal(ds.complex.values[:, :, 0],
                                  np.fromfile(files[1], "<c8").reshape(100, 100))


@pytest.mark.realdata
def test_binary_with_metadata_of_mixed_wavelengths_is_refused(slc_dir: Path) -> None:
    res = [slc_dir / "metadata" / "meta_doris5" / "20180306" / "metadata.res",
           slc_dir / "metadata" / "meta_doris4" / "20180312" / "metadata.res"]
    files = [slc_dir / "scene_0.binaray", slc_dir / "scene_1.binaray"]
    with pytest.raises(MetadataError, match="wavelength.*meta_doris5.*meta_doris4"):
        from_binary(files, (100, 100), metadata=res)


def test_binary_complex_int16_reads_interleaved_iq_pairs(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    iq = rng.integers(-32768, 32767, size=(2, 7, 9, 2), dtype=np.int16)
    files = [write_raw(tmp_path / f"e{k}.cint16", iq[k]) for k in range(2)]
    ds = from_binary(files, (7, 9), dtype="complex_int16", dates=["20230101", "20230113"],
                     chunks=(4, 5))
    expected = iq[..., 0].astype(np.float32) + 1j * iq[..., 1].astype(np.float32)
    np.testing.assert_array_equal(ds.complex.values, np.moveaxis(expected, 0, -1))
    assert ds.complex.dtype == np.complex64


def test_binary_big_endian_complex64(tmp_path: Path) -> None:
    values = (np.arange(12) - 1j * np.arange(12)).astype(">c8").reshape(3, 4)
    path = write_raw(tmp_path / "be.raw", values)
    ds = from_binary([path], (3, 4), dates=["2023-01-01"], byteorder=">")
    np.testing.assert_array_equal(ds.complex.values[:, :, 0], values.astype(np.complex64))
    assert ds.complex.values.dtype.isnative


def test_binary_graph_is_one_task_per_block_and_holds_no_pixels(tmp_path: Path) -> None:
    shape = (120, 80)
    files = [write_raw(tmp_path / f"e{k}.raw", np.full(shape, k, np.complex64))
             for k in range(3)]
    dates = ["2023-01-01", "2023-01-13", "2023-01-25"]
    for block, n_blocks in (((120, 80), 1), ((30, 80), 4), ((10, 20), 48)):
        data = from_binary(files, shape, dates=dates, chunks=block).complex.data
        graph = dict(data.__dask_graph__())
        assert data.npartitions == n_blocks
        assert len(graph) == n_blocks + 1  # the file list, then one read per block
        assert len(pickle.dumps(graph)) < 2_000 + 200 * n_blocks  # names and windows only


def test_binary_reads_nothing_until_computed(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "e.raw", np.zeros((4, 4), np.complex64))
    ds = from_binary([path], (4, 4), dates=["2023-01-01"])
    write_raw(path, np.full((4, 4), 3 - 1j, np.complex64))  # same size, new values
    assert complex(ds.complex[1, 2, 0].compute()) == 3 - 1j


def test_binary_missing_files_are_all_named(tmp_path: Path) -> None:
    present = write_raw(tmp_path / "a.raw", np.zeros((2, 2), np.complex64))
    with pytest.raises(FileNotFoundError, match=r"2 of 3.*b\.raw.*c\.raw"):
        from_binary([present, tmp_path / "b.raw", tmp_path / "c.raw"], (2, 2),
                    dates=["2023-01-01", "2023-01-13", "2023-01-25"])


def test_binary_wrong_file_size_names_file_and_bytes(tmp_path: Path) -> None:
    good = write_raw(tmp_path / "good.raw", np.zeros((4, 5), np.complex64))
    bad = write_raw(tmp_path / "bad.raw", np.zeros((4, 4), np.complex64))
    with pytest.raises(ValueError, match=r"expected 160 bytes.*'.*bad\.raw' has 128 bytes"):
        from_binary([good, bad], (4, 5), dates=["2023-01-01", "2023-01-13"])
    with pytest.raises(ValueError, match=r"expected 80 bytes.*that is complex64 data"):
        from_binary([good], (4, 5), dtype="complex_int16", dates=["2023-01-01"])


def test_binary_number_of_dates_must_match_files(tmp_path: Path) -> None:
    files = [write_raw(tmp_path / f"e{k}.raw", np.zeros((2, 2), np.complex64)) for k in range(2)]
    with pytest.raises(ValueError, match="dates: expected 2 dates.*found 3"):
        from_binary(files, (2, 2), dates=["2023-01-01", "2023-01-13", "2023-01-25"])


def test_binary_unparseable_and_duplicate_dates_are_named(tmp_path: Path) -> None:
    files = [write_raw(tmp_path / f"e{k}.raw", np.zeros((2, 2), np.complex64)) for k in range(2)]
    with pytest.raises(ValueError, match=r"dates\[1\].*'2023-13-45'"):
        from_binary(files, (2, 2), dates=["2023-01-01", "2023-13-45"])
    with pytest.raises(ValueError, match=r"duplicates.*e0\.raw.*e1\.raw"):
        from_binary(files, (2, 2), dates=["2023-01-01", "20230101"])


def test_binary_unknown_dtype_and_bad_wavelength_are_refused(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "e.raw", np.zeros((2, 2), np.complex64))
    with pytest.raises(ValueError, match="dtype: expected complex64.*float32"):
        from_binary([path], (4, 2), dtype=np.float32, dates=["2023-01-01"])
    with pytest.raises(ValueError, match="wavelength.*5.6"):
        from_binary([path], (2, 2), dates=["2023-01-01"], wavelength=5.6)


# --- SNAP znap ---------------------------------------------------------------------------------

@pytest.mark.realdata
def test_binary_folder_with_doris_metadata_equals_the_simulated_stack(tmp_path: Path) -> None:
    from depsi.pipeline.config import parse_config
    from depsi.pipeline.input_stack import open_stack
    from depsi.simulate import simulate_stack, write_stack_binary

    kwargs = {"shape": (20, 24), "n_epochs": 4, "seed": 5}
    write_stack_binary(tmp_path, progress=False, **kwargs)
    stack, _ = simulate_stack(**kwargs)
    ds = open_binary_folder(tmp_path)
    np.testing.assert_array_equal(ds["time"].values, stack["time"].values)
    np.testing.assert_array_equal(ds["complex"].values, stack["complex"].values)
    np.testing.assert_array_equal(ds["h2ph"].values, stack["h2ph"].values)
    assert ds.attrs["wavelength"] == pytest.approx(stack.attrs["wavelength"])
    config = parse_config({"input": {"path": str(tmp_path), "format": "binary"}})
    xr.testing.assert_identical(open_stack(config), ds)  # the pipeline's binary input


def test_binary_folder_without_doris_metadata_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="expected DORIS .res files"):
        open_binary_folder(tmp_path)


def test_snap_pair_equals_a_direct_numpy_read_of_i_and_q(snap: xr.Dataset,
                                                         snap_products: list[Path]) -> None:
    np.testing.assert_array_equal(snap.time.values, SNAP_DATES)
    values = snap.complex.values
    assert values.dtype == np.complex64 and values.shape == (84, 338, 2)
    for k, (product, day) in enumerate(zip(snap_products, ("19Mar2023", "31Mar2023"))):
        i = raw_snap_band(product, f"i_VV_{day}")
        q = raw_snap_band(product, f"q_VV_{day}")
        np.testing.assert_array_equal(values[:, :, k], i + 1j * q)


@pytest.mark.realdata
def test_snap_h2ph_is_the_secondary_band_and_zero_for_the_mother(
        snap: xr.Dataset, snap_products: list[Path]) -> None:
    assert snap.attrs["coregistration_mother_time"] == "2023-03-31"
    h2ph = snap.h2ph.values
    assert h2ph.dtype == np.float32
    np.testing.assert_array_equal(h2ph[:, :, 0],
                                  raw_snap_band(snap_products[0], "h2ph_VV_19Mar2023"))
    np.testing.assert_array_equal(h2ph[:, :, 1], 0.0)
    # B_perp / (R sin(theta)) with the 33.9 m baseline of the metadata, R about 924 km
    assert np.abs(h2ph[:, :, 0]).mean() == pytest.approx(33.9 / (923_676 * np.sin(0.75)),
                                                         rel=0.1)


@pytest.mark.realdata
def test_snap_wavelength_is_c_over_the_radar_frequency(snap: xr.Dataset) -> None:
    assert snap.attrs["wavelength"] == pytest.approx(SPEED_OF_LIGHT / 5405.000454334349e6,
                                                     rel=1e-12)
    assert snap.attrs["wavelength"] == pytest.approx(0.0555, abs=1e-4)
    assert (snap.attrs["azimuth_offset"], snap.attrs["range_offset"]) == (912, 9178)


@pytest.mark.realdata
def test_snap_corners_are_its_tie_points_read_at_pixel_centres_ours_at_line_indices(
        snap: xr.Dataset, snap_products: list[Path]) -> None:
    """SNAP states its corner coordinates as its tie points read at pixel centres (+0.5 in
    both axes); the tie rows lie at the line indices themselves (measured from the orbits,
    tests/test_geometry.py), so from_snap reads them half a line earlier than SNAP does."""
    from depsi.io.znap import SNAP_TIE_POINT_CENTRE, _interpolate_tie_points

    metadata = json.loads((snap_products[0] / "SNAP" / "product_metadata.json").read_text())
    stated = {a["name"]: a["data"]["elems"][0] for a in metadata[0]["attributes"]
              if isinstance(a["data"]["elems"], list)}
    product = _open_znap(snap_products[0])
    lat, lon = snap.lat.values, snap.lon.values
    assert lat.dtype == np.float64 and lat.shape == (84, 338)
    for corner, (row, col) in {"first_near": (0, 0), "first_far": (0, 337),
                               "last_near": (83, 0), "last_far": (83, 337)}.items():
        for name, ours, key in (("latitude", lat, "lat"), ("longitude", lon, "long")):
            tie = _tie_point_geometry(product, name, snap_products[0])
            at = {"offset": tie["offset"], "subsampling": tie["subsampling"]}
            snaps = _interpolate_tie_points(tie["grid"], row, col, **at)
            assert snaps == pytest.approx(stated[f"{corner}_{key}"], abs=1e-12)
            assert ours[row, col] == pytest.approx(_interpolate_tie_points(
                tie["grid"], row, col, centre=SNAP_TIE_POINT_CENTRE, **at), abs=1e-12)


@pytest.mark.realdata
def test_tie_point_interpolation_returns_the_tie_points_at_their_positions(
        snap_products: list[Path]) -> None:
    product = _open_znap(snap_products[0])
    geometry = _tie_point_geometry(product, "latitude", snap_products[0])
    grid, offset, step = geometry["grid"], geometry["offset"], geometry["subsampling"]
    # tie point k lies at offset + k * subsampling in SNAP's continuous pixel coordinates,
    # which is pixel index offset + k * subsampling - 0.5
    rows = offset[0] + step[0] * np.arange(grid.shape[0]) - 0.5
    cols = offset[1] + step[1] * np.arange(grid.shape[1]) - 0.5
    values = _interpolate_tie_points(grid, rows[:, None], cols[None, :], offset=offset,
                                     subsampling=step)
    np.testing.assert_allclose(values, grid, rtol=0, atol=1e-9)


@pytest.mark.realdata
def test_snap_lat_lon_lie_within_the_tie_point_bounds_and_near_the_dem_geocoding(
        snap: xr.Dataset, snap_products: list[Path]) -> None:
    product = _open_znap(snap_products[0])
    for coord, grid in (("lat", "latitude"), ("lon", "longitude")):
        values, tie = snap[coord].values, product[grid].values
        assert tie.min() <= values.min() and values.max() <= tie.max()
    # the mother product also holds SNAP's terrain-corrected per-pixel lat/lon: tie points
    # sit on the ellipsoid, so they differ by the terrain shift (~60 m height here)
    mother = snap_products[1]
    assert np.abs(snap.lat.values - raw_snap_band(mother, "latitude_VV")).max() < 3e-4
    assert np.abs(snap.lon.values - raw_snap_band(mother, "longitude_VV")).max() < 2e-3


@pytest.mark.realdata
def test_snap_pair_coherence_is_that_of_a_real_pair(snap: xr.Dataset) -> None:
    secondary, mother = (snap.complex.values[:, :, k] for k in (0, 1))
    interferogram = mother * np.conj(secondary)

    def box(x: np.ndarray) -> np.ndarray:
        return uniform_filter(x, size=5, mode="nearest")

    coherence = np.abs(box(interferogram.real) + 1j * box(interferogram.imag)) / np.sqrt(
        box(np.abs(mother) ** 2) * box(np.abs(secondary) ** 2))
    assert 0.6 < np.nanmean(coherence) < 0.9  # README: about 0.77


@pytest.mark.realdata
def test_snap_stack_is_lazy_with_a_small_graph(snap: xr.Dataset) -> None:
    for name in ("complex", "h2ph", "lat", "lon"):
        assert dask.is_dask_collection(snap[name].variable.data)
        assert len(pickle.dumps(dict(snap[name].data.__dask_graph__()))) < 50_000


@pytest.mark.realdata
def test_snap_single_product_reads_one_epoch(snap_products: list[Path]) -> None:
    ds = from_snap(snap_products[1], chunks=(40, 200))
    assert ds.sizes == {"azimuth": 84, "range": 338, "time": 1}
    assert ds.complex.data.chunksize == (40, 200, 1)
    # the mother alone: no h2ph band in the product, so h2ph from its orbit, zero everywhere
    assert float(abs(ds["h2ph"]).max()) == 0.0 and "sar_geometry" in ds.attrs


@pytest.mark.realdata
def test_snap_unknown_polarisation_lists_what_is_there(snap_products: list[Path]) -> None:
    with pytest.raises(ValueError, match=r"'VH'.*found polarisations \['VV'\]"):
        from_snap(snap_products, polarisation="VH")


@pytest.mark.realdata
def test_snap_band_without_its_quadrature_is_named(snap_products: list[Path],
                                                   tmp_path: Path) -> None:
    broken = tmp_path / "broken.znap"
    shutil.copytree(snap_products[0], broken)
    shutil.rmtree(broken / "q_VV_19Mar2023")
    with pytest.raises(ValueError, match="expected band 'q_VV_19Mar2023' beside 'i_VV_19Mar"):
        from_snap([broken])


@pytest.mark.realdata
def test_snap_same_date_twice_is_refused(snap_products: list[Path]) -> None:
    with pytest.raises(ValueError, match="one epoch per date.*2023-03-19"):
        from_snap([snap_products[0], snap_products[0]])


# --- Zarr SLC stores ---------------------------------------------------------------------------

@pytest.mark.realdata
def test_sarxarray_store_real_and_imag_become_complex(slc_dir: Path) -> None:
    store = slc_dir / "zarrs" / "slcs_example.zarr"
    ds = open_slc_zarr(store, dates=["2023-01-01", "2023-01-13", "2023-01-25"],
                       wavelength=0.0555)
    raw = xr.open_zarr(store)
    expected = raw["real"].values.astype(np.float32) + 1j * raw["imag"].values.astype(np.float32)
    np.testing.assert_array_equal(ds.complex.values, expected)
    assert ds.complex.dtype == np.complex64 and list(ds.data_vars) == ["complex"]
    assert ds.azimuth.values.tolist() == [8050, 8051]
    assert ds.complex.data.chunksize[2] == 3  # time in one chunk


@pytest.mark.realdata
def test_broken_dim_store_says_time_is_missing(slc_dir: Path) -> None:
    with pytest.raises(STMValidationError, match=r"no \['time'\].*real \('azimuth', 'range'\)"):
        open_slc_zarr(slc_dir / "zarrs" / "slcs_example_broken_dim.zarr")


@pytest.mark.realdata
def test_broken_vars_store_says_real_is_missing(slc_dir: Path) -> None:
    with pytest.raises(STMValidationError, match=r"only 'imag', not 'real'"):
        open_slc_zarr(slc_dir / "zarrs" / "slcs_example_broken_vars.zarr")


def test_stack_written_to_zarr_v3_opens_with_the_same_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    values = (rng.normal(size=(6, 5, 3)) + 1j * rng.normal(size=(6, 5, 3))).astype(np.complex64)
    files = [write_raw(tmp_path / f"e{k}.raw", np.ascontiguousarray(values[:, :, k]))
             for k in range(3)]
    ds = from_binary(files, (6, 5), dates=["2023-01-01", "2023-01-13", "2023-01-25"],
                     wavelength=0.0555)
    ds.to_zarr(tmp_path / "slc.zarr", zarr_format=3, consolidated=False)
    back = open_slc_zarr(tmp_path / "slc.zarr")
    np.testing.assert_array_equal(back.complex.values, values)
    assert back.attrs["wavelength"] == 0.0555
    np.testing.assert_array_equal(back.time.values, ds.time.values)


def test_store_in_time_chunks_opens_with_time_whole_read_by_zarr(tmp_path: Path) -> None:
    """A store chunked along time (as other tools write it) opens with one Dask chunk over all
    epochs per block, read by zarr straight into it: no rechunk step copies every block."""
    rng = np.random.default_rng(4)
    values = (rng.normal(size=(8, 6, 9)) + 1j * rng.normal(size=(8, 6, 9))).astype(np.complex64)
    xr.Dataset({"complex": (("azimuth", "range", "time"), values)},
               coords={"time": np.datetime64("2023-01-01", "ns")
                       + np.arange(9) * np.timedelta64(12, "D")}
               ).chunk({"azimuth": 4, "range": 3, "time": 4}).to_zarr(
        tmp_path / "slc.zarr", zarr_format=3, consolidated=False)
    ds = open_slc_zarr(tmp_path / "slc.zarr", wavelength=0.0555)
    assert ds.complex.data.chunks == ((4, 4), (3, 3), (9,))
    assert not any("rechunk" in name for name in ds.complex.data.dask.layers)
    np.testing.assert_array_equal(ds.complex.values, values)


def test_missing_store_and_non_zarr_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.zarr"):
        open_slc_zarr(tmp_path / "nothing.zarr")
    (tmp_path / "folder").mkdir()
    with pytest.raises(STMValidationError, match="expected a Zarr group"):
        open_slc_zarr(tmp_path / "folder")


# --- GeoTIFF -----------------------------------------------------------------------------------

#: Third-party warnings while reading: an SLC in radar geometry has no geotransform, and
#: rioxarray still multiplies affine transforms with ``*``.
def geotiff_warnings(test):
    for text in ("Dataset has no geotransform", "Use `@` matmul"):
        test = pytest.mark.filterwarnings(f"ignore:{text}")(test)
    return test

def write_tiff(path: Path, bands: np.ndarray, dtype: str) -> Path:
    import rasterio
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(path, "w", driver="GTiff", width=bands.shape[2],
                           height=bands.shape[1], count=bands.shape[0], dtype=dtype) as tif:
            tif.write(bands)
    return path


@geotiff_warnings
@pytest.mark.parametrize("dtype", ["complex64", "complex_int16"])
def test_geotiff_complex_bands_are_epochs(tmp_path: Path, dtype: str) -> None:
    pytest.importorskip("rioxarray")
    rng = np.random.default_rng(3)
    values = (rng.integers(-900, 900, (3, 5, 7)) + 1j * rng.integers(-900, 900, (3, 5, 7))
              ).astype(np.complex64)
    first = write_tiff(tmp_path / "a.tif", values[:2], dtype)
    second = write_tiff(tmp_path / "b.tif", values[2:], dtype)
    ds = from_geotiff([first, second], dates=["2023-01-01", "2023-01-13", "2023-01-25"],
                      wavelength=0.0555, chunks=(2, 7))
    np.testing.assert_array_equal(ds.complex.values, np.moveaxis(values, 0, -1))
    assert ds.complex.dtype == np.complex64 and ds.attrs["wavelength"] == 0.0555


@geotiff_warnings
def test_geotiff_iq_band_pairs_are_combined(tmp_path: Path) -> None:
    pytest.importorskip("rioxarray")
    iq = np.arange(4 * 3 * 4, dtype=np.float32).reshape(4, 3, 4)
    path = write_tiff(tmp_path / "iq.tif", iq, "float32")
    ds = from_geotiff([path], dates=["2023-01-13", "2023-01-01"], band_layout="iq")
    # epochs sorted by date: the second I/Q pair (2023-01-01) comes first
    np.testing.assert_array_equal(ds.complex.values[:, :, 0], iq[2] + 1j * iq[3])
    np.testing.assert_array_equal(ds.complex.values[:, :, 1], iq[0] + 1j * iq[1])


@geotiff_warnings
def test_geotiff_real_bands_as_complex_layout_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("rioxarray")
    path = write_tiff(tmp_path / "amp.tif", np.ones((1, 2, 2), np.float32), "float32")
    with pytest.raises(ValueError, match="expected complex bands.*float32.*band_layout='iq'"):
        from_geotiff([path], dates=["2023-01-01"])
    with pytest.raises(ValueError, match="expected 3 dates.*found 1"):
        write_tiff(tmp_path / "c.tif", np.ones((3, 2, 2), np.complex64), "complex64")
        from_geotiff([tmp_path / "c.tif"], dates=["2023-01-01"])


def _dated_tiff(path: Path, values: np.ndarray, acquired: str) -> Path:
    import rasterio
    write_tiff(path, values, "complex64")
    with rasterio.open(path, "r+") as tif:
        tif.update_tags(ns="IMAGERY", ACQUISITIONDATETIME=acquired)
    return path


@geotiff_warnings
def test_geotiff_date_other_than_its_recorded_acquisition_is_refused(tmp_path: Path) -> None:
    values = np.ones((1, 3, 4), np.complex64)
    first = _dated_tiff(tmp_path / "a.tif", values, "2023-01-13 05:50:35")
    second = _dated_tiff(tmp_path / "b.tif", values * 2, "2023-01-01 05:50:35")
    with pytest.raises(ValueError, match=r"dates\[0\]: expected the acquisition date '.*a\.tif' "
                                         r"records .*2023-01-13, found 2023-01-01"):
        from_geotiff([first, second], dates=["2023-01-01", "2023-01-13"])
    ds = from_geotiff([first, second], dates=["2023-01-13", "2023-01-01"])
    assert ds.complex.values[0, 0].tolist() == [2, 1]


@geotiff_warnings
def test_truncated_geotiff_is_refused_by_name_before_any_pixel_is_read(tmp_path: Path) -> None:
    path = write_tiff(tmp_path / "slc.tif", np.ones((1, 30, 40), np.complex64), "complex64")
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"raster '.*slc\.tif': expected \d+ bytes or more "
                                         r"\(band 1's last block.*found \d+: a truncated file"):
        from_geotiff([path], dates=["2023-01-01"])


@geotiff_warnings
def test_geotiff_read_failing_at_compute_time_names_the_file(tmp_path: Path) -> None:
    path = write_tiff(tmp_path / "slc.tif", np.ones((1, 30, 40), np.complex64), "complex64")
    ds = from_geotiff([path], dates=["2023-01-01"], chunks=(10, 40))
    path.write_bytes(path.read_bytes()[:-100])  # damaged after opening
    with pytest.raises(OSError, match=r"raster '.*slc\.tif' band 1: expected 10 x 40 readable "
                                      r"samples from line 20"):
        ds.complex.compute()
