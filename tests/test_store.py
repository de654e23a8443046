"""Zarr stores: atomic writes, lazy validated reads (v3 and v2), appends, Morton order."""

from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from depsi.io import append_epochs, open_stm, save_stm
from depsi.io.store import space_chunk_size
from depsi.stm import STMValidationError, morton_key, morton_order

DATES = np.arange("2020-01-01", "2020-03-01", 12, dtype="datetime64[D]").astype("datetime64[ns]")


def point_stm(n=500, t=5, seed=0):
    rng = np.random.default_rng(seed)
    position = rng.permutation(n)  # every point at its own pixel, in random order
    az, rg = position // 23, position % 23
    slc = (rng.normal(size=(n, t)) + 1j * rng.normal(size=(n, t))).astype("c8")
    return xr.Dataset(
        {
            "complex": (("space", "time"), slc),
            "amplitude": (("space", "time"), np.abs(slc)),
            "point_id": ("space", np.array([f"L{a:08d}P{r:08d}x{i}" for i, (a, r)
                                            in enumerate(zip(az, rg))])),
        },
        coords={"time": DATES[:t], "azimuth": ("space", az), "range": ("space", rg),
                "lat": ("space", 52 + az * 1e-4), "lon": ("space", 4 + rg * 1e-4)},
        attrs={"wavelength": 0.0555},
    )


def written(folder: Path) -> list[Path]:
    """What is in ``folder`` besides the writers' lock files (kept, hidden, by design)."""
    return [p for p in folder.iterdir() if not p.name.endswith("-lock")]


def test_round_trip_preserves_values_in_morton_order(tmp_path):
    ds = point_stm()
    out = open_stm(save_stm(ds, tmp_path / "ps.zarr"))
    keys = morton_key(out["azimuth"].values, out["range"].values)
    assert (np.diff(keys.astype(np.int64)) >= 0).all()
    # every point is still there with its own time series
    order = np.lexsort((ds["range"].values, ds["azimuth"].values))
    back = np.lexsort((out["range"].values, out["azimuth"].values))
    np.testing.assert_array_equal(out["complex"].values[back], ds["complex"].values[order])
    np.testing.assert_array_equal(out["time"].values, ds["time"].values)
    assert out.attrs["wavelength"] == 0.0555


def test_open_is_lazy_with_time_in_one_chunk(tmp_path):
    out = open_stm(save_stm(point_stm(), tmp_path / "ps.zarr", chunk_bytes=2000))
    assert isinstance(out["complex"].data, da.Array)
    assert len(out.chunks["time"]) == 1
    assert len(out.chunks["space"]) > 1


def test_space_chunks_are_sized_by_bytes():
    ds = point_stm(n=10_000, t=5)
    row = 8 * 5 + 4 * 5 + 8 + 8 + 8 + 8 + ds["point_id"].dtype.itemsize
    assert space_chunk_size(ds, 100 * row) == 100
    assert space_chunk_size(ds, 10**12) == 10_000


def test_string_ids_keep_their_full_length(tmp_path):
    ds = point_stm()
    out = open_stm(save_stm(ds, tmp_path / "ps.zarr"))
    assert sorted(map(str, out["point_id"].values)) == sorted(ds["point_id"].values)
    assert max(len(str(s)) for s in out["point_id"].values) == max(map(len, ds["point_id"].values))


def test_existing_store_is_not_clobbered(tmp_path):
    path = save_stm(point_stm(seed=0), tmp_path / "ps.zarr")
    before = sorted(p.name for p in path.rglob("*"))
    with pytest.raises(FileExistsError, match="ps.zarr"):
        save_stm(point_stm(seed=1), path)
    assert sorted(p.name for p in path.rglob("*")) == before
    save_stm(point_stm(seed=1), path, overwrite=True)
    assert written(tmp_path) == [path]  # no temporary siblings left


def test_failed_write_leaves_no_store_and_keeps_the_old_one(tmp_path):
    path = save_stm(point_stm(seed=0), tmp_path / "ps.zarr")
    old = open_stm(path)["complex"].values

    def explode(block):
        raise RuntimeError("disk on fire")

    bad = point_stm(seed=1)
    exploding = da.from_array(bad["complex"].values, chunks=(100, -1)).map_blocks(explode,
                                                                                 dtype="c8")
    bad["complex"] = (("space", "time"), exploding)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_stm(bad, path, overwrite=True)
    np.testing.assert_array_equal(open_stm(path)["complex"].values, old)
    assert [p.name for p in written(tmp_path)] == ["ps.zarr"]
    with pytest.raises(RuntimeError):
        save_stm(bad, tmp_path / "new.zarr")
    assert not (tmp_path / "new.zarr").exists()


def test_invalid_stm_is_rejected_before_anything_is_written(tmp_path):
    ds = point_stm().assign_coords(time=DATES[[0, 1, 1, 3, 4]])
    with pytest.raises(STMValidationError, match="duplicate"):
        save_stm(ds, tmp_path / "ps.zarr")
    assert list(tmp_path.iterdir()) == []


def test_append_epochs_adds_time_without_rewriting_old_chunks(tmp_path):
    full = point_stm(t=5)
    path = save_stm(full.isel(time=slice(0, 3)), tmp_path / "ps.zarr")
    first_chunks = {p: p.stat().st_mtime_ns for p in (path / "complex" / "c").rglob("*")
                    if p.is_file()}
    stored = open_stm(path)
    new = full.isel(time=slice(3, 5))
    new = new.isel(space=morton_order(new["azimuth"].values, new["range"].values))
    append_epochs(path, new.assign_attrs(wavelength=0.0555, note="new"))
    out = open_stm(path)
    assert out.sizes["time"] == 5
    assert out.attrs == stored.attrs  # the store's attributes survive the append
    np.testing.assert_array_equal(out["complex"].values[:, :3], stored["complex"].values)
    np.testing.assert_array_equal(out["complex"].values[:, 3:], new["complex"].values)
    for p, mtime in first_chunks.items():
        assert p.stat().st_mtime_ns == mtime, f"old chunk {p} was rewritten"


def test_append_rejects_overlapping_epochs_and_other_points(tmp_path):
    full = point_stm(t=5)
    path = save_stm(full.isel(time=slice(0, 3)), tmp_path / "ps.zarr")
    stored = open_stm(path)
    with pytest.raises(STMValidationError, match="after the last stored epoch"):
        append_epochs(path, stored.isel(time=[2]))
    shifted = stored.isel(time=[0]).assign_coords(time=DATES[[4]])
    shifted = shifted.assign_coords(azimuth=("space", shifted["azimuth"].values + 1))
    with pytest.raises(STMValidationError, match="coordinate 'azimuth'"):
        append_epochs(path, shifted)
    assert open_stm(path).sizes["time"] == 3


def test_missing_store_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.zarr"):
        open_stm(tmp_path / "nope.zarr")


@pytest.mark.realdata
def test_reads_the_real_zarr_v2_stm(realdata, tmp_path):
    path = realdata / "depsi_stm_sparse" / "stm_sparse.zarr"
    ds = open_stm(path)
    assert dict(ds.sizes) == {"space": 156, "time": 10}
    assert ds["complex"].dtype == np.complex64
    values = ds.compute()
    np.testing.assert_allclose(values["amplitude"], np.abs(values["complex"]), rtol=1e-6)
    # and it survives a round trip into Zarr v3
    out = open_stm(save_stm(ds, tmp_path / "v3.zarr"))
    assert (Path(tmp_path / "v3.zarr") / "zarr.json").exists()
    a = np.sort(values["complex"].values.ravel().view("f4"))
    b = np.sort(out["complex"].values.ravel().view("f4"))
    np.testing.assert_array_equal(a, b)


def test_append_refuses_epochs_read_lazily_from_the_same_store(tmp_path):
    path = save_stm(point_stm(t=3), tmp_path / "ps.zarr")
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    stored = open_stm(path)
    later = np.array(["2021-01-01", "2021-01-13"], dtype="datetime64[ns]")
    new = stored.isel(time=slice(-2, None)).assign_coords(time=later)
    with pytest.raises(STMValidationError, match="read lazily from the store being appended"):
        append_epochs(path, new)
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    out = open_stm(path)
    assert out.sizes["time"] == 3
    np.testing.assert_array_equal(out["complex"].values, stored["complex"].values)
    append_epochs(path, new.compute())  # loaded into memory first, the same epochs append
    np.testing.assert_array_equal(open_stm(path)["complex"].values[:, 3:],
                                  stored["complex"].values[:, 1:])
