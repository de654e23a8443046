"""The chain as steps: every config field reaches a step and changes what it
computes, `depsi run` equals `run_ps_chain` for the same settings, and the config's defaults
are the library's."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import xarray as xr

from depsi.io import open_stm
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline import parse_config, run_pipeline
from depsi.pipeline.chain import run_ps_chain
from depsi.pipeline.chain_config import ChainConfig, chain_config
from depsi.pipeline.config import PipelineConfig, example_config_yaml
from depsi.pipeline.steps import EDGE, run_step
from depsi.pipeline.steps import atmosphere as atmosphere_module
from depsi.pipeline.steps import integration as integration_module
from depsi.pipeline.steps import model as model_module
from depsi.pipeline.steps.arcs import estimated_arcs as arcs_step
from depsi.pipeline.steps.selection import prepare_points
from depsi.pipeline.steps.shared import network_points
from depsi.processing.selection import SelectionConfig, ps_selection
from depsi.simulate import simulate_stack

#: For every field of every chain section, a value other than its default that must change
#: the products of the steps. A new field without an entry here fails
#: test_every_chain_field_has_a_test.
ALTERNATES = {
    "network.first_order": 100,
    "network.max_dispersion": 0.12,
    "network.cell_size": 60.0,
    "network.method": "delaunay",
    "network.k": 3,
    "network.second_pass_k": 2,
    "network.n_sectors": 4,
    "network.max_length": 150.0,
    "network.ds_first_order": True,
    "arcs.height_range": (-30.0, 30.0),
    "arcs.velocity_range": (-0.03, 0.03),
    "arcs.height_step": 2.0,
    "arcs.velocity_step": 0.002,
    "integration.min_coherence": 0.8,
    "integration.alpha": 0.2,
    "integration.max_iterations": 0,
    "integration.reference": None,  # set to a first-order point by the fixture
    "integration.reference_lonlat": None,  # set to a first-order point's position likewise
    "integration.reference_radius": 0.0,
    "integration.reference_noise": False,
    "atmosphere.method": "gaussian",
    "atmosphere.temporal_window": 0.1,
    "atmosphere.second_pass": "refit",
    "atmosphere.correlated_height": False,
    "atmosphere.stratified": "off",  # the points carry terrain heights (fixture ``points``)
    "densification.k": 5,
    "densification.max_distance": 60.0,
    "densification.min_coherence": 0.9,
    "model.terms": ["seasonal"],
    "model.arcs": ["seasonal"],
    "model.densification": ["seasonal"],
    "model.temperature": "cold.csv",  # a file of the fixture's folder
    "model.step_dates": ["2020-05-01"],
    "model.breakpoint_dates": ["2020-05-01"],
    "model.seasonal_range": (-0.01, 0.01),
    "model.thermal_range": (-0.0005, 0.0005),
    "model.step_range": (-0.01, 0.01),
    "model.breakpoint_range": (-0.01, 0.01),
    "model.choice": "full",
    "model.alpha": 0.2,
}

#: The model section's fields act only with terms: each is changed on top of this section (its
#: files in the fixture's folder), and its products are compared with those of the section.
MODEL_CONTEXTS = {
    "model.arcs": {"terms": ["seasonal"], "arcs": [], "densification": []},
    "model.densification": {"terms": ["seasonal"], "arcs": [], "densification": []},
    "model.temperature": {"terms": ["thermal"], "temperature": "warm.csv", "arcs": [],
                          "densification": []},
    "model.step_dates": {"terms": ["step"], "step_dates": ["2020-03-01"], "arcs": [],
                         "densification": []},
    "model.breakpoint_dates": {"terms": ["breakpoint"], "breakpoint_dates": ["2020-03-01"],
                               "arcs": [], "densification": []},
    "model.seasonal_range": {"terms": ["seasonal"], "densification": []},
    "model.thermal_range": {"terms": ["thermal"], "temperature": "warm.csv",
                            "densification": []},
    "model.step_range": {"terms": ["step"], "step_dates": ["2020-03-01"], "densification": []},
    "model.breakpoint_range": {"terms": ["breakpoint"], "breakpoint_dates": ["2020-03-01"],
                               "densification": []},
    "model.choice": {"terms": ["seasonal"], "arcs": [], "densification": []},
    "model.alpha": {"terms": ["seasonal"], "arcs": [], "densification": []},
}


#: The chain's settings of these tests' products (the first-order count of a small scene).
BASE = {"network": {"first_order": 150}}


def _fields(model: type) -> list[str]:
    return [f"{section}.{name}" for section, info in model.model_fields.items()
            for name in info.annotation.model_fields]


def network_step(points, config):
    return run_step("network", config, selection=points)


def integration_step(network, arcs, config):
    return run_step("integration", config, network=network, arcs=arcs)


def atmosphere_step(network, first, config):
    return run_step("atmosphere", config, network=network, integration=first)


def densification_step(points, first, config):
    return run_step("densification", config, selection=points, atmosphere=first)


def model_step(points, first, dense, config):
    return run_step("model", config, selection=points, atmosphere=first, densification=dense)


@pytest.fixture(scope="module")
def points():
    stack, _ = simulate_stack(shape=(100, 100), n_epochs=20, seed=11, ps_fraction=0.05)
    # a DEM in radar geometry (ridges across range): the screen's stratified part is estimated
    azimuth, range_ = np.meshgrid(stack["azimuth"].values, stack["range"].values, indexing="ij")
    stack = stack.assign_coords(height=(("azimuth", "range"),
                                        100.0 * np.sin(range_ / 6.0) + 2.0 * azimuth))
    return prepare_points(ps_selection(stack).compute())


def _products(points: xr.Dataset, config: ChainConfig) -> dict[str, xr.Dataset]:
    network = network_step(points, config)
    arcs = arcs_step(network, config)
    first = integration_step(network, arcs, config)
    final = atmosphere_step(network, first, config)
    dense = densification_step(points, final, config)
    result = model_step(points, final, dense, config)
    return {"network": network, "arcs": arcs, "integration": first, "atmosphere": final,
            "densification": dense, "model": result}


@pytest.fixture(scope="module")
def base(points):
    return _products(points, chain_config(BASE))


@pytest.fixture(scope="module")
def temperatures(points, tmp_path_factory):
    """The folder of two temperature series of the points' epochs (the model section's files)."""
    folder = tmp_path_factory.mktemp("temperature")
    days = np.arange(points.sizes["time"])
    for name, swing in (("warm.csv", 10.0), ("cold.csv", 4.0)):
        values = 12 + swing * np.cos(2 * np.pi * days / 9) + 3 * np.sin(days)
        (folder / name).write_text("date,temperature\n" + "".join(
            f"{str(t)[:10]},{v:.2f}\n" for t, v in zip(points["time"].values, values)))
    return folder


def _in_folder(section: dict, folder) -> dict:
    return {k: str(folder / v) if k == "temperature" else v for k, v in section.items()}


def test_every_chain_field_has_a_test():
    assert sorted(_fields(ChainConfig)) == sorted(ALTERNATES)


def test_run_ps_chain_is_the_composition_of_the_steps(points, base):
    result = run_ps_chain(points, BASE)
    assert result.identical(base["model"])


@pytest.mark.parametrize("flat_h2ph", [False, True])
def test_observations_in_batches_are_those_of_the_whole_arc_stm(points, base, monkeypatch,
                                                                flat_h2ph):
    """The arcs step in memory (run_ps_chain's arcs, batch by batch, never the whole arc STM) gives
    bit for bit the observations of the arc STM estimated whole: several batches of several
    periodogram chunks, the last batch and chunk short, blocks of the observations across
    them; also where h2ph is flat (velocity only, decided once for every batch)."""
    from depsi.processing import arcs as arcs_science
    from depsi.processing import integration

    network = base["network"]
    config = chain_config(BASE)
    if flat_h2ph:
        network = network.assign(h2ph=network["h2ph"].isel(time=0))
    n_arcs = network.sizes[EDGE]
    monkeypatch.setattr(arcs_science, "ARC_CHUNK", 97)
    whole = integration.arc_observations(network_points(network), arcs_step(network, config))
    monkeypatch.setattr(integration, "ARC_BATCH", 3 * 97)
    monkeypatch.setattr(integration, "ARC_BLOCK", 13)
    batched = run_step("arcs", config, network=network)
    assert n_arcs > 3 * 3 * 97 and n_arcs % (3 * 97) % 97
    assert whole.rhs.shape == (n_arcs, 2 + network.sizes["time"])
    lazy = run_step("arcs", config, network=network.chunk({"space": 50}))  # a store's
    for name, values in whole._asdict().items():
        np.testing.assert_array_equal(getattr(batched, name), values, err_msg=name)
        np.testing.assert_array_equal(getattr(lazy, name), values, err_msg=name)
    assert (whole.rhs[:, 1] == 0).all() == flat_h2ph  # heights estimated only where resolvable


@pytest.mark.parametrize("field", sorted(ALTERNATES))
@pytest.mark.slow
def test_every_chain_field_changes_the_products(points, base, temperatures, field, request):
    section, name = field.split(".")
    value = ALTERNATES[field]
    if field == "network.ds_first_order":  # only where DS are among the points
        ds_points = prepare_points(request.getfixturevalue("ds_base").compute())
        before = network_step(ds_points, chain_config(BASE))
        after = network_step(ds_points, chain_config(BASE, network={name: value}))
        assert not after.identical(before), f"{field}={value!r} changed no product"
        return
    if field in MODEL_CONTEXTS:
        context = _in_folder(MODEL_CONTEXTS[field], temperatures)
        changed = _in_folder({**context, name: value}, temperatures)
        assert changed != context
        before = _products(points, chain_config(BASE, model=context))
        after = _products(points, chain_config(BASE, model=changed))
        steps = [step for step, ds in after.items() if not ds.identical(before[step])]
        assert steps, f"{field}={value!r} changed no product"
        return
    if field == "integration.reference":
        value = int(base["network"]["point_index"].values[7])
    if field == "integration.reference_lonlat":
        network = base["network"]
        value = (float(network["lon"].values[7]), float(network["lat"].values[7]))
    assert value != getattr(getattr(ChainConfig(), section), name)
    config = chain_config(BASE, **{section: {name: value}})
    products = _products(points, config)
    changed = [step for step, ds in products.items() if not ds.identical(base[step])]
    assert changed, f"{field}={value!r} changed no product"


def test_the_example_config_shows_the_library_defaults():
    """The section defaults are the functions' (tests/test_defaults.py, for every field); the
    commented example file shows them."""
    assert PipelineConfig().chain() == ChainConfig() == chain_config()
    text = example_config_yaml()
    assert "first_order: 2000" in text and "method: redundant" in text
    assert "height_range: [-50.0, 50.0]" in text and "k: 3" in text


def test_a_count_is_never_read_as_a_threshold():
    assert parse_config({"network": {"first_order": 2000.0}}).network.first_order == 2000
    with pytest.raises(ValueError, match="first_order"):
        parse_config({"network": {"first_order": 0.25}})
    with pytest.raises(ValueError, match="first_order"):
        run_ps_chain(xr.Dataset(), network={"first_order": 0.25})


def test_unknown_chain_option_is_refused_naming_it():
    with pytest.raises(TypeError, match="'network_k'"):
        chain_config(network_k=5)
    with pytest.raises(ValueError, match="unknown key 'network.k_nearest'"):
        chain_config(network={"k_nearest": 5})


@pytest.mark.slow
def test_depsi_run_equals_run_ps_chain(tmp_path):
    data = {"input": {"simulate": {"shape": [96, 96], "n_epochs": 16, "seed": 2,
                                   "ps_fraction": 0.05}},
            "network": {"first_order": 200, "k": 3},
            "arcs": {"height_range": [-40.0, 40.0]},
            "integration": {"reference_radius": 500.0},
            "densification": {"k": 4, "min_coherence": 0.75},
            "output": {"workspace": str(tmp_path / "ws"), "exports": []},
            "compute": {"scheduler": "threads", "threads": 2}}
    config = parse_config(json.loads(json.dumps(data)))
    run_pipeline(config, progress=False)
    got = open_stm(tmp_path / "ws" / "stm.zarr").compute()
    expected = run_ps_chain(open_stm(tmp_path / "ws" / "ps.zarr"), config.chain())
    # the product is stored in Morton order like every point STM: compare by point_index
    got = got.isel(space=np.argsort(got["point_index"].values))
    expected = expected.isel(space=np.argsort(expected["point_index"].values))
    assert got.sizes == expected.sizes and expected.sizes["space"] > 100
    assert (expected["order"].values == 2).sum() > 0
    for name in expected.variables:
        np.testing.assert_array_equal(got[name].values, expected[name].values, err_msg=name)
    for key in ("reference", "n_first_order", "n_densified", "n_reference_area"):
        assert got.attrs[key] == expected.attrs[key], key


def test_a_step_sees_only_its_declared_sections():
    """The executors give each step a view of the config with only its Step's sections: a
    read of any other section fails naming the step, so no step depends on a section whose
    change would not redo it (the pipeline hashes exactly those)."""
    from depsi.pipeline.steps import BY_NAME, STEPS, config_for

    config = PipelineConfig()
    view = config_for("network", config)
    assert view.network == config.network
    assert view.integration.reference == config.integration.reference
    with pytest.raises(AttributeError,
                       match="step 'network' reads config section 'densification'"):
        _ = view.densification
    assert view.atmosphere.stratified == config.atmosphere.stratified  # checked before work
    with pytest.raises(AttributeError, match="atmosphere.temporal_window"):
        _ = view.atmosphere.temporal_window
    with pytest.raises(AttributeError, match="integration.min_coherence"):
        _ = view.integration.min_coherence
    for step in STEPS:  # every declared section exists in the config
        for dotted in step.sections + step.checks:
            value = config
            for part in dotted.split("."):
                value = getattr(value, part)
    assert BY_NAME["model"].sections[:3] == ("atmosphere", "model.choice", "model.alpha")
    assert "model.alpha" not in BY_NAME["arcs"].sections


def test_run_ps_chain_lets_each_product_go_after_its_last_reader(points, monkeypatch):
    """The in-memory executor drops each product after the last step that reads it (known
    from the table's inputs): when the model step runs, the network, arcs and integration
    products are gone, and the model step holds the only references to what it reads."""
    import gc
    import weakref

    from depsi.pipeline import steps as steps_module
    from depsi.pipeline.steps import network as network_module

    refs = {}
    seen = {}

    def recording(function, step):
        def run(inputs, config, context):
            out = function(inputs, config, context)
            refs[step] = weakref.ref(out)
            return out
        return run

    for module in (network_module, integration_module, atmosphere_module):
        step = module.__name__.rpartition(".")[2]
        monkeypatch.setattr(module, "run", recording(module.run, step))

    def model_then_check(inputs, config, context):
        for name in inputs.names:  # taken, and let go, as the model step does once merged
            inputs[name]
        gc.collect()
        seen.update({step: ref() is not None for step, ref in refs.items()})
        return xr.Dataset()

    monkeypatch.setattr(model_module, "run", model_then_check)
    assert steps_module.last_consumers(steps_module.CHAIN_STEPS)["integration"] == "atmosphere"
    run_ps_chain(points, BASE)
    assert seen == {"network": False, "integration": False, "atmosphere": False}


#: For every field of the selection's ``ds:`` part, a value other than its default that must
#: change the selection step's product (PS and DS) on a stack with a DS patch, DS enabled
#: (``enabled`` itself: against the PS alone, the default). A new field without an entry here
#: fails test_every_selection_ds_field_has_a_test.
DS_ALTERNATES = {
    "selection.ds.enabled": True,
    "selection.ds.window": (7, 7),
    "selection.ds.alpha": 0.2,
    "selection.ds.min_looks": 60,
    "selection.ds.method": "evd",
    "selection.ds.min_temporal_coherence": 0.9,
    "selection.ds.prescreen_sigmas": 30.0,
    "selection.ds.ministack": 5,
    "selection.ds.max_compressed": 1,
}

#: Fields that act only beside another setting: the settings both sides of the comparison share.
DS_CONTEXT = {"selection.ds.max_compressed": {"ministack": 5}}  # 20 epochs: 4 mini-stacks


@pytest.fixture(scope="module")
def ds_stack():
    stack, _ = simulate_stack(shape=(48, 48), n_epochs=20, seed=2, ds_regions=1,
                              ds_region_size=20)
    return stack.compute()


@pytest.fixture(scope="module")
def ds_base(ds_stack):
    return _selected(ds_stack, {"enabled": True})


def _selected(stack: xr.Dataset, ds: dict) -> xr.Dataset:
    return run_step("selection", parse_config({"selection": {"ds": ds}}), stack=stack)


def test_every_selection_ds_field_has_a_test():
    from depsi.processing.scatterers import DSConfig

    assert sorted(f"selection.ds.{name}" for name in DSConfig.model_fields) == sorted(
        DS_ALTERNATES)


@pytest.mark.parametrize("field", sorted(DS_ALTERNATES))
@pytest.mark.slow
def test_every_selection_ds_field_changes_the_selection(ds_stack, ds_base, field):
    from depsi.processing.scatterers import DSConfig

    name = field.rsplit(".", 1)[-1]
    value = DS_ALTERNATES[field]
    assert value != getattr(DSConfig(), name)
    assert (ds_base["scatterer"].values == 1).sum() > 100
    if name == "enabled":  # the default, DS off, against DS on
        base, changed = _selected(ds_stack, {}), ds_base
    elif field in DS_CONTEXT:
        context = {"enabled": True, **DS_CONTEXT[field]}
        base, changed = _selected(ds_stack, context), _selected(ds_stack, context | {name: value})
    else:
        base, changed = ds_base, _selected(ds_stack, {"enabled": True, name: value})
    assert not changed.identical(base), f"{field}={value!r} changed no product"


def test_every_other_config_field_is_read_by_the_code_that_runs_it():
    """The sections outside the chain (input, selection, output, compute) choose *how* a run
    goes (a scheduler, a folder, an engine whose result is identical); each of their fields
    must at least be read, as an attribute, by the code that runs the pipeline."""
    import ast
    from pathlib import Path

    import depsi
    from depsi.cluster import AdaptiveConfig, ComputeConfig, SlurmConfig
    from depsi.pipeline.config import InputConfig, OutputConfig, SimulateConfig

    root = Path(depsi.__file__).parent
    # io/formats.py: the readers of the input section's formats (READERS)
    readers = [*sorted((root / "pipeline").rglob("*.py")), root / "cluster.py", root / "cli.py",
               root / "io" / "formats.py"]
    read = {node.attr for path in readers for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute)}
    sections = (InputConfig, SimulateConfig, SelectionConfig, OutputConfig, ComputeConfig,
                SlurmConfig, AdaptiveConfig)
    unread = [f"{section.__name__}.{name}" for section in sections
              for name in section.model_fields if name not in read]
    assert not unread, f"config fields no code reads: {unread}"


def test_arcs_step_uncomputed_is_lazy_and_the_computed_arc_stm(base):
    """`depsi run` writes the arcs step's product chunk by chunk from compute=False: every
    (arcs x epochs) variable lazy (from a lazily read network), the values those of the
    computed step."""
    config = chain_config(BASE)
    lazy = arcs_step(base["network"].chunk({"space": 50}), config, compute=False)
    series = [name for name, var in lazy.data_vars.items() if var.dims == ("arc", "time")]
    assert {"phase", "h2ph", "ambiguity"} <= set(series)
    assert all(lazy[name].chunks is not None for name in series + ["velocity"])
    # as `depsi run` computes it (its scheduler runs BLAS on one thread, as the step does):
    # OpenBLAS's own threads split a GEMM, and its rounding, by the machine's cores and kernels
    with single_threaded_blas():
        computed = lazy.compute()
    xr.testing.assert_identical(computed, base["arcs"])


def test_steps_run_blas_on_one_thread(base, monkeypatch):
    """A step's work is parallel over chunks: inside it BLAS runs on one thread (what a task
    sees), and the count before the step comes back after it."""
    from threadpoolctl import threadpool_info, threadpool_limits

    with contextlib.suppress(ImportError):  # loaded before the count: the whole network's
        import cvxopt.cholmod  # noqa: F401 - factorisation would load its BLAS mid-step
    fixed: set[str] = set()  # single-threaded builds (CVXOPT's OpenBLAS): one thread always

    def blas_threads() -> set[int]:
        return {info["num_threads"] for info in threadpool_info()
                if info["user_api"] == "blas" and info["filepath"] not in fixed}

    seen = []
    real = integration_module.integrate_network

    def recording(*args, **kwargs):
        seen.append(blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(integration_module, "integrate_network", recording)
    with threadpool_limits(limits=3, user_api="blas"):
        fixed.update(info["filepath"] for info in threadpool_info()
                     if info["user_api"] == "blas" and info["num_threads"] == 1)
        integration_step(base["network"], base["arcs"], chain_config(BASE))
        assert blas_threads() == {3}
    assert seen == [{1}]


def test_atmosphere_and_model_steps_let_go_of_what_they_are_given(points, base, monkeypatch):
    """Given the only references (as run_ps_chain gives them), the atmosphere step lets the
    first pass go once its screen is estimated, and the model step the first pass and the
    densified points once merged: at 10^7 points they are gigabytes. A wrapper that kept its
    arguments (a decorator) would hold them to the end; nothing else tests this."""
    import gc
    import weakref

    config = chain_config(BASE)
    seen = {}

    def watched(ds):  # a fresh copy, and a weak reference to one of its arrays
        ds = ds.copy(deep=True)
        seen.setdefault("refs", []).append(weakref.ref(ds["unwrapped_phase"].data))
        return ds

    def alive():
        gc.collect()
        return [ref() is not None for ref in seen["refs"]]

    real_pass = atmosphere_module.second_network_pass

    def second_pass_then_check(*args, **kwargs):  # the second pass, after the screen
        seen.setdefault("atmosphere", alive())
        return real_pass(*args, **kwargs)

    monkeypatch.setattr(atmosphere_module, "second_network_pass", second_pass_then_check)
    given = [watched(base["integration"])]
    run_step("atmosphere", config, network=base["network"], integration=given.pop())
    assert seen["atmosphere"] == [False]

    monkeypatch.setattr(atmosphere_module, "second_network_pass", real_pass)
    seen.clear()
    real_fit = model_module.fit_with_atmosphere

    def fit_then_check(*args, **kwargs):  # after the merge
        seen["model"] = alive()
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(model_module, "fit_with_atmosphere", fit_then_check)
    given = [watched(base["atmosphere"]), watched(base["densification"])]
    run_step("model", config, selection=points, atmosphere=given.pop(0),
             densification=given.pop())
    assert seen["model"] == [False, False]


def test_refit_second_pass_keeps_the_first_pass_cycles_and_its_accuracy():
    """``atmosphere.second_pass: refit`` fits each first-order point to its first-pass
    unwrapped phase less the screen: the first pass's cycles are kept exactly (the unwrapped
    phase plus the screen is the first pass's, up to the reference's own row), and the
    velocities and heights are as close to the truth as the network's second pass gives them
    (a wrong sign of the screen or a lost reference row would fail both)."""
    stack, truth = simulate_stack(shape=(100, 100), n_epochs=20, seed=11, ps_fraction=0.05)
    points = prepare_points(ps_selection(stack).compute())
    errors = {}
    for mode in ("network", "refit"):
        config = chain_config(BASE, atmosphere={"second_pass": mode},
                              integration={"reference_noise": False, "reference_radius": 0.0})
        network = network_step(points, config)
        first = integration_step(network, arcs_step(network, config), config)
        first_unwrapped = first["unwrapped_phase"].values[first["in_network"].values]
        result = atmosphere_step(network, first, config)
        assert result.attrs["second_pass"] == mode
        if mode == "refit":
            assert result["in_network"].values.all()
            moved = result["unwrapped_phase"].values + result["aps"].values - first_unwrapped
            ref = result.attrs["reference"]
            np.testing.assert_allclose(moved - moved[ref], 0.0, atol=1e-5)
        result = result.isel(space=np.flatnonzero(result["in_network"].values))
        at = (result["azimuth"].values, result["range"].values)
        errors[mode] = [
            np.sqrt(np.mean((e - np.median(e)) ** 2)) for e in
            (result[name].values - truth[name].values[at] for name in ("velocity",
                                                                       "height_error"))]
    for refit, network in zip(errors["refit"], errors["network"]):
        assert refit <= 1.05 * network, errors


def test_steps_tell_each_other_through_one_typed_record(base):
    """Besides their variables, chain products carry one record (ChainRecord, one attribute
    that a store keeps): the network's size and method, then the datum. A product without it
    is refused by the step reading it, naming the step."""
    from depsi.pipeline.steps.shared import RECORD_ATTR, ChainRecord

    network = ChainRecord.of(base["network"], "test")
    assert network.n_first_order == base["network"].sizes["space"]
    assert network.network_method == "redundant" and network.reference is None
    final = ChainRecord.of(base["atmosphere"], "test")
    assert final.reference == base["atmosphere"].attrs["reference"]
    assert final.n_reference_area == int(base["atmosphere"]["in_reference_area"].sum())
    assert RECORD_ATTR not in base["model"].attrs  # the result's attributes are its own
    bare = base["integration"].copy()
    bare.attrs = {k: v for k, v in bare.attrs.items() if k != RECORD_ATTR}
    with pytest.raises(ValueError, match="atmosphere: expected the product of the step"):
        atmosphere_step(base["network"], bare, chain_config(BASE))


def test_the_atmosphere_step_with_its_screen_in_a_temporary_file_is_the_same(base, monkeypatch):
    """At scale the second pass parks the screen (and the arcs' right-hand sides) in a
    temporary file while it integrates, and its points' and arcs' arrays in pageable ones:
    the product is the one kept in memory, to the bit."""
    from depsi.stm import runtime

    config = chain_config(BASE)
    moved = []
    original = runtime.SpilledArrays.__init__

    def counting(self, arrays, directory=None):
        moved.append(sorted(arrays))
        original(self, arrays, directory)

    monkeypatch.setattr(runtime, "SPILL_BYTES", 0)
    monkeypatch.setattr(runtime.SpilledArrays, "__init__", counting)
    # and every array pageable (the corrected points, the arcs' arrays) and paged out
    monkeypatch.setattr(runtime, "PAGEABLE_BYTES", 0)
    parked = atmosphere_step(base["network"], base["integration"], config)
    assert ["aps", "aps_observed"] in moved
    xr.testing.assert_identical(parked, base["atmosphere"])
