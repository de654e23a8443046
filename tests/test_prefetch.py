"""Background prefetching: order, overlap, bounded look-ahead, errors and clean shutdown."""

from __future__ import annotations

import threading
import time

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from depsi.io.prefetch import block_slices, iter_blocks, iter_processed_blocks, prefetched


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "depsi-prefetch"]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    assert _prefetch_threads() == [], "a prefetch worker thread outlived its loop"


def _stack(shape=(10, 14, 5), chunks=None) -> xr.Dataset:
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    slc = (values + 1j * values).astype(np.complex64)
    data = da.from_array(slc, chunks=chunks) if chunks else slc
    return xr.Dataset(
        {"complex": (("azimuth", "range", "time"), data)},
        coords={"azimuth": np.arange(shape[0]), "range": np.arange(shape[1]),
                "lat": (("azimuth", "range"), values[..., 0].astype(np.float64))},
    )


def test_prefetched_yields_every_item_in_order():
    assert list(prefetched(lambda x: 2 * x, range(7), prefetch=3)) == [(i, 2 * i) for i in range(7)]


def test_prefetched_loads_the_next_item_while_the_consumer_holds_this_one():
    """Overlap as behaviour, not speed: while the consumer still holds item k, item k + 1 gets
    loaded on the worker thread (a serial loop would load it only when asked for it)."""
    loaded = [threading.Event() for _ in range(6)]
    loaders = set()

    def load(item):
        loaders.add(threading.current_thread().name)
        loaded[item].set()
        return item

    for item, _ in prefetched(load, range(len(loaded)), prefetch=2):
        if item + 1 < len(loaded):
            # the timeout only turns a serial implementation's hang into a failure
            assert loaded[item + 1].wait(timeout=60), f"item {item + 1} was not loaded ahead"
    assert loaders == {"depsi-prefetch"}


def test_prefetched_reads_at_most_prefetch_ahead():
    loaded = []
    for consumed, _ in enumerate(prefetched(loaded.append, range(20), prefetch=2), start=1):
        time.sleep(0.01)
        # queue of 2 plus the one load in progress
        assert len(loaded) <= consumed + 3


def test_loader_error_is_reraised_in_consumer():
    def load(item):
        if item == 3:
            raise OSError("disk gone at block 3")
        return item

    seen = []
    with pytest.raises(OSError, match="disk gone at block 3"):
        for item, _ in prefetched(load, range(10)):
            seen.append(item)
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("workers", [1, 3])
def test_consumer_stopping_early_stops_the_worker(workers):
    blocks = prefetched(lambda x: x, range(1000), prefetch=2, workers=workers)
    for item, _ in blocks:
        if item == 2:
            break
    blocks.close()
    assert _prefetch_threads() == []


@pytest.mark.parametrize("workers", [1, 3])
def test_keyboard_interrupt_in_consumer_joins_the_worker(workers):
    with pytest.raises(KeyboardInterrupt):
        for item, _ in prefetched(lambda x: x, range(1000), prefetch=2, workers=workers):
            if item == 5:
                raise KeyboardInterrupt


def test_prefetch_must_be_positive():
    with pytest.raises(ValueError, match="prefetch"):
        next(prefetched(lambda x: x, range(3), prefetch=0))


def test_several_workers_yield_every_item_in_order():
    def load(item):
        time.sleep(0.001 * (item % 3))  # later items sometimes finish first
        return 2 * item

    assert list(prefetched(load, range(30), prefetch=2, workers=3)) == [
        (i, 2 * i) for i in range(30)]


def test_several_workers_load_at_the_same_time():
    """Two loads in progress at once: each waits for the other at a barrier, which a single
    worker could never pass (the timeout turns that hang into a failure)."""
    both_loading = threading.Barrier(2, timeout=60)
    loaders = set()

    def load(item):
        loaders.add(threading.current_thread().name)
        both_loading.wait()
        return item

    assert [item for item, _ in prefetched(load, range(6), workers=2)] == list(range(6))
    assert loaders == {"depsi-prefetch"}


def test_several_workers_read_at_most_prefetch_plus_workers_ahead():
    loaded = []
    taking = threading.Lock()

    def load(item):
        with taking:
            loaded.append(item)

    for consumed, _ in enumerate(prefetched(load, range(40), prefetch=2, workers=3), start=1):
        time.sleep(0.005)
        assert len(loaded) <= consumed + 2 + 3


def test_several_workers_reraise_an_error_after_every_earlier_item():
    def load(item):
        if item == 5:
            raise OSError("disk gone at block 5")
        time.sleep(0.002)
        return item

    seen = []
    with pytest.raises(OSError, match="disk gone at block 5"):
        for item, _ in prefetched(load, range(50), workers=3):
            seen.append(item)
    assert seen == [0, 1, 2, 3, 4]


def test_an_error_of_the_items_iterator_is_reraised_in_order():
    def items():
        yield from range(3)
        raise RuntimeError("listing failed")

    seen = []
    with pytest.raises(RuntimeError, match="listing failed"):
        for item, _ in prefetched(lambda x: x, items(), workers=2):
            seen.append(item)
    assert seen == [0, 1, 2]


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers"):
        next(prefetched(lambda x: x, range(3), workers=0))


@pytest.mark.parametrize("chunks, block_shape", [((4, 5, -1), None), (None, (3, 8)),
                                                 ((4, 5, -1), (10, 14)), ((4, 5, -1), (6, 6))])
def test_iter_blocks_visits_every_pixel_once(chunks, block_shape):
    stack = _stack(chunks=chunks)
    rebuilt = np.zeros(stack["complex"].shape, np.complex64)
    visits = np.zeros(stack["complex"].shape[:2], int)
    for (az, rg), block in iter_blocks(stack, block_shape, prefetch=2):
        rebuilt[az, rg] = block["complex"]
        visits[az, rg] += 1
        np.testing.assert_array_equal(block["lat"], stack["lat"].values[az, rg])
    np.testing.assert_array_equal(rebuilt, stack["complex"].values)
    assert (visits == 1).all()


def test_iter_processed_blocks_processes_on_the_workers_and_keeps_block_order():
    stack = _stack(chunks=(4, 5, -1))
    threads = set()

    def total(slices, block):
        threads.add(threading.current_thread().name)
        return slices, complex(block["complex"].sum())

    results = list(iter_processed_blocks(stack, total, workers=3))
    assert [slices for slices, _ in results] == block_slices(stack)
    for slices, (seen, value) in results:
        assert seen == slices
        assert value == complex(stack["complex"].values[slices].sum())
    assert threads == {"depsi-prefetch"}


def test_split_time_gives_one_piece_per_dask_chunk_along_time():
    stack = _stack(chunks=(4, 5, 2)).transpose("time", "azimuth", "range")
    for (az, rg), block in iter_processed_blocks(stack, lambda slices, b: b, split_time=True):
        pieces = block["complex"]
        assert [piece.shape[-1] for piece in pieces] == [2, 2, 1]  # time last, chunks of 2
        np.testing.assert_array_equal(
            np.concatenate(pieces, axis=-1),
            stack["complex"].transpose("azimuth", "range", "time").values[az, rg])
        assert isinstance(block["lat"], np.ndarray)  # no time: one array


def test_split_time_of_an_in_memory_stack_is_one_piece():
    stack = _stack()
    (_, block), = list(iter_processed_blocks(stack, lambda slices, b: b, (10, 14),
                                             split_time=True))
    assert len(block["complex"]) == 1
    np.testing.assert_array_equal(block["complex"][0], stack["complex"].values)


def test_iter_blocks_follow_the_dask_chunks_by_default():
    stack = _stack(chunks=(4, 5, -1))
    slices = block_slices(stack)
    assert [(s[0].start, s[1].start) for s in slices[:3]] == [(0, 0), (0, 5), (0, 10)]
    assert len(slices) == 3 * 3


def test_iter_blocks_transposes_to_azimuth_range_first():
    stack = _stack().transpose("time", "range", "azimuth")
    (_, block), = list(iter_blocks(stack, (10, 14), variables=["complex"]))
    assert block["complex"].shape == (10, 14, 5)


def test_iter_blocks_progress_bar(capsys):
    list(iter_blocks(_stack(), (5, 7), progress=True, desc="test blocks"))
    assert "test blocks" in capsys.readouterr().err


def test_iter_blocks_unknown_variable():
    with pytest.raises(KeyError, match="h2ph"):
        next(iter_blocks(_stack(), variables=["h2ph"]))


def test_iter_blocks_refuses_variables_without_azimuth_and_range():
    stack = _stack().assign_coords(epoch_index=("time", np.arange(5)))
    with pytest.raises(ValueError, match="epoch_index"):
        next(iter_blocks(stack, variables=["complex", "epoch_index"]))


@pytest.mark.parametrize("time_chunk", [None, 3])
def test_blocks_of_a_store_are_read_from_it_directly_with_the_values_dask_reads(
        tmp_path, time_chunk, monkeypatch):
    """A variable opened straight from a store is read through xarray's lazy view of it, not
    a Dask graph per block; its blocks (and time pieces) are those Dask gives. Any other graph
    (a window, a transpose, arithmetic) is read through Dask."""
    from depsi.io import prefetch

    rng = np.random.default_rng(3)
    values = (rng.normal(size=(9, 11, 7)) + 1j * rng.normal(size=(9, 11, 7))).astype("c8")
    xr.Dataset({"complex": (("azimuth", "range", "time"), values)}).chunk(
        {"azimuth": 4, "range": 5, "time": time_chunk or -1}).to_zarr(tmp_path / "s.zarr")
    stack = xr.open_zarr(tmp_path / "s.zarr")
    data = stack["complex"].data
    assert prefetch.stored_source(data) is not None
    for other in (stack["complex"].isel(time=slice(1, 5)).data, (stack["complex"] * 2).data,
                  stack["complex"].transpose("time", ...).data, da.from_array(values), values):
        assert prefetch.stored_source(other) is None

    def as_read(slices, block):
        return block["complex"]

    with monkeypatch.context() as patch:  # the blocks Dask reads
        patch.setattr(prefetch, "stored_source", lambda data: None)
        expected = list(iter_processed_blocks(stack, as_read, (4, 6), split_time=True))
    monkeypatch.setattr(prefetch.dask, "compute", lambda *a, **k: pytest.fail("read by Dask"))
    got = list(iter_processed_blocks(stack, as_read, (4, 6), split_time=True))
    assert len(got) == len(expected) == 6
    for (slices, pieces), (expected_slices, expected_pieces) in zip(got, expected):
        assert slices == expected_slices
        assert len(pieces) == len(expected_pieces) == (3 if time_chunk else 1)
        for piece, expected_piece in zip(pieces, expected_pieces):
            np.testing.assert_array_equal(piece, expected_piece)
        np.testing.assert_array_equal(np.concatenate(pieces, axis=-1), values[slices])
