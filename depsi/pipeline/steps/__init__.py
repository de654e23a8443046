"""The one table of steps: what each step reads, which config sections it depends on, what it
writes and how. Both executors run it: :func:`~depsi.pipeline.chain.run_ps_chain` in memory
(the chain's steps) and :func:`~depsi.pipeline.runner.run_pipeline` with a checkpoint after each
step; the command line's choices, ``--from``/``--to``, the manifests' upstreams, the redo
policy and how each product is stored and opened all come from it, so neither executor names a
step.

Each step lives in its own module of this package (``depsi.pipeline.steps.network``, ...), its
function ``run(inputs, config, context)``: the products it reads (:class:`Inputs`), the
configuration as it may read it (:class:`ConfigView`) and what the run gives it besides
(:class:`StepContext`); it returns its product.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        The steps whose products it reads (its ``run`` takes each by that name from
        :class:`Inputs`).
    sections
        Dotted config sections it depends on: a change in one redoes it, and they are all of
        the configuration its ``run`` is given (:class:`ConfigView`).
    product
        Its product, relative to the workspace.
    function
        Where the step's function lives (``module:name`` in this package, imported when first
        run, so the table is cheap to import: the command line reads it):
        ``run(inputs, config, context)``.
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
    counts
        Where the function lives that reads the sizes recorded in the manifest from the
        product as stored (``module:name``); a step without one reports its counts in
        :attr:`StepContext.counts`.
    opener
        Where the function lives that opens the product for the steps reading it
        (``module:name``, ``opener(path, config)`` with the step's own :class:`ConfigView`);
        default: :func:`depsi.io.open_stm`.
    keep_open
        The product as opened is kept for the rest of the run, opened once (the stack: its
        checks read a sample of its chunks).
    opens_input
        Its product is the user's input, read in place (a simulated input is written into
        :attr:`product`): its manifest records the input files' fingerprint, and a change of
        them redoes it.
    writes_files
        Its ``run`` writes its product itself, a folder of files (not a Zarr STM), and returns
        the folder.
    reorder
        Its product is stored in Morton order, like every point STM a user reads (the chain's
        other products keep the order the next steps index them in).
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
    counts: str | None = None
    opener: str | None = None
    keep_open: bool = False
    opens_input: bool = False
    writes_files: bool = False
    reorder: bool = False

    @property
    def run(self) -> Callable[..., Any]:
        """The step's function."""
        return _resolve(self.function)

    @property
    def run_in_memory(self) -> Callable[..., Any]:
        """The step's function as :func:`~depsi.pipeline.chain.run_ps_chain` runs it."""
        return _resolve(self.in_memory or self.function)

    @property
    def stored(self) -> bool:
        """Its product is a Dataset that the pipeline stores as a Zarr STM (the others are the
        input read in place and the exports' folder)."""
        return not (self.opens_input or self.writes_files)

    def open(self, path: Path, config: Any) -> Any:
        """The product at ``path`` as the steps reading it take it (``config``: the whole
        configuration; the opener sees this step's view of it)."""
        if self.opener is None:
            from depsi.io import open_stm

            return open_stm(path)
        return _resolve(self.opener)(path, config_for(self.name, config))


def _resolve(where: str) -> Callable[..., Any]:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
         "stack:run", chain=False,
         checks=("output.exports", "selection.method", "selection.ds", *MODEL_TERMS),
         opener="stack:open_product", keep_open=True, opens_input=True),
    Step("selection", "PS candidates by amplitude dispersion (and DS)", ("stack",),
         ("selection", "input.dem"), "ps.zarr", "selection:run", chain=False,
         counts="selection:counts", opener="selection:open_product", reorder=True),
    Step("network", "first-order points and their arcs", ("selection",),
         ("network", "integration.reference"), "network.zarr", "network:run",
         checks=(*MODEL_TERMS, "atmosphere.method", "atmosphere.stratified"),
         counts="network:counts"),
    Step("arcs", "periodogram of every arc", ("network",),
         ("arcs", "model.arcs", *MODEL_TERMS), "arcs.zarr", "arcs:run",
         in_memory="arcs:run_in_memory", counts="arcs:counts"),
    Step("integration", "network solution with arc testing", ("network", "arcs"),
         ("integration", "model.arcs", *MODEL_TERMS), "integration.zarr", "integration:run",
         counts="integration:counts"),
    Step("atmosphere", "screen, second network pass, reference noise and area",
         ("network", "integration"),
         ("network", "arcs", "integration", "atmosphere", "model.arcs", *MODEL_TERMS),
         "atmosphere.zarr", "atmosphere:run", computed=("network", "integration"),
         counts="atmosphere:counts"),
    Step("densification", "every other point against the network", ("selection", "atmosphere"),
         ("arcs", "densification", "model.densification", *MODEL_TERMS), "densification.zarr",
         "densification:run", computed=("atmosphere",), counts="densification:counts"),
    Step("model", "velocity, height and model terms with the atmosphere",
         ("selection", "atmosphere", "densification"),
         ("atmosphere", "model.choice", "model.alpha", *MODEL_TERMS), "stm.zarr",
         "model:run", computed=("atmosphere",), counts="model:counts", reorder=True),
    Step("export", "CSV, GeoPackage, GeoTIFF, plots", ("model",), ("output.exports",),
         "exports", "export:run", chain=False, writes_files=True),
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
class Inputs:
    """The products a step reads, by the name of the step that made them, each made when the
    step takes it (``inputs["network"]``): an executor opens a stored product then, and the
    in-memory chain hands over a product after its last reader, so a step given the only
    reference can let it go (gigabytes at 10^7 points). Take each input once, into a local.

    Examples
    --------
    >>> inputs = Inputs.given(network="the network's product")
    >>> inputs["network"]
    "the network's product"
    """

    def __init__(self, take: Callable[[str], Any], names: Iterable[str]):
        self._take = take
        self.names = tuple(names)

    @classmethod
    def given(cls, **products: Any) -> Inputs:
        """Products given by value, each handed over (not kept here) when taken."""
        return cls(products.pop, tuple(products))

    def __getitem__(self, name: str) -> Any:
        if name not in self.names:
            raise KeyError(f"input {name!r}: expected one of the step's inputs "
                           f"{', '.join(self.names) or '(none)'}")
        return self._take(name)

    def __contains__(self, name: object) -> bool:
        return name in self.names


@dataclass
class StepContext:
    """What a run gives a step besides its inputs and configuration.

    Attributes
    ----------
    devices
        The devices the step spreads its chunks over (None: those of
        :func:`depsi.kernels.backend.configure_devices`).
    progress
        Progress bars wanted.
    target
        Where the product goes (a step that writes its product itself: :attr:`Step.writes_files`,
        :attr:`Step.opens_input`); None in memory.
    counts
        Sizes the step reports itself (a step without a counts function of its product).
    """

    devices: Any = None
    progress: bool = False
    target: Path | None = None
    counts: dict[str, Any] = field(default_factory=dict)

    def written_product(self) -> Path:
        """:attr:`target`, which a step that writes its product itself needs."""
        if self.target is None:
            raise ValueError("context.target: expected the path of the product the step writes, "
                             "found None")
        return self.target


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
            else:
                allowed = self._allowed.setdefault(top, set())
                if allowed is not None:  # None: the whole section is allowed already
                    allowed.add(field)

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
              context: StepContext | None = None) -> Any:
    """``run`` of ``step`` on the products its inputs ``take(name)`` makes, with ``config`` as
    the step may read it (:func:`config_for`)."""
    return run(Inputs(take, BY_NAME[step].inputs), config_for(step, config),
               context if context is not None else StepContext())


def run_step(step: str, config: Any, *, context: StepContext | None = None,
             in_memory: bool = True, **products: Any) -> Any:
    """One step alone on ``products``, each by the name of the step that made it, as
    :func:`~depsi.pipeline.chain.run_ps_chain` runs it (``in_memory=False``: as ``depsi run``
    does, e.g. the arcs as an arc STM to store, not integration's observations). The products
    are handed over: a step given the only reference can let it go.

    Examples
    --------
    >>> from depsi.pipeline.chain_config import chain_config
    >>> from depsi.pipeline.steps.selection import prepare_points
    >>> from depsi.processing import ps_selection
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(40, 40), n_epochs=12, seed=0)
    >>> points = prepare_points(ps_selection(stack).compute())
    >>> network = run_step("network", chain_config(network={"first_order": 30}),
    ...                    selection=points)
    >>> network.sizes["space"] <= 30, "edge_source" in network  # the first-order points, arcs
    (True, True)
    """
    spec = BY_NAME[step]
    if set(products) != set(spec.inputs):
        raise TypeError(f"step {step!r}: expected the products of {', '.join(spec.inputs)}, "
                        f"found {', '.join(products) or 'none'}")
    run = spec.run_in_memory if in_memory else spec.run
    return run(Inputs(products.pop, spec.inputs), config_for(step, config),
               context if context is not None else StepContext())


# ------------------------------------------------------------------ the products, as counted
def counts(step: str, product: Any) -> dict[str, Any]:
    """The sizes of a step's product recorded in its manifest and the run summary."""
    where = BY_NAME[step].counts
    if where is None:
        raise KeyError(f"step {step!r}: its run reports its own counts")
    return _resolve(where)(product)
