"""A real 93-epoch Sentinel-1 interferogram stack (Houston, tests/data/psps_houston_crop): read
as pseudo-SLCs with each file's direction, run from a YAML alone without baselines, and held
against another processor's velocities on the same pixels (dolphin 0.42.9)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from depsi.cli import main
from depsi.io import open_stm
from depsi.io.interferograms import InterferogramStackError, from_interferograms
from depsi.processing.interferogram import single_mother_interferograms

WAVELENGTH = 0.05546576
SHAPE = (64, 64)
REFERENCE = np.datetime64("2018-01-15")


@pytest.fixture(scope="module")
def crop(realdata):
    return realdata / "psps_houston_crop"


@pytest.mark.realdata
def test_the_stack_reads_with_each_files_direction(crop):
    stack = from_interferograms(crop, wavelength=WAVELENGTH, shape=SHAPE)
    time = stack["time"].values.astype("datetime64[D]")
    assert time.size == 93 and stack.attrs["mother_time"].startswith("2018-01-15")
    assert str(time[0]) == "2017-02-01" and str(time[-1]) == "2020-02-22"
    values = stack["complex"].values
    mother = int(np.flatnonzero(time == REFERENCE)[0])
    assert (np.angle(values[..., mother]) == 0).all()
    before = np.fromfile(crop / "igrams" / "20170201_20180115.int", "<c8").reshape(SHAPE)
    after = np.fromfile(crop / "igrams" / "20180115_20200222.int", "<c8").reshape(SHAPE)
    amplitude = np.fromfile(crop / "amplitude" / "20170201.amp", "<f4").reshape(SHAPE)
    # s_t conj(s_r) is the file for t_r and its conjugate for r_t
    np.testing.assert_allclose(np.angle(values[..., 0] * np.conj(np.exp(1j * np.angle(before)))),
                               0, atol=1e-5)
    np.testing.assert_allclose(np.angle(values[..., -1] * np.exp(1j * np.angle(after))), 0,
                               atol=1e-5)
    np.testing.assert_allclose(np.abs(values[..., 0]), amplitude, rtol=1e-6)
    # the interferograms the chain forms are the files' s_r conj(s_t)
    points = stack.stack(space=("azimuth", "range")).reset_index("space").transpose(
        "space", "time")
    ifg = single_mother_interferograms(points[["complex"]]).compute()
    np.testing.assert_allclose(
        np.angle(np.exp(1j * (ifg["phase"].values[:, -1] - np.angle(after).ravel()))), 0,
        atol=1e-5)


def _copy(crop, tmp_path):
    target = tmp_path / "stack"
    shutil.copytree(crop, target)
    return target


@pytest.mark.realdata
@pytest.mark.parametrize("lie, message", [
    ("short", "expected 32768 for a complex64 interferogram"),
    ("second_reference", "expected single-reference interferograms"),
    ("date_twice", "more than one interferogram to the reference"),
    ("amplitude_missing", "amplitude images and interferograms disagree on the dates"),
    ("not_a_date", "is not a date"),
])
def test_stacks_that_lie_are_refused_before_any_pixel_is_read(crop, tmp_path, lie, message):
    folder = _copy(crop, tmp_path)
    igrams = folder / "igrams"
    if lie == "short":
        path = igrams / "20180115_20190110.int"
        path.write_bytes(path.read_bytes()[:-8])
    elif lie == "second_reference":
        (igrams / "20180115_20190110.int").rename(igrams / "20181229_20190110.int")
    elif lie == "date_twice":
        shutil.copy(igrams / "20180115_20190110.int", igrams / "20190110_20180115.int")
    elif lie == "amplitude_missing":
        (folder / "amplitude" / "20190110.amp").unlink()
    else:
        (igrams / "20180115_20190110.int").rename(igrams / "20180115_20191399.int")
    with pytest.raises(InterferogramStackError, match=message):
        from_interferograms(folder, wavelength=WAVELENGTH, shape=SHAPE)


@pytest.mark.realdata
def test_raw_interferograms_need_their_shape(crop):
    with pytest.raises(InterferogramStackError, match="give input.shape"):
        from_interferograms(crop, wavelength=WAVELENGTH)


def _config(crop, tmp_path, **selection):
    data = {"input": {"format": "interferograms", "path": str(crop), "wavelength": WAVELENGTH,
                      "shape": list(SHAPE), "pixel_spacing": [100.0, 100.0]},
            "output": {"workspace": str(tmp_path / "ws"), "exports": ["csv"]}}
    if selection:
        data["selection"] = selection
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.realdata
def test_interferograms_need_a_pixel_spacing(crop, tmp_path, caplog):
    path = _config(crop, tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["input"]["pixel_spacing"]
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--no-progress"]) != 0
    assert "needs pixel_spacing [azimuth, range] in metres" in caplog.text
    assert not (tmp_path / "ws").exists()


def _isce2_layout(crop, folder):
    """The crop's interferograms as ISCE2 topsStack writes them (no amplitude images)."""
    from depsi.io.isce2_writer import write_image_header

    for path in sorted((crop / "igrams").glob("*.int")):
        pair = folder / "merged" / "interferograms" / path.stem
        pair.mkdir(parents=True)
        shutil.copy(path, pair / "fine.int")
        write_image_header(pair / "fine.int", width=SHAPE[1], length=SHAPE[0],
                           data_type="CFLOAT")
    return folder


def _geotiff_layout(crop, folder):
    """The crop as one complex GeoTIFF a pair and one float GeoTIFF an amplitude."""
    import rasterio

    folder.mkdir()
    (folder / "amplitude").mkdir()
    for source, target, dtype in ((crop / "igrams", folder, "<c8"),
                                  (crop / "amplitude", folder / "amplitude", "<f4")):
        for path in sorted(source.iterdir()):
            values = np.fromfile(path, dtype).reshape(SHAPE)
            with rasterio.open(target / f"{path.stem}.tif", "w", driver="GTiff",
                               height=SHAPE[0], width=SHAPE[1], count=1,
                               dtype="complex64" if dtype == "<c8" else "float32") as out:
                out.write(values, 1)
    return folder


@pytest.mark.realdata
def test_isce2_and_geotiff_layouts_read_as_the_raw_one(crop, tmp_path):
    import warnings

    from rasterio.errors import NotGeoreferencedWarning

    raw = from_interferograms(crop, wavelength=WAVELENGTH, shape=SHAPE)["complex"].values
    isce2 = from_interferograms(_isce2_layout(crop, tmp_path / "isce2"), wavelength=WAVELENGTH)
    assert isce2.attrs["amplitude_source"] == "interferogram moduli"
    # the same phases; amplitudes from the pairs' moduli
    np.testing.assert_allclose(np.angle(isce2["complex"].values * np.conj(raw)), 0, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        geotiff = from_interferograms(_geotiff_layout(crop, tmp_path / "tif"),
                                      wavelength=WAVELENGTH)
        np.testing.assert_allclose(geotiff["complex"].values, raw, rtol=1e-6)
    assert geotiff.attrs["amplitude_source"] == "images"
    with pytest.raises(InterferogramStackError, match="contradicts the headers"):
        from_interferograms(tmp_path / "isce2", wavelength=WAVELENGTH, shape=(32, 64))


@pytest.mark.slow
@pytest.mark.realdata
def test_depsi_run_from_a_yaml_alone_agrees_with_dolphin(crop, tmp_path):
    """The whole chain on the real stack, no baselines, no hand-made file: it finishes, says it
    has no height, covers at least half of the pixels dolphin 0.42.9 finds coherent (temporal
    coherence >= 0.8, its PS step off; tests/data/README.md) and agrees with its velocities
    there: a positive correlation and an RMS difference of at most 1 mm/yr after a common
    reference (measured: 74 %, +0.29, 0.54 mm/yr; with depsi's sign turned the correlation
    would be -0.29)."""
    assert main(["run", str(_config(crop, tmp_path)), "--no-progress"]) == 0
    result = open_stm(tmp_path / "ws" / "stm.zarr").compute()
    assert "height_error" not in result and "no baselines" in result.attrs["height_term"]
    # PS by the phase similarity and, added by default on interferograms, the DS
    assert set(np.unique(result["scatterer"].values).tolist()) == {0, 1}
    assert (result["reference_distance"].values >= 0).all()
    ours = np.full(SHAPE, np.nan)
    ours[result["azimuth"].values, result["range"].values] = result["velocity"].values * 1e3
    with np.load(crop / "dolphin_velocity.npz") as dolphin:
        theirs = dolphin["velocity"].astype(np.float64) * 1e3
        coherent = dolphin["temporal_coherence"] >= 0.8
    both = coherent & np.isfinite(ours) & np.isfinite(theirs)
    assert both.sum() >= 0.5 * coherent.sum()
    assert np.corrcoef(ours[both], theirs[both])[0, 1] > 0.15
    difference = ours[both] - theirs[both]
    assert np.sqrt(np.mean((difference - np.median(difference)) ** 2)) <= 1.0
    table = (tmp_path / "ws" / "exports" / "points.csv").read_text().splitlines()
    assert "velocity" in table[0] and "height_error" not in table[0]
    assert len(table) == result.sizes["space"] + 1


@pytest.mark.realdata
@pytest.mark.parametrize("chunks", [(10, 13), pytest.param((1, 64), marks=pytest.mark.slow),
                                    pytest.param((7, 7), marks=pytest.mark.slow)])
def test_phase_selection_does_not_depend_on_the_chunks(crop, chunks):
    """Each block sees its neighbours' pixels (a halo of one): the same points, similarities
    and values whatever the blocks."""
    from depsi.processing.selection import ps_selection

    whole = ps_selection(from_interferograms(crop, wavelength=WAVELENGTH, shape=SHAPE),
                         method="phase").compute()
    split = ps_selection(from_interferograms(crop, wavelength=WAVELENGTH, shape=SHAPE,
                                             chunks=chunks), method="phase").compute()
    assert whole.sizes["space"] == split.sizes["space"] > 300
    for name in ("azimuth", "range", "phase_similarity", "complex"):
        np.testing.assert_array_equal(whole[name].values, split[name].values)
