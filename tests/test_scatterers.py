"""Distributed scatterers beside the PS: the simulator's DS patches,
``ds_selection`` and ``merge_scatterers``, the selection step's ``ds:`` section, the exports, and
the chain on a mixed PS + DS scene against floors computed from its truth."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depsi.conventions import phase_per_metre
from depsi.io.export import point_table
from depsi.processing.scatterers import (
    DEFAULT_MAX_COMPRESSED,
    DEFAULT_MIN_TEMPORAL_COHERENCE,
    DEFAULT_PRESCREEN_SIGMAS,
    SCATTERER_DTYPE,
    DSConfig,
    Scatterer,
    ds_selection,
    merge_scatterers,
)
from depsi.processing.selection import ps_selection
from depsi.simulate import simulate_stack
from scenes import mixed_scene, scatterer_floors

#: A small scene for the selection's tests: one 20 x 20 patch, 7 x 7 windows.
SMALL = {"shape": (48, 48), "n_epochs": 20, "seed": 2, "ds_regions": 1, "ds_region_size": 20}
SMALL_WINDOW = (7, 7)

#: The house's goal on velocity (tests/test_scene_families.py): at most 1.1 x the no-correction
#: floor (a velocity's atmospheric part looks like deformation in time: only the network's
#: spatial view removes any of it).
VELOCITY_FACTOR = 1.1


@pytest.fixture(scope="module")
def small():
    stack, truth = simulate_stack(**SMALL)
    return stack.compute(), truth.compute()


@pytest.fixture(scope="module")
def small_ds(small):
    return ds_selection(small[0], window=SMALL_WINDOW)


# --- the simulator's DS patches ---------------------------------------------------------------

def test_ds_patches_leave_the_rest_of_the_stack_as_it_was(small):
    stack, truth = small
    plain, _ = simulate_stack(**{**SMALL, "ds_regions": 0})
    outside = truth["ds_region"].values < 0
    ps = truth["ps_mask"].values
    np.testing.assert_array_equal(stack["complex"].values[outside | ps],
                                  plain["complex"].values[outside | ps])
    chunked, _ = simulate_stack(**SMALL, chunks=(20, 30))
    np.testing.assert_array_equal(chunked["complex"].values, stack["complex"].values)


def test_ds_patch_phase_follows_the_scene_physics(small):
    """The multilooked interferograms of a patch are the model's phase: deformation, the
    patch's height error and the atmosphere, within the noise of L looks at the long-term
    coherence, std sqrt((1 - g^2) / (2 L g^2)) (the Cramér-Rao bound of one pair)."""
    stack, truth = small
    mask = truth["ds_mask"].values
    slc = stack["complex"].values[mask]
    mother = int(np.flatnonzero(stack["time"].values
                                == np.datetime64(stack.attrs["mother_time"]))[0])
    m2ph = phase_per_metre(stack.attrs["wavelength"])
    # the interferograms slc_mother * conj(slc); their h2ph is minus the stack's (zero at the
    # mother), docs/concepts.md
    model = (m2ph * (truth["displacement"].values[mask]
                     - stack["h2ph"].values[mask] * truth["height_error"].values[mask][:, None])
             + truth["aps"].values[mask])
    model = model - model[:, mother:mother + 1]
    ifg = slc[:, mother:mother + 1] * np.conj(slc) * np.exp(-1j * model)
    error = np.angle(ifg.sum(axis=0))
    looks, gamma = mask.sum(), truth.attrs["ds_gamma_inf"]
    bound = np.sqrt((1 - gamma**2) / (2 * looks * gamma**2))
    assert np.abs(np.delete(error, mother)).max() < 5 * bound
    assert np.unique(truth["height_error"].values[mask]).size == 1  # one DEM error a patch


def test_ds_patches_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="ds_regions: expected 9 patches"):
        simulate_stack(shape=(40, 40), n_epochs=4, ds_regions=9, ds_region_size=20)


# --- ds_selection and merge_scatterers --------------------------------------------------------

def test_ds_selection_finds_the_patch_and_few_others(small, small_ds):
    """Every true DS pixel with min_looks patch pixels in its window is found but for the
    test's misses; a pixel found outside the patch borrows the patch's SHP, so it lies within
    half a window of it."""
    _, truth = small
    ds = small_ds
    true = truth["ds_mask"].values
    found = np.zeros_like(true)
    found[ds["azimuth"].values, ds["range"].values] = True
    assert (found & true).sum() >= 0.95 * true.sum()
    false = found & ~true
    assert false.sum() <= 0.05 * found.sum()
    region = truth["ds_region"].values >= 0
    half = SMALL_WINDOW[0] // 2
    near = np.zeros_like(region)
    for da_ in range(-half, half + 1):  # the patch grown by half a window (49 shifts)
        for dr in range(-half, half + 1):
            near |= np.roll(np.roll(region, da_, axis=0), dr, axis=1)
    assert near[false].all()
    assert (ds["scatterer"].values == Scatterer.DS).all()
    assert ds["scatterer"].dtype == SCATTERER_DTYPE
    assert ds["scatterer"].attrs["flag_meanings"] == "ps ds"
    assert np.isnan(ds["amplitude_dispersion"].values).all()  # never first order
    assert (ds["shp_count"].values >= DSConfig().min_looks).all()
    assert (ds["linked_coherence"].values >= DEFAULT_MIN_TEMPORAL_COHERENCE).all()
    assert (ds["phase"].values[:, 0] == 0).all()  # linked to the first epoch


def test_a_ds_point_carries_its_shp_power(small, small_ds):
    """Its amplitude is the root of its SHP's mean intensity: within the patch's power to the
    spread of a mean of (looks x epochs) exponential intensities, coherent in time."""
    stack, truth = small
    ds = small_ds.isel(space=truth["ds_mask"].values[small_ds["azimuth"].values,
                                                     small_ds["range"].values])
    patch = np.abs(stack["complex"].values[truth["ds_mask"].values]) ** 2
    power = ds["amplitude"].values[:, 0].astype(np.float64) ** 2
    assert np.allclose(ds["amplitude"].values, ds["amplitude"].values[:, :1])
    # a mean over >= 20 looks of 20 epochs (worth ~6 independent): relative std <= 1/sqrt(120)
    assert np.abs(np.median(power) / patch.mean() - 1) < 5 / np.sqrt(120)


def test_merge_keeps_a_pixel_that_is_both_a_ps(small, small_ds):
    stack, _ = small
    ps = ps_selection(stack)
    # make one DS pixel a PS as well: its DS point must go
    both = ps.isel(space=[0]).assign_coords(azimuth=("space", small_ds["azimuth"].values[:1]),
                                            range=("space", small_ds["range"].values[:1]))
    ps = xr.concat([ps, both], dim="space")
    merged = merge_scatterers(ps, small_ds)
    kind = merged["scatterer"].values
    pixels = {(a, r) for a, r in zip(ps["azimuth"].values.tolist(), ps["range"].values.tolist())}
    both = sum((a, r) in pixels for a, r in zip(small_ds["azimuth"].values.tolist(),
                                                 small_ds["range"].values.tolist()))
    assert both >= 1  # the one made above, and any PS the SHP test found homogeneous
    assert (kind == Scatterer.PS).sum() == ps.sizes["space"]
    assert (kind == Scatterer.DS).sum() == small_ds.sizes["space"] - both
    assert merged.attrs["n_ds"] == small_ds.sizes["space"] - both
    assert merged.attrs["n_ds_dropped"] == both
    is_ps = kind == Scatterer.PS
    assert (merged["shp_count"].values[is_ps] == 0).all()
    assert np.isnan(merged["linked_coherence"].values[is_ps]).all()
    assert (~merged["selected"].values[~is_ps]).all() and merged["selected"].values[is_ps].all()
    assert (merged["amp_count"].values[~is_ps] == 0).all()
    assert merged["complex"].dtype == np.complex64
    from depsi.stm.order import morton_order

    order = morton_order(merged["azimuth"].values, merged["range"].values)
    np.testing.assert_array_equal(order, np.arange(merged.sizes["space"]))


def test_merge_refuses_points_of_another_stack_or_twice(small, small_ds):
    stack, _ = small
    ps = ps_selection(stack)
    with pytest.raises(ValueError, match="expected the epochs of ps"):
        merge_scatterers(ps, small_ds.isel(time=slice(1, None)))
    with pytest.raises(ValueError, match="expected ds_selection's point STM"):
        merge_scatterers(ps, ps)
    with pytest.raises(ValueError, match="merged already"):
        merge_scatterers(merge_scatterers(ps, small_ds), small_ds)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"window": (6, 7)}, "odd"),
    ({"alpha": 1.5}, "alpha"),
    ({"min_looks": 50}, "min_looks: expected 2 .. 49"),
    ({"method": "mle"}, "method"),
    ({"min_temporal_coherence": 1.0}, "min_temporal_coherence"),
    ({"prescreen_sigmas": -1.0}, "prescreen_sigmas: expected >= 0"),
    ({"ministack": 1}, "ministack: expected at least 2"),
    ({"max_compressed": 0}, "max_compressed: expected at least 1"),
    ({"max_compressed": "most"}, "max_compressed: expected at least 1"),
])
def test_ds_selection_refuses_bad_arguments_before_work(small, kwargs, match):
    stack, _ = small
    with pytest.raises(ValueError, match=match):
        ds_selection(stack, **{"window": SMALL_WINDOW, **kwargs})


def test_prescreen_keeps_the_ds_the_full_linking_accepts(small, small_ds):
    """The pre-screen only leaves out pixels: the DS it keeps are the full linking's, every DS
    of the patch the full linking accepts is among them (same phases), and most of the
    decorrelated background is never linked."""
    stack, truth = small
    full = ds_selection(stack, window=SMALL_WINDOW, prescreen_sigmas=None)
    screened = small_ds  # the default pre-screen
    keys = [set(zip(d["azimuth"].values.tolist(), d["range"].values.tolist()))
            for d in (full, screened)]
    assert keys[1] <= keys[0]
    in_patch = {key for key in keys[0] if truth["ds_mask"].values[key]}
    assert in_patch <= keys[1]
    assert len(keys[0] - keys[1]) <= 0.01 * len(keys[0])
    rows = [{key: i for i, key in enumerate(zip(d["azimuth"].values.tolist(),
                                                d["range"].values.tolist()))}
            for d in (full, screened)]
    common = sorted(keys[1])
    np.testing.assert_array_equal(screened["phase"].values[[rows[1][k] for k in common]],
                                  full["phase"].values[[rows[0][k] for k in common]])
    background = (~truth["ds_mask"].values).sum()
    assert full.attrs["n_ds_linked"] == full.attrs["n_ds_candidates"]
    assert screened.attrs["n_ds_linked"] < truth["ds_mask"].values.sum() + 0.05 * background


def test_prescreen_sigmas_is_validated_by_the_config():
    from pydantic import ValidationError

    assert DSConfig().prescreen_sigmas == DEFAULT_PRESCREEN_SIGMAS
    assert DSConfig(prescreen_sigmas=None).prescreen_sigmas is None
    with pytest.raises(ValidationError, match="prescreen_sigmas"):
        DSConfig(prescreen_sigmas=-0.5)


def test_ministack_is_validated_by_the_config():
    from pydantic import ValidationError

    assert DSConfig().ministack is None  # all epochs at once unless asked
    assert DSConfig(ministack=15).ministack == 15
    with pytest.raises(ValidationError, match="ministack"):
        DSConfig(ministack=1)
    assert DSConfig().max_compressed == DEFAULT_MAX_COMPRESSED == "auto"
    assert DSConfig(max_compressed=None).max_compressed is None
    assert DSConfig(max_compressed=4).max_compressed == 4
    for bad in (0, "all"):
        with pytest.raises(ValidationError, match="max_compressed"):
            DSConfig(max_compressed=bad)


def test_ds_selection_by_ministacks_finds_the_same_ds(small, small_ds):
    """Mini-stacks of 8 of the 20 epochs: the DS found are the full linking's but for pixels at
    the acceptance's edge (within 2 %), at the same datum."""
    stack, truth = small
    sequential = ds_selection(stack, window=SMALL_WINDOW, ministack=8)
    keys = [set(zip(d["azimuth"].values.tolist(), d["range"].values.tolist()))
            for d in (small_ds, sequential)]
    assert len(keys[0] ^ keys[1]) <= 0.02 * len(keys[0])
    assert sequential.attrs["ds_ministack"] == 8
    assert (sequential["phase"].values[:, 0] == 0).all()


def test_a_merged_store_is_not_updated_by_epochs(small, small_ds, tmp_path):
    from depsi.io.store import save_stm
    from depsi.processing.selection import update_selection

    stack, _ = small
    path = save_stm(merge_scatterers(ps_selection(stack.isel(time=slice(0, 19))),
                                     ds_selection(stack.isel(time=slice(0, 19)),
                                                  window=SMALL_WINDOW)), tmp_path / "ps")
    with pytest.raises(ValueError, match="distributed scatterers"):
        update_selection(path, stack.isel(time=[19]))


# --- the pipeline's selection step and the exports --------------------------------------------

def test_selection_step_adds_ds_only_when_enabled(small):
    from depsi.pipeline import parse_config
    from depsi.pipeline.steps import counts, run_step

    stack, _ = small
    plain = parse_config({})
    points = run_step("selection", plain, stack=stack)
    assert "scatterer" not in points and "n_ds" not in counts("selection", points)
    xr.testing.assert_identical(points, ps_selection(stack))  # off: the PS alone, as before
    enabled = parse_config({"selection": {"ds": {"enabled": True,
                                                 "window": list(SMALL_WINDOW)}}})
    mixed = run_step("selection", enabled, stack=stack)
    assert counts("selection", mixed)["ds"] == (mixed["scatterer"].values == 1).sum() > 200


def test_exports_name_each_points_kind_and_its_looks(tmp_path):
    from depsi.io.export import to_csv
    from depsi.processing.scatterers import SCATTERER_ATTRS

    kinds = np.array([0, 1], SCATTERER_DTYPE)
    result = xr.Dataset(
        {"velocity": ("space", [0.001, 0.002]), "height_error": ("space", [1.0, 2.0]),
         "temporal_coherence": ("space", [0.9, 0.8]),
         "displacement": (("space", "time"), [[0.0, 0.001], [0.0, 0.002]]),
         "scatterer": ("space", kinds, SCATTERER_ATTRS), "shp_count": ("space", [0, 57]),
         "linked_coherence": ("space", [np.nan, 0.93])},
        coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]"),
                "azimuth": ("space", [3, 4]), "range": ("space", [5, 6])})
    table = point_table(result)
    assert table["scatterer"].tolist() == ["ps", "ds"]
    assert table["shp_count"].tolist() == [0, 57]
    text = to_csv(result, tmp_path / "points.csv").read_text()
    assert ",scatterer,shp_count,linked_coherence," in text.splitlines()[0]
    assert ",ds,57," in text.splitlines()[2]


# --- the chain on the mixed scene -------------------------------------------------------------

@pytest.mark.slow
def test_mixed_scene_ps_and_ds_velocities_reach_their_floors():
    """PS and DS through one chain (DS densified): both kinds' velocity RMSE (about one common
    median, the datum) within the house's 1.1 x their no-correction floors and not below their
    noise floors; the DS found are the scene's (>= 95 % of the true DS pixels, <= 5 % others),
    and the densification keeps >= 95 % of them."""
    from depsi.pipeline.chain import run_ps_chain

    stack, truth = mixed_scene()
    ps, ds = ps_selection(stack), ds_selection(stack)
    result = run_ps_chain(merge_scatterers(ps, ds), network={"first_order": 150}).compute()
    kind = result["scatterer"].values
    azimuth, range_ = result["azimuth"].values, result["range"].values
    error = result["velocity"].values - truth["velocity"].values[azimuth, range_]
    error -= np.median(error)
    floors = scatterer_floors(stack, truth, azimuth, range_, kind)
    for name, value in (("ps", Scatterer.PS), ("ds", Scatterer.DS)):
        rmse = float(np.sqrt(np.mean(error[kind == value] ** 2)))
        floor = floors[name]
        assert floor["noise"] <= rmse <= VELOCITY_FACTOR * floor["nocorr"], (name, rmse, floor)
    true = truth["ds_mask"].values
    found = true[ds["azimuth"].values, ds["range"].values]
    assert found.sum() >= 0.95 * true.sum() and (~found).sum() <= 0.05 * found.size
    assert (kind == Scatterer.DS).sum() >= 0.95 * ds.sizes["space"]
    assert set(np.unique(result["order"].values[kind == Scatterer.DS])) == {2}
    assert (result["shp_count"].values[kind == Scatterer.DS] >= DSConfig().min_looks).all()
    # the chain's own quality of a DS: its phase fits the model as well as a PS's does
    assert np.median(result["temporal_coherence"].values[kind == Scatterer.DS]) > 0.9



@pytest.mark.slow
def test_depsi_run_with_ds_exports_each_points_kind(tmp_path):
    """`depsi run` with `selection.ds` on a simulated scene with DS patches: the selection's
    counts say how many DS, and the CSV names each point's kind with its looks."""
    import json

    import pandas as pd

    from depsi.pipeline import parse_config, run_pipeline

    data = {"input": {"simulate": {"shape": [64, 64], "n_epochs": 16, "seed": 2,
                                   "ps_fraction": 0.05, "ds_regions": 2}},
            "selection": {"ds": {"enabled": True, "window": [7, 7]}},
            "network": {"first_order": 100, "k": 3},
            "output": {"workspace": str(tmp_path / "ws"), "exports": ["csv"]},
            "compute": {"scheduler": "threads", "threads": 2}}
    run_pipeline(parse_config(json.loads(json.dumps(data))), progress=False)
    counted = json.loads((tmp_path / "ws" / "selection.done.json").read_text())["counts"]
    table = pd.concat([pd.read_csv(path) for path in (tmp_path / "ws").rglob("*.csv")])
    kinds = table["scatterer"].value_counts()
    assert set(kinds.index) == {"ps", "ds"} and kinds["ds"] > kinds["ps"]
    assert (table.loc[table["scatterer"] == "ds", "shp_count"] >= 20).all()
    assert (table.loc[table["scatterer"] == "ps", "shp_count"] == 0).all()
    assert counted["ds"] >= kinds["ds"]  # densification may reject a few
