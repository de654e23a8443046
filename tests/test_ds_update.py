"""New epochs into a stored DS product as its next mini-stacks ("new epochs
cost one mini-stack"): :func:`depsi.processing.scatterers.update_ds_selection` against the
sequential estimator run on the whole stack with the same SHP, a patch that decorrelates in the
new epochs, and what it refuses."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depsi.conventions import wrap_phase
from depsi.io.store import open_stm, save_stm
from depsi.processing.distributed_scatterers import phase_linking, select_shp
from depsi.processing.scatterers import (
    STATE_VARIABLES,
    ds_selection,
    merge_scatterers,
    update_ds_selection,
)
from depsi.processing.selection import ps_selection
from depsi.simulate.ds import simulate_ds_stack
from depsi.stm.schema import STMValidationError

FIRST, TOTAL, MINISTACK, WINDOW = 20, 40, 5, (7, 7)


@pytest.fixture(scope="module")
def stack():
    stack, _ = simulate_ds_stack(shape=(36, 48), n_epochs=TOTAL, seed=4)
    return stack.compute()


@pytest.fixture
def stored(stack, tmp_path):
    ds = ds_selection(stack.isel(time=slice(0, FIRST)), window=WINDOW, min_looks=10,
                      ministack=MINISTACK, max_compressed=3)  # reached: 8 mini-stacks in all
    return save_stm(ds, tmp_path / "ds.zarr")


@pytest.mark.slow
def test_update_is_the_whole_stacks_sequential_estimator_at_the_new_epochs(stack, stored):
    """Two updates (5 then 15 epochs) give the phases, bounds and compressed SLCs of the
    sequential estimator run on all 40 epochs with the first run's SHP, to float32 round-off;
    the first run's epochs and its acceptance figure stay as stored."""
    before = open_stm(stored).compute()
    update_ds_selection(stored, stack.isel(time=slice(FIRST, FIRST + 5)))
    after = update_ds_selection(stored, stack.isel(time=slice(FIRST + 5, TOTAL))).compute()
    assert after.sizes["time"] == TOTAL and after.sizes["space"] == before.sizes["space"]
    assert after.attrs["ds_state_end"] == str(stack["time"].values[-1])
    np.testing.assert_array_equal(after["phase"].values[:, :FIRST], before["phase"].values)
    np.testing.assert_array_equal(after["linked_coherence"].values,
                                  before["linked_coherence"].values)

    shp = select_shp(stack.isel(time=slice(0, FIRST)), window=WINDOW, min_looks=10).compute()
    whole = phase_linking(stack, shp, ministack=MINISTACK, max_compressed=3).compute()
    at = (after["azimuth"].values, after["range"].values)
    difference = wrap_phase(after["phase"].values - whole["phase"].values[at])
    assert np.abs(difference).max() < 1e-4
    np.testing.assert_allclose(after["ds_compressed"].values, whole["compressed"].values[at],
                               rtol=0, atol=1e-4 * np.abs(after["ds_compressed"].values).max())
    np.testing.assert_allclose(after["linked_phase_std"].values, whole["phase_std"].values[at],
                               rtol=1e-4)
    np.testing.assert_allclose(np.abs(after["complex"].values[:, FIRST:]),
                               after["amplitude"].values[:, :1] * np.ones((1, TOTAL - FIRST)),
                               rtol=1e-6)
    coherence = after["ds_update_coherence"].values
    assert np.isfinite(coherence).all() and np.median(coherence) > 0.9


def test_update_coherence_drops_where_the_ds_decorrelate(stack, stored):
    """A block of pixels replaced by noise in the new epochs: its DS get a low update
    coherence, the others keep theirs."""
    new = stack.isel(time=slice(FIRST, FIRST + 10)).copy(deep=True)
    rng = np.random.default_rng(1)
    noise = (rng.standard_normal((12, 16, 10)) + 1j * rng.standard_normal((12, 16, 10)))
    values = new["complex"].values
    values[10:22, 10:26] = (np.abs(values[10:22, 10:26]).mean() * noise).astype(values.dtype)
    new["complex"] = (new["complex"].dims, values)
    after = update_ds_selection(stored, new).compute()
    az, rg = after["azimuth"].values, after["range"].values
    inside = (az >= 13) & (az < 19) & (rg >= 13) & (rg < 23)  # windows wholly in the noise
    outside = (az < 4) | (az >= 28) | (rg < 4) | (rg >= 32)  # windows wholly outside
    coherence = after["ds_update_coherence"].values
    assert inside.sum() > 10 and outside.sum() > 100
    assert np.median(coherence[inside]) < 0.5 < 0.9 < np.median(coherence[outside])


@pytest.mark.slow
def test_a_killed_update_is_completed_by_the_same_call(stack, stored, tmp_path, monkeypatch):
    """Killed after its append, before its state: the store has the new epochs and the old
    state; the same call again completes it, equal to an update never interrupted."""
    copy = tmp_path / "copy.zarr"
    shutil.copytree(stored, copy)
    new = stack.isel(time=slice(FIRST, FIRST + 5))
    reference = update_ds_selection(copy, new).compute()

    open_group = zarr.open_group

    def killed(*args, **kwargs):  # the state's writer opens the group unconsolidated
        if kwargs.get("use_consolidated") is False and kwargs.get("mode") == "r+":
            raise KeyboardInterrupt
        return open_group(*args, **kwargs)

    monkeypatch.setattr(zarr, "open_group", killed)
    with pytest.raises(KeyboardInterrupt):
        update_ds_selection(stored, new)
    monkeypatch.undo()
    half = open_stm(stored)
    assert half.sizes["time"] == FIRST + 5
    assert half.attrs["ds_state_end"] == str(stack["time"].values[FIRST - 1])
    with pytest.raises(ValueError, match="pass the same new epochs again"):
        update_ds_selection(stored, stack.isel(time=slice(FIRST + 5, FIRST + 10)))
    done = update_ds_selection(stored, new).compute()
    for name in ("phase", "ds_compressed", "linked_phase_std", "ds_update_coherence"):
        np.testing.assert_array_equal(done[name].values, reference[name].values)


def test_a_half_written_state_is_refused(stack, stored):
    zarr.open_group(stored, mode="r+").attrs["ds_state_end"] = "writing"
    with pytest.raises(ValueError, match="killed while it wrote the compressed SLCs"):
        update_ds_selection(stored, stack.isel(time=slice(FIRST, FIRST + 5)))


def test_update_refuses_what_it_cannot_continue(stack, stored, tmp_path):
    new = stack.isel(time=slice(FIRST, FIRST + 5))
    plain = save_stm(ds_selection(stack.isel(time=slice(0, FIRST)), window=WINDOW,
                                  min_looks=10), tmp_path / "plain.zarr")
    with pytest.raises(STMValidationError, match=r"ds_selection\(\.\.\., ministack=M\)"):
        update_ds_selection(plain, new)
    with pytest.raises(ValueError, match="expected epochs after the last stored one"):
        update_ds_selection(stored, stack.isel(time=slice(FIRST - 2, FIRST + 3)))
    with pytest.raises(STMValidationError, match="first run's range grid"):
        update_ds_selection(stored, new.isel(range=slice(0, 40)))


def test_a_merged_product_drops_the_state(stack, stored):
    first = stack.isel(time=slice(0, FIRST))
    merged = merge_scatterers(ps_selection(first), open_stm(stored).compute())
    assert not set(STATE_VARIABLES) & set(merged.variables)
    assert "shp_cell" not in merged.dims


def test_one_epoch_beside_one_compressed_slc_has_no_update_coherence(stack, tmp_path, caplog):
    """Two SLCs fit any linked phase: the update's figure is NaN there, not a perfect 1, and a
    mini-stack shorter than the product's is logged."""
    ds = ds_selection(stack.isel(time=slice(0, FIRST)), window=WINDOW, min_looks=10,
                      ministack=MINISTACK, max_compressed=1)
    path = save_stm(ds, tmp_path / "one.zarr")
    with caplog.at_level("WARNING", logger="depsi.processing.scatterers"):
        after = update_ds_selection(path, stack.isel(time=slice(FIRST, FIRST + 1))).compute()
    assert np.isnan(after["ds_update_coherence"].values).all()
    assert "a mini-stack of 1 new epoch(s), not 5" in caplog.text


def test_update_from_a_chunked_lazy_raster_is_the_in_memory_one(stack, tmp_path):
    """New epochs as a user's stack arrives, lazy and chunked unlike the points' batches, with
    h2ph: the same product as from the raster in memory, and each point's own h2ph."""
    rng = np.random.default_rng(2)
    h2ph = (1e-4 + 1e-5 * rng.standard_normal(stack["complex"].shape)).astype(np.float32)
    stack = stack.assign(h2ph=(stack["complex"].dims, h2ph))
    ds = ds_selection(stack.isel(time=slice(0, FIRST)), window=WINDOW, min_looks=10,
                      ministack=MINISTACK)
    paths = [save_stm(ds, tmp_path / f"{name}.zarr") for name in ("lazy", "eager")]
    new = stack.isel(time=slice(FIRST, FIRST + 5))
    with pytest.raises(STMValidationError, match=r"expected \['h2ph'\] as the store has"):
        update_ds_selection(paths[0], new.drop_vars("h2ph"))  # refused before any work
    assert open_stm(paths[0]).sizes["time"] == FIRST
    lazy = update_ds_selection(paths[0], new.chunk({"azimuth": 7, "range": 11, "time": 2}))
    eager = update_ds_selection(paths[1], new)
    for name in ("phase", "h2ph", "ds_compressed", "linked_phase_std", "ds_update_coherence"):
        np.testing.assert_array_equal(lazy[name].values, eager[name].values)
    at = (eager["azimuth"].values, eager["range"].values)
    np.testing.assert_array_equal(eager["h2ph"].values[:, FIRST:],
                                  new["h2ph"].transpose("azimuth", "range", "time").values[at])


@pytest.mark.slow  # 8 examples, 9 s
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.integers(1, 4), added=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       ministack=st.sampled_from([3, 4]), cap=st.sampled_from([1, 2, None]))
def test_updates_of_whole_mini_stacks_are_the_whole_stacks_estimator(
        stack, tmp_path_factory, first, added, ministack, cap):
    """Any first run of whole mini-stacks, then any updates of whole mini-stacks, any cap:
    the new epochs' phases are the sequential estimator's on the whole stack with the first
    run's SHP (one datum, the first epoch), to float32 round-off."""
    n_first, n_all = first * ministack, (first + sum(added)) * ministack
    small = stack.isel(azimuth=slice(0, 20), range=slice(0, 24), time=slice(0, n_all))
    ds = ds_selection(small.isel(time=slice(0, n_first)), window=(5, 5), min_looks=8,
                      ministack=ministack, max_compressed=cap)
    path = save_stm(ds, tmp_path_factory.mktemp("property") / "ds.zarr")
    start = n_first
    for count in added:
        update_ds_selection(path, small.isel(time=slice(start, start + count * ministack)))
        start += count * ministack
    after = open_stm(path).compute()
    assert after.sizes["space"] > 20 and after.sizes["time"] == n_all
    shp = select_shp(small.isel(time=slice(0, n_first)), window=(5, 5), min_looks=8).compute()
    whole = phase_linking(small, shp, ministack=ministack, max_compressed=cap).compute()
    at = (after["azimuth"].values, after["range"].values)
    difference = wrap_phase(after["phase"].values - whole["phase"].values[at])
    assert np.abs(difference).max() < 1e-4
    assert after.sizes["compressed_slc"] == whole.sizes["compressed_slc"]
