"""The stack check's decoded sample handed over to the selection's pass: each stored block is
decoded once for the two of them, the values are the same as without, and the blocks kept are
bounded and let go."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import xarray as xr

from depsi.io import open_slc_zarr, prefetch
from depsi.io.prefetch import (
    drop_handed_over,
    hand_over,
    handed_over_pixel,
    handover_room,
    take_handed_over,
)
from depsi.io.validate import InputValidationError, validate_stack
from depsi.pipeline.preflight import _centre_h2ph
from depsi.processing.selection import ps_selection
from depsi.simulate import simulate_stack


@pytest.fixture(autouse=True)
def nothing_kept():
    prefetch._handed.clear()
    yield
    prefetch._handed.clear()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A 40 x 40 stack of 16 stored chunks of 10 x 10 pixels, every epoch in one."""
    stack = simulate_stack(shape=(40, 40), n_epochs=8, chunks=10, seed=3)[0]
    for variable in stack.variables.values():
        variable.encoding = {}
    path = tmp_path_factory.mktemp("handover") / "slc.zarr"
    stack.to_zarr(path, zarr_format=3, consolidated=False)
    return path


def _kept() -> dict:
    return {key: sorted(blocks) for key, (_, blocks) in prefetch._handed.items()}


def _counting_reads(monkeypatch) -> list:
    """Every block of a time series (complex, h2ph; not lat/lon) the stream pass reads from
    the store, not taken as handed over."""
    read = []
    original = prefetch._read_stored

    def counted(source, chunks, slices, split, decoded=None):
        if decoded is None and len(chunks) == 3:
            read.append(tuple((s.start, s.stop) for s in slices))
        return original(source, chunks, slices, split, decoded)

    monkeypatch.setattr(prefetch, "_read_stored", counted)
    return read


def test_the_check_hands_its_whole_blocks_over(store):
    stack = validate_stack(open_slc_zarr(store))
    kept = _kept()
    # complex and h2ph, each the one block at the scene's centre
    assert sorted(kept.values()) == [[(20, 30, 20, 30)], [(20, 30, 20, 30)]]
    block = take_handed_over(stack["complex"].data, (slice(20, 30), slice(20, 30)))
    np.testing.assert_array_equal(block, stack["complex"].values[20:30, 20:30])
    assert take_handed_over(stack["complex"].data, (slice(20, 30), slice(20, 30))) is None


def test_the_selection_takes_the_blocks_and_reads_every_other_once(store, monkeypatch):
    stack = validate_stack(open_slc_zarr(store))
    read = _counting_reads(monkeypatch)
    points = ps_selection(stack, engine="stream")
    # 16 blocks of complex and of h2ph; the centre's of each taken, not read again
    assert len(read) == 2 * 15 and ((20, 30), (20, 30)) not in read
    assert prefetch._handed == {}  # nothing kept past the pass
    xr.testing.assert_identical(points, ps_selection(open_slc_zarr(store), engine="stream"))


def test_a_handed_over_block_is_what_the_selection_reads(store):
    """The pass takes the block handed over (here a block of zeros: no point there)."""
    stack = open_slc_zarr(store)
    block = (slice(0, 10), slice(0, 10))
    zeros = np.zeros((10, 10, stack.sizes["time"]), np.complex64)
    assert hand_over(stack["complex"].data, block, zeros)
    points = ps_selection(stack, engine="stream")
    inside = (points["azimuth"] < 10) & (points["range"] < 10)
    assert int(inside.sum()) == 0
    assert int(ps_selection(open_slc_zarr(store), engine="stream")["azimuth"].size) > int(
        points["azimuth"].size)


def test_the_dask_engine_lets_the_blocks_go(store):
    stack = validate_stack(open_slc_zarr(store))
    assert prefetch._handed
    ps_selection(stack, engine="dask")
    assert prefetch._handed == {}


def test_the_blocks_go_with_their_stack(store):
    stack = validate_stack(open_slc_zarr(store))
    assert prefetch._handed
    del stack
    gc.collect()
    assert prefetch._handed == {}


def test_the_blocks_kept_are_bounded(store, monkeypatch):
    monkeypatch.setattr(prefetch, "HANDOVER_BYTES", 10 * 10 * 8 * 8)  # one complex block
    stack = validate_stack(open_slc_zarr(store))  # complex and h2ph would not fit: windows
    assert prefetch._handed == {}
    data = stack["complex"].data
    block = np.asarray(stack["complex"][:10, :10].values)
    assert hand_over(data, (slice(0, 10), slice(0, 10)), block)
    assert handover_room() == 0
    assert not hand_over(data, (slice(10, 20), slice(0, 10)), block)
    drop_handed_over(data)
    assert handover_room() == prefetch.HANDOVER_BYTES


def test_a_block_of_another_shape_or_dtype_is_not_kept(store):
    data = open_slc_zarr(store)["complex"].data
    assert not hand_over(data, (slice(0, 10), slice(0, 10)), np.zeros((10, 9, 8), "c8"))
    assert not hand_over(data, (slice(0, 10), slice(0, 10)), np.zeros((10, 10, 8), "c16"))
    assert not hand_over(np.zeros((40, 40, 8), "c8"), (slice(0, 10), slice(0, 10)),
                         np.zeros((10, 10, 8), "c8"))
    assert prefetch._handed == {}


def test_the_checks_still_refuse_bad_values(store, tmp_path):
    stack = open_slc_zarr(store)
    bad = stack.assign(h2ph=stack["h2ph"] * 1e6)  # not a plain read: windows, as before
    with pytest.raises(InputValidationError, match="expected \\|h2ph\\|"):
        validate_stack(bad)
    broken = stack.load()
    broken["complex"][:, :, 2] = np.nan
    for variable in broken.variables.values():
        variable.encoding = {}
    broken.to_zarr(tmp_path / "nan.zarr", zarr_format=3, consolidated=False)
    with pytest.raises(InputValidationError, match="expected finite complex values"):
        validate_stack(open_slc_zarr(tmp_path / "nan.zarr"))


def test_the_centre_h2ph_comes_from_the_handed_over_block(store):
    stack = validate_stack(open_slc_zarr(store))
    expected = stack["h2ph"].values[20, 20].astype(np.float64)
    np.testing.assert_array_equal(handed_over_pixel(stack["h2ph"].data, 20, 20), expected)
    assert handed_over_pixel(stack["h2ph"].data, 0, 0) is None  # no block there
    values, where = _centre_h2ph(stack)
    np.testing.assert_array_equal(values, expected)
    assert where == "azimuth 20, range 20"


def test_a_handed_over_block_is_cut_as_its_time_chunks_are_read():
    decoded = np.arange(10 * 10 * 8, dtype=np.float32).reshape(10, 10, 8)
    chunks = ((10,), (10,), (3, 5))
    pieces = prefetch._read_stored(None, chunks, (slice(0, 10), slice(0, 10)), True, decoded)
    assert [p.shape for p in pieces] == [(10, 10, 3), (10, 10, 5)]
    assert all(p.flags.c_contiguous for p in pieces)  # as read: compiled kernels' layout
    np.testing.assert_array_equal(np.concatenate(pieces, axis=-1), decoded)
    whole = prefetch._read_stored(None, ((10,), (10,), (8,)), (slice(0, 10), slice(0, 10)),
                                  True, decoded)
    assert len(whole) == 1 and whole[0] is decoded


def test_the_handed_over_blocks_are_visited_first_when_asked(store):
    stack = validate_stack(open_slc_zarr(store))
    visit = prefetch.iter_processed_blocks(stack, lambda s, block: None,
                                           variables=["complex", "h2ph"], split_time=True,
                                           handed_over_first=True)
    order = [(a.start, r.start) for (a, r), _ in visit]
    assert order[0] == (20, 20) and sorted(order[1:]) == order[1:] and len(order) == 16
    assert prefetch._handed == {}
    plain = prefetch.iter_processed_blocks(validate_stack(open_slc_zarr(store)),
                                           lambda s, block: None, variables=["complex"])
    assert [(a.start, r.start) for (a, r), _ in plain][10] == (20, 20)  # in order otherwise
