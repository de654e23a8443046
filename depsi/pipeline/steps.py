"""The one table of steps: what each step reads, which config sections it depends on, what it
writes. Both executors run it: :func:`~depsi.pipeline.chain.run_ps_chain` in memory (the chain's
steps) and :func:`~depsi.pipeline.runner.run_pipeline` with a checkpoint after each step; the
command line's choices, ``--from``/``--to``, the manifests' upstreams and the redo policy all
come from it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: Dimension of the network product's arcs (``edge_source``, ``edge_target`` into its space).
EDGE = "edge"


@dataclass(frozen=True)
class Step:
    """One step of the chain or the pipeline around it.

    Attributes
    ----------
    name
        The step's name (``--from``/``--to``, manifests, logs).
    does
        What it does, in a line (the tables of the docs and ``depsi run --help``).
    inputs
        The steps whose products it reads, in the order its ``run`` takes them.
    sections
        Dotted config sections it depends on: a change in one redoes it, and they are all of
        the configuration its ``run`` is given (:class:`ConfigView`).
    product
        Its product, relative to the workspace.
    function
        Where the step's function lives (``module:name`` under :mod:`depsi.pipeline`, imported
        when first run, so the table is cheap to import: the command line reads it):
        ``run(*inputs, config)`` with the products of ``inputs``; the chain's steps also take
        ``devices``.
    chain
        One of the chain's steps, which :func:`~depsi.pipeline.chain.run_ps_chain` runs in
        memory (the others need a workspace: the input, the selection, the exports).
    in_memory
        Where the step's function lives as :func:`~depsi.pipeline.chain.run_ps_chain` runs
        it, where that differs (the arcs as integration's observations, batch by batch,
        never the whole arc STM).
    computed
        Inputs read whole into memory (the rest are read lazily from their stores).
    checks
        Dotted sections read only to refuse a run before work starts (not hashed: a change
        there does not redo the step).
    devices
        Its ``run`` takes ``devices`` (the chunks it spreads over CPU and GPUs).
    """

    name: str
    does: str
    inputs: tuple[str, ...]
    sections: tuple[str, ...]
    product: str
    function: str
    chain: bool = True
    in_memory: str | None = None
    computed: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    devices: bool = True

    @property
    def run(self) -> Callable[..., Any]:
        """The step's function."""
        return _resolve(self.function)

    @property
    def run_in_memory(self) -> Callable[..., Any]:
        """The step's function as :func:`~depsi.pipeline.chain.run_ps_chain` runs it."""
        return _resolve(self.in_memory or self.function)


def _resolve(where: str) -> Callable[..., Any]:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(f"depsi.pipeline.{module}"), name)


#: The model section's fields that make its terms' regressors (every step that models a point's
#: motion declares them; the arcs and densification add the terms they search, the model step
#: the choice): a change of the choice's alpha redoes the model step alone.
MODEL_TERMS = ("model.terms", "model.temperature", "model.step_dates", "model.breakpoint_dates",
               "model.seasonal_range", "model.thermal_range", "model.step_range",
               "model.breakpoint_range")

#: The steps, in order. The chain's are those of :func:`~depsi.pipeline.chain.run_ps_chain`;
#: ``selection`` stands for the chain's input points.
STEPS = (
    Step("stack", "opens the input stack, or simulates one", (), ("input",), "stack.zarr",
         "stack:stack_step", chain=False,
         checks=("output.exports", "selection.method", "selection.ds", *MODEL_TERMS),
         devices=False),
    Step("selection", "PS candidates by amplitude dispersion (and DS)", ("stack",),
         ("selection", "input.dem"), "ps.zarr", "stack:selection_step", chain=False,
         devices=False),
    Step("network", "first-order points and their arcs", ("selection",),
         ("network", "integration.reference"), "network.zarr", "chain_steps:network_step",
         checks=(*MODEL_TERMS, "atmosphere.method", "atmosphere.stratified"), devices=False),
    Step("arcs", "periodogram of every arc", ("network",),
         ("arcs", "model.arcs", *MODEL_TERMS), "arcs.zarr", "chain_steps:lazy_arcs_step",
         in_memory="chain_steps:observations_step"),
    Step("integration", "network solution with arc testing", ("network", "arcs"),
         ("integration", "model.arcs", *MODEL_TERMS), "integration.zarr",
         "chain_steps:integration_step",
         devices=False),
    Step("atmosphere", "screen, second network pass, reference noise and area",
         ("network", "integration"),
         ("network", "arcs", "integration", "atmosphere", "model.arcs", *MODEL_TERMS),
         "atmosphere.zarr",
         "chain_steps:atmosphere_step", computed=("network", "integration")),
    Step("densification", "every other point against the network", ("selection", "atmosphere"),
         ("arcs", "densification", "model.densification", *MODEL_TERMS), "densification.zarr",
         "chain_steps:densification_step", computed=("atmosphere",)),
    Step("model", "velocity, height and model terms with the atmosphere",
         ("selection", "atmosphere", "densification"),
         ("atmosphere", "model.choice", "model.alpha", *MODEL_TERMS), "stm.zarr",
         "chain_steps:model_step", computed=("atmosphere",)),
    Step("export", "CSV, GeoPackage, GeoTIFF, plots", ("model",), ("output.exports",),
         "exports", "stack:export_step", chain=False, devices=False),
)

#: The steps by name.
BY_NAME = {step.name: step for step in STEPS}

#: The step names, in order.
STEP_NAMES = tuple(BY_NAME)

#: The chain's steps, in order.
CHAIN_STEPS = tuple(step.name for step in STEPS if step.chain)


def last_consumers(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """For each product read by the steps ``names``, the last of them that reads it: after
    that step, nothing needs it."""
    last = {}
    for name in names:
        for product in BY_NAME[name].inputs:
            last[product] = name
    return last


def format_steps() -> str:
    """The step table as aligned text (``depsi steps``): each step, what it reads, the config
    sections whose change redoes it, its product, and what it does."""
    head = ("step", "reads", "sections", "product", "does")
    rows = [(s.name, ", ".join(s.inputs) or "-", ", ".join(s.sections), s.product, s.does)
            for s in STEPS]
    widths = [max(len(row[i]) for row in rows + [head]) for i in range(len(head) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                     for row in [head, *rows])


# --------------------------------------------------------------------------- what a step sees
class ConfigView:
    """The configuration as one step sees it: only the sections it declares (and its checks).

    Reading any other section raises an :class:`AttributeError` naming the step and what it
    declares, so a step cannot depend on a section whose change would not redo it.
    """

    def __init__(self, config: Any, step: str, sections: tuple[str, ...]):
        self._config = config
        self._step = step
        self._allowed: dict[str, set[str] | None] = {}
        for dotted in sections:
            top, _, field = dotted.partition(".")
            if not field:
                self._allowed[top] = None  # the whole section
            elif self._allowed.get(top, set()) is not None:
                self._allowed.setdefault(top, set()).add(field)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._allowed:
            declared = ", ".join(sorted(self._allowed))
            raise AttributeError(f"step {self._step!r} reads config section {name!r}, which its "
                                 f"Step does not declare ({declared}): add it to its sections")
        section = getattr(self._config, name)
        fields = self._allowed[name]
        return section if fields is None else _FieldView(section, f"{self._step}", name, fields)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """The declared sections as plain data."""
        return {name: getattr(self, name).model_dump(**kwargs) for name in self._allowed}


class _FieldView:
    """One section with only some of its fields visible (a dotted ``section.field``)."""

    def __init__(self, section: Any, step: str, name: str, fields: set[str]):
        self._section, self._step, self._name, self._fields = section, step, name, fields

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_"):
            raise AttributeError(field)
        if field not in self._fields:
            raise AttributeError(f"step {self._step!r} reads {self._name}.{field}, which its "
                                 f"Step does not declare (of {self._name}: "
                                 f"{', '.join(sorted(self._fields))})")
        return getattr(self._section, field)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        data = self._section.model_dump(**kwargs)
        return {k: v for k, v in data.items() if k in self._fields}


def config_for(step: str, config: Any) -> ConfigView:
    """``config`` as ``step`` may read it (:class:`ConfigView`)."""
    spec = BY_NAME[step]
    return ConfigView(config, step, spec.sections + spec.checks)


def call_step(run: Callable[..., Any], step: str, take: Callable[[str], Any], config: Any,
              devices: Any = None) -> Any:
    """``run`` of a chain step on its inputs, each made by ``take(name)`` inside the call
    expression: CPython moves such arguments into the callee's frame, so no frame here keeps a
    reference and a step given the only one can let a product go (gigabytes at 10^7 points).
    No ``*args``/``**kwargs`` here: those would hold the arguments in a tuple to the end."""
    spec = BY_NAME[step]
    names, view = spec.inputs, config_for(step, config)
    if len(names) not in (1, 2, 3):
        raise ValueError(f"step {step!r}: expected 1 to 3 inputs, found {len(names)}")
    if not spec.devices:
        if len(names) == 1:
            return run(take(names[0]), view)
        if len(names) == 2:
            return run(take(names[0]), take(names[1]), view)
        return run(take(names[0]), take(names[1]), take(names[2]), view)
    if len(names) == 1:
        return run(take(names[0]), view, devices=devices)
    if len(names) == 2:
        return run(take(names[0]), take(names[1]), view, devices=devices)
    return run(take(names[0]), take(names[1]), take(names[2]), view, devices=devices)


# ------------------------------------------------------------------ the products, as counted
def counts(step: str, product: Any) -> dict[str, Any]:
    """The sizes of a step's product recorded in its manifest and the run summary."""
    if step == "selection":
        counted = {"candidates": int(product.attrs.get("n_candidates", 0)),
                   "selected": int(product.sizes["space"]), "epochs": int(product.sizes["time"])}
        if "n_ds" in product.attrs:  # distributed scatterers among the selected points
            counted["ds"] = int(product.attrs["n_ds"])
        return counted
    if step == "network":
        return {"first_order": int(product.sizes["space"]),
                "arcs": int(product.sizes[EDGE])}
    if step == "arcs":
        return {"arcs": int(product.sizes["arc"])}
    if step == "integration":
        return {"first_order": int(product.sizes["space"]),
                "kept": int(product["in_network"].values.sum())}
    if step == "atmosphere":
        return {"kept": int(product["in_network"].values.sum())}
    if step == "densification":
        return {"accepted": int(product.sizes["space"])}
    if step == "model":
        return _result_counts(product)
    raise KeyError(f"step {step!r}: its run reports its own counts")


def _result_counts(result: Any) -> dict[str, Any]:
    import numpy as np

    counted = {"points": int(result.sizes["space"])}
    if "order" in result:
        order = result["order"].values
        counted |= {"first_order": int((order == 1).sum()),
                    "densified": int((order == 2).sum())}
    if "reference" in result.attrs and "point_index" in result.variables:
        where = np.flatnonzero(result["point_index"].values == int(result.attrs["reference"]))
        if where.size:
            logger.info("chain: reference point is point_index %d (azimuth %d, range %d)",
                        int(result.attrs["reference"]), int(result["azimuth"].values[where[0]]),
                        int(result["range"].values[where[0]]))
    return counted
