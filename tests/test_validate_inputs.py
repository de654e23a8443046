"""Wrong files are refused with their names, not read as numbers.

File-level checks run in the readers before any pixel is read; value checks in
:func:`depsi.io.validate.validate_stack` read a bounded sample. Each test writes a small valid
input, breaks one thing, and checks that the message names the input and the check; the valid
input still reads.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from depsi.io import from_csv, open_binary_folder, open_slc_zarr
from depsi.io.csv import MAX_LINE_BYTES
from depsi.io.validate import (
    H2PH_MAX,
    SAMPLE_CHUNK_SHARE,
    SAMPLE_GRID,
    SAMPLE_WINDOW,
    InputValidationError,
    sample_windows,
    validate_stack,
)
from depsi.simulate import simulate_stack, write_stack_binary
from depsi.stm.schema import STMValidationError


@pytest.fixture(scope="module")
def binary_folder(tmp_path_factory) -> dict:
    return write_stack_binary(tmp_path_factory.mktemp("binary") / "stack", shape=(30, 30),
                              n_epochs=6, progress=False)


@pytest.fixture
def folder(binary_folder, tmp_path) -> Path:
    """A fresh copy of the binary stack, to break."""
    return Path(shutil.copytree(binary_folder["folder"], tmp_path / "stack"))


@pytest.fixture(scope="module")
def stack():
    return simulate_stack(shape=(30, 30), n_epochs=6, chunks=10)[0]


def _zarr(stack, path: Path, zarr_format: int) -> Path:
    stack.to_zarr(path, zarr_format=zarr_format, consolidated=zarr_format == 2)
    return path


# ------------------------------------------------------------------------ binary h2ph files
def test_valid_binary_folder_reads_with_h2ph(folder):
    ds = open_binary_folder(folder)
    assert "h2ph" in ds.data_vars
    assert validate_stack(ds, source=str(folder)) is ds


def test_h2ph_written_as_float64_is_refused_naming_file_and_bytes(folder):
    bad = sorted(folder.glob("h2ph_*.raw"))[2]
    np.fromfile(bad, "<f4").astype("<f8").tofile(bad)
    with pytest.raises(InputValidationError,
                       match=rf"expected 3600 bytes each .*'{bad}' has 7200 bytes \(that is "
                             r"float64 data of this shape\)"):
        open_binary_folder(folder)


def test_one_missing_h2ph_file_is_refused_naming_it(folder):
    gone = sorted(folder.glob("h2ph_*.raw"))[4]
    gone.unlink()
    with pytest.raises(InputValidationError, match=rf"found 5 of 6; missing: \['{gone.name}'\]"):
        open_binary_folder(folder)


def test_no_h2ph_files_gives_h2ph_from_the_orbits(folder):
    for path in folder.glob("h2ph_*.raw"):
        path.unlink()
    ds = open_binary_folder(folder)
    assert "orbits" in ds["h2ph"].attrs["long_name"]


def test_all_zero_h2ph_is_refused_naming_its_source(folder):
    for path in folder.glob("h2ph_*.raw"):
        np.zeros(900, "<f4").tofile(path)
    ds = open_binary_folder(folder)
    with pytest.raises(InputValidationError, match=r"h2ph \(.*h2ph_YYYYMMDD.raw\): expected a "
                                                   "non-zero height-to-phase factor"):
        validate_stack(ds, source=str(folder))


def test_h2ph_beyond_the_physical_bound_is_refused(stack):
    wild = stack.assign(h2ph=stack.h2ph * 0 + np.float32(3.7e19))
    with pytest.raises(InputValidationError,
                       match=rf"stack: h2ph.*expected \|h2ph\| <= {H2PH_MAX}.*up to 3.7e\+19"):
        validate_stack(wild)


# -------------------------------------------------------------------------- zarr chunks
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_store_with_a_deleted_chunk_is_refused_naming_the_key(stack, tmp_path,
                                                                   zarr_format):
    store = _zarr(stack, tmp_path / "slc.zarr", zarr_format)
    assert open_slc_zarr(store).sizes["time"] == 6
    key = "1.2.0" if zarr_format == 2 else "c/1/2/0"
    (store / "complex" / key).unlink()
    with pytest.raises(STMValidationError, match=rf"variable 'complex': expected all 9 chunks .*"
                                                 rf"found 1 missing \(such as \['{key}'\]\)"):
        open_slc_zarr(store)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_metadata_claiming_far_more_chunks_is_refused_fast(stack, tmp_path, zarr_format):
    store = _zarr(stack, tmp_path / "slc.zarr", zarr_format)
    meta = store / "complex" / (".zarray" if zarr_format == 2 else "zarr.json")
    document = json.loads(meta.read_text())
    document["shape"] = [300_000, 300_000, 6]
    meta.write_text(json.dumps(document))
    with pytest.raises(STMValidationError, match=r"'complex'.* found 899999991 missing"):
        open_slc_zarr(store)


def test_zarr_h2ph_chunk_left_out_at_the_mother_alone_is_accepted(stack, tmp_path):
    per_epoch = stack.chunk({"time": 1})
    store = _zarr(per_epoch, tmp_path / "slc.zarr", 3)
    mother = int(np.flatnonzero(stack.time.values.astype("datetime64[D]") == np.datetime64(
        stack.attrs["mother_time"]))[0])
    for path in (store / "h2ph" / "c").rglob(f"{mother}"):
        if path.is_file():
            path.unlink()
    assert open_slc_zarr(store).sizes["time"] == 6
    (store / "h2ph" / "c" / "0" / "0" / str((mother + 1) % 6)).unlink()
    with pytest.raises(STMValidationError, match="variable 'h2ph'"):
        open_slc_zarr(store)


# --------------------------------------------------------------------- amplitude per epoch
def _flatten(stack, epoch: int, value: complex):
    return stack.assign(complex=stack.complex.where(stack.time != stack.time[epoch], value))


def test_an_all_zero_epoch_is_refused_naming_its_date(stack):
    day = str(stack.time.values[1])[:10]
    with pytest.raises(InputValidationError, match=rf"epoch {day}: expected an amplitude that "
                                                   "varies, found all zero"):
        validate_stack(_flatten(stack, 1, 0))


def test_a_constant_epoch_is_dropped_when_asked_with_a_warning(stack, caplog):
    day = stack.time.values[4]
    with caplog.at_level(logging.WARNING, logger="depsi.io.validate"):
        kept = validate_stack(_flatten(stack, 4, 3 + 4j), on_bad_epoch="drop")
    assert kept.sizes["time"] == 5 and day not in kept.time.values
    assert "dropped 1 of 6 epochs" in caplog.text and str(day)[:10] in caplog.text


def test_the_mother_epoch_is_never_dropped(stack):
    mother = int(np.flatnonzero(stack.time.values.astype("datetime64[D]") == np.datetime64(
        stack.attrs["mother_time"]))[0])
    with pytest.raises(InputValidationError, match="the mother epoch cannot be dropped"):
        validate_stack(_flatten(stack, mother, 0), on_bad_epoch="drop")


def test_non_finite_phase_is_refused(stack):
    with pytest.raises(InputValidationError, match="expected finite complex values"):
        validate_stack(_flatten(stack, 0, np.nan))


@pytest.mark.slow
def test_the_sample_is_bounded_for_a_large_lazy_stack():
    big = simulate_stack(shape=(2000, 2000), n_epochs=3, chunks=500)[0]
    assert validate_stack(big) is big  # reads 3 windows, not 4 million pixels x 3


def _chunk_of(edges: np.ndarray, window: slice) -> int:
    first = int(np.searchsorted(edges, window.start, side="right")) - 1
    last = int(np.searchsorted(edges, window.stop - 1, side="right")) - 1
    assert first == last, f"window {window} crosses a chunk edge ({edges.tolist()})"
    return first


@settings(max_examples=60, deadline=None)
@given(shape=st.tuples(st.integers(1, 3000), st.integers(1, 3000)),
       chunk=st.tuples(st.integers(1, 700), st.integers(1, 700)))
def test_the_sample_reads_a_bounded_share_of_the_chunks(shape, chunk):
    import dask.array as da

    data = da.zeros((*shape, 2), chunks=(*chunk, 2))
    windows = sample_windows(data)
    edges = [np.concatenate([[0], np.cumsum(c)]) for c in data.chunks[:2]]
    touched = {tuple(_chunk_of(e, w) for e, w in zip(edges, pair)) for pair in windows}
    n_chunks = len(data.chunks[0]) * len(data.chunks[1])
    assert 1 <= len(touched) <= min(SAMPLE_GRID, max(1, n_chunks // SAMPLE_CHUNK_SHARE))
    if n_chunks >= SAMPLE_GRID * SAMPLE_CHUNK_SHARE and min(shape) >= 3 * max(chunk):
        assert len(touched) == SAMPLE_GRID  # a large scene: its centre and both corners
    for a, r in windows:
        assert 0 <= a.start < a.stop <= shape[0] and 0 <= r.start < r.stop <= shape[1]
    # each window as large as its chunk allows, up to SAMPLE_GRID x SAMPLE_WINDOW**2 pixels
    side = int(np.sqrt(SAMPLE_GRID) * SAMPLE_WINDOW)
    for a, r in windows:
        for window, e in zip((a, r), edges):
            k = _chunk_of(e, window)
            assert window.stop - window.start == min(side, int(e[k + 1] - e[k]))


def test_validation_decodes_one_chunk_of_a_sixteen_chunk_stack():
    """Every block the validation computes is recorded: 1 of each variable's 16, not all."""
    import threading

    import dask.array as da

    small = simulate_stack(shape=(200, 200), n_epochs=3)[0]
    computed, lock = [], threading.Lock()

    def recorded(name):
        values = small[name].transpose("azimuth", "range", "time").values

        def block(block_info=None):
            where = block_info[None]["array-location"]
            with lock:
                computed.append((name, *(start for start, _ in where[:2])))
            return values[tuple(slice(*span) for span in where)]
        return da.map_blocks(block, chunks=((50,) * 4, (50,) * 4, (3,)), dtype=values.dtype,
                             meta=np.empty((0, 0, 0), values.dtype))

    stack = small.assign(complex=(("azimuth", "range", "time"), recorded("complex")),
                         h2ph=(("azimuth", "range", "time"), recorded("h2ph")))
    assert validate_stack(stack) is stack
    for name in ("complex", "h2ph"):
        blocks = {c[1:] for c in computed if c[0] == name}
        assert len(blocks) == 1, blocks



# ------------------------------------------------------------------------ epoch span
def test_epochs_within_one_day_are_refused_naming_the_dates(stack, tmp_path):
    store = _zarr(stack, tmp_path / "slc.zarr", 3)
    hours = [f"2023-03-19T{h:02d}:00" for h in range(6)]
    with pytest.raises(InputValidationError, match=r"expected epochs spanning at least 1 day, "
                                                   r"found 6 epochs within 5 hours.*2023-03-19T00"):
        open_slc_zarr(store, dates=hours)
    same_day = stack.assign_coords(time=np.array(hours, "datetime64[ns]"))
    with pytest.raises(InputValidationError, match="spanning at least 1 day"):
        validate_stack(same_day)


def test_two_epochs_a_day_apart_are_legal(tmp_path):
    info = write_stack_binary(tmp_path / "pair", shape=(10, 10), n_epochs=2, progress=False)
    assert open_binary_folder(info["folder"]).sizes["time"] == 2


# ------------------------------------------------------------------------------ CSV
def _csv(path: Path, **changes) -> Path:
    frame = pd.DataFrame({"pnt_id": ["L0P0", "L1P1", "L2P2"], "pnt_line": [0, 1, 2],
                          "pnt_pixel": [0, 1, 2], "pnt_lat": [52.0, 52.1, 52.2],
                          "pnt_lon": [4.3, 4.4, 4.5], "d_20160327": [0.0, 0.0, 0.0],
                          "d_20160408": [0.001, -0.002, 0.0]})
    for column, values in changes.items():
        frame[column] = values
    frame.to_csv(path, index=False)
    return path


def test_valid_csv_reads(tmp_path):
    assert from_csv(_csv(tmp_path / "ps.csv"), names="depsi").sizes["space"] == 3


def test_latitude_999_is_refused_naming_column_and_rows(tmp_path):
    path = _csv(tmp_path / "ps.csv", pnt_lat=[52.0, 999.0, 999.0])
    with pytest.raises(STMValidationError, match=r"column 'pnt_lat' .*expected degrees in "
                                                 r"\[-90, 90\], found 2 of 3 rows outside"):
        from_csv(path, names="depsi")


def test_longitude_beyond_360_is_refused_and_0_to_360_is_legal(tmp_path):
    east = _csv(tmp_path / "east.csv", pnt_lon=[4.0, 359.0, 181.0])
    assert from_csv(east, names="depsi").sizes["space"]
    with pytest.raises(STMValidationError, match=r"column 'pnt_lon' .*found 1 of 3 rows"):
        from_csv(_csv(tmp_path / "ps.csv", pnt_lon=[4.0, 400.0, 4.1]), names="depsi")


def test_non_utf8_csv_is_refused_naming_the_byte_offset(tmp_path):
    path = _csv(tmp_path / "ps.csv")
    text = path.read_bytes()
    at = text.index(b"L1P1")
    path.write_bytes(text[:at] + b"\xe9" + text[at + 1:])
    with pytest.raises(STMValidationError, match=rf"'{path}': expected UTF-8 text, found the "
                                                 rf"byte\(s\) b'\\xe9' at byte offset {at}"):
        from_csv(path, names="depsi")


def test_a_line_longer_than_the_limit_is_refused(tmp_path):
    path = _csv(tmp_path / "ps.csv")
    with path.open("ab") as f:
        f.write(b"L9P9," + b"9" * (MAX_LINE_BYTES + 10) + b"\n")
    with pytest.raises(STMValidationError, match=r"expected lines of at most 1048576 bytes"):
        from_csv(path, names="depsi")


def test_a_directory_is_refused_as_csv(tmp_path):
    with pytest.raises(STMValidationError, match="expected a regular file"):
        from_csv(tmp_path, names="depsi")
