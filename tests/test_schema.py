"""The STM conventions: validate() accepts conforming Datasets and names what is wrong."""

import numpy as np
import pytest
import xarray as xr

from depsi.stm import STMValidationError, validate

DATES = np.array(["2020-01-01", "2020-01-13", "2020-01-25"], dtype="datetime64[ns]")


def points(n=4, **attrs):
    rng = np.random.default_rng(1)
    return xr.Dataset(
        {
            "complex": (("space", "time"), (rng.normal(size=(n, 3)) + 1j).astype("c8")),
            "amplitude": (("space", "time"), rng.random((n, 3), dtype="f4")),
        },
        coords={
            "time": DATES,
            "azimuth": ("space", np.arange(n)),
            "range": ("space", np.arange(n)),
            "lat": ("space", np.linspace(52.0, 52.1, n)),
            "lon": ("space", np.linspace(4.0, 4.1, n)),
        },
        attrs={"wavelength": 0.0555, **attrs},
    )


def test_validate_accepts_a_conforming_points_stm_and_returns_it():
    ds = points()
    assert validate(ds, require=("complex",), require_wavelength=True) is ds


def test_missing_dimension_names_the_dimension():
    ds = points().rename({"space": "points"})
    with pytest.raises(STMValidationError, match="dimension 'space'"):
        validate(ds)


def test_wrong_dtype_names_the_variable_and_dtype():
    ds = points()
    ds["amplitude"] = ds["amplitude"].astype("c8")
    with pytest.raises(STMValidationError, match=r"variable 'amplitude'.*floating.*complex64"):
        validate(ds)


def test_nan_coordinate_is_rejected_with_count():
    ds = points()
    lat = ds["lat"].values.copy()
    lat[2] = np.nan
    ds = ds.assign_coords(lat=("space", lat))
    with pytest.raises(STMValidationError, match=r"coordinate 'lat'.*1 NaN"):
        validate(ds)


def test_lazy_coordinates_are_checked_where_their_chunks_are(monkeypatch):
    """A chunked coordinate (the chain's result on a cluster) is counted by a reduction, never
    gathered whole (``__array__`` would concatenate it on one worker)."""
    import dask.array as da

    def gathered(self, *args, **kwargs):
        raise AssertionError("a lazy coordinate was gathered whole")

    lat = np.linspace(52.0, 52.1, 8)
    ds = points(8).assign_coords(lat=("space", da.from_array(lat, chunks=3)))
    monkeypatch.setattr(da.Array, "__array__", gathered)
    assert validate(ds) is ds
    lat[5] = np.inf
    ds = ds.assign_coords(lat=("space", da.from_array(lat, chunks=3)))
    with pytest.raises(STMValidationError, match=r"coordinate 'lat'.*1 NaN/inf"):
        validate(ds)


def test_duplicate_epochs_are_named():
    ds = points().assign_coords(time=DATES[[0, 1, 1]])
    with pytest.raises(STMValidationError, match="duplicate epoch"):
        validate(ds)


def test_unsorted_epochs_are_named():
    ds = points().assign_coords(time=DATES[[0, 2, 1]])
    with pytest.raises(STMValidationError, match="sorted in increasing order"):
        validate(ds)


def test_missing_wavelength_when_phase_needs_converting():
    ds = points()
    del ds.attrs["wavelength"]
    with pytest.raises(STMValidationError, match="attribute 'wavelength'"):
        validate(ds, require_wavelength=None)
    validate(ds)  # not needed when nothing is converted


def test_implausible_wavelength_is_rejected():
    ds = points(wavelength=55.5)
    with pytest.raises(STMValidationError, match=r"wavelength.*55.5"):
        validate(ds, require_wavelength=True)


def test_missing_required_variable_lists_what_is_there():
    with pytest.raises(STMValidationError, match=r"variable 'h2ph'.*amplitude"):
        validate(points(), require=("h2ph",))


def test_arcs_need_integer_source_and_target():
    arcs = xr.Dataset(
        {"phase": (("arc", "time"), np.zeros((2, 3), "f4"))},
        coords={"time": DATES, "source": ("arc", [0, 1]), "target": ("arc", [1, 2])},
    )
    validate(arcs, kind="arcs")
    with pytest.raises(STMValidationError, match="coordinate 'target'"):
        validate(arcs.drop_vars("target"), kind="arcs")


def test_unknown_kind_and_non_dataset_are_rejected():
    with pytest.raises(STMValidationError, match="argument 'kind'"):
        validate(points(), kind="cube")
    with pytest.raises(STMValidationError, match="xarray.Dataset"):
        validate(np.zeros(3))
