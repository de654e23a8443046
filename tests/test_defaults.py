"""One default, one home: a section's field and a function taking the same parameter agree.

Every :class:`depsi.sections.Section` subclass is found by importing every module of depsi
(``pkgutil.walk_packages``), and every public function of depsi by walking the same modules
(public names whose ``__module__`` is the module they are found in). For each field of a
section and each function *that implements that section* with a parameter of the field's
name, the two defaults must be equal, and written as the same named constant in both places
(``Field(DEFAULT_K, ...)`` and ``k: int = DEFAULT_K``, read from the source with ``ast``): two
equal literals drift apart at the next edit. ``None`` (no value) needs no constant.

Which functions implement a section: those of the module that defines it (a step's section is
defined beside its code, docs/design.md, "Layers"), plus the modules listed in
:data:`ALSO_IMPLEMENTED_IN` (a section whose parameters are also taken by another module's
functions, e.g. the arc search's ranges by the periodogram kernel). Matching by name alone across
modules would compare unrelated parameters that share a name: ``NetworkConfig.k`` (neighbours per
direction sector) with ``densify``'s ``k`` (first-order points per candidate),
``IntegrationConfig.min_coherence`` (arcs) with ``DensificationConfig.min_coherence`` (points),
every ``method``.

A function may keep another default on purpose (a DePSI- or stmtools-compatible name keeping
the peer's default, a ``None`` meaning "read it from the data"): then one sentence of its
docstring names the parameter and says so with the words ``on purpose``, e.g. "``method``
keeps DePSI's default on purpose; the chain uses ``NetworkConfig.method``."
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap

import pytest

import depsi
from depsi.sections import Section

#: Modules other than its own whose public functions take a section's parameters, with why.
ALSO_IMPLEMENTED_IN = {
    # the periodogram search of the arcs, and densification's arcs (ArcsConfig's docstring)
    "depsi.processing.arcs.ArcsConfig": ("depsi.kernels.periodogram",
                                         "depsi.processing.densification"),
    # the screen's leak into the height errors (AtmosphereConfig.correlated_height)
    "depsi.processing.atmosphere.AtmosphereConfig": ("depsi.processing.correlated_height",),
    # the amplitude statistics that the selection thresholds
    "depsi.processing.selection.SelectionConfig": ("depsi.kernels.statistics",),
    # the integration step split by responsibility: arc testing, the datum
    "depsi.processing.integration.IntegrationConfig": ("depsi.processing.arc_testing",
                                                       "depsi.processing.datum"),
    # the simulated input is the simulator's stack
    "depsi.pipeline.config.SimulateConfig": ("depsi.simulate.scene",),
}

_ON_PURPOSE = "on purpose"


def _modules() -> dict:
    errors = []
    found = {info.name: importlib.import_module(info.name)
             for info in pkgutil.walk_packages(depsi.__path__, "depsi.", onerror=errors.append)}
    assert not errors, f"modules of depsi that could not be imported: {errors}"
    return found


MODULES = _modules()


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _qualified(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


SECTIONS = sorted({s for s in _subclasses(Section) if s.__module__ in MODULES}, key=_qualified)


def _public_functions(module_name: str) -> list:
    module = MODULES[module_name]
    return [obj for name, obj in sorted(vars(module).items())
            if not name.startswith("_") and inspect.isfunction(obj)
            and obj.__module__ == module_name]


def _says_on_purpose(function, parameter: str) -> bool:
    """Whether a sentence of ``function``'s docstring names ``parameter`` and ``on purpose``."""
    doc = inspect.getdoc(function) or ""
    word = re.compile(rf"\b{re.escape(parameter)}\b")
    return any(word.search(sentence) and _ON_PURPOSE in sentence
               for sentence in re.split(r"(?<=[.;])\s+", doc))


def _pairs():
    """(section field, function, field default, parameter default) of every match."""
    for section in SECTIONS:
        modules = (section.__module__,) + ALSO_IMPLEMENTED_IN.get(_qualified(section), ())
        for field_name, field in section.model_fields.items():
            if field.is_required():
                continue
            default = field.get_default(call_default_factory=True)
            for module_name in modules:
                for function in _public_functions(module_name):
                    parameter = inspect.signature(function).parameters.get(field_name)
                    if parameter is None or parameter.default is inspect.Parameter.empty:
                        continue
                    yield (f"{_qualified(section)}.{field_name}", function, default,
                           parameter.default)


PAIRS = list(_pairs())


def _case(field, function, field_default, parameter_default):
    return pytest.param(field, function, field_default, parameter_default,
                        id=f"{field}-{function.__name__}")


def test_the_walk_finds_the_steps_sections_and_their_functions():
    names = {s.__name__ for s in SECTIONS}
    assert {"NetworkConfig", "ArcsConfig", "DensificationConfig", "AtmosphereConfig",
            "SelectionConfig", "IntegrationConfig"} <= names
    matched = {(field.rsplit(".", 1)[-1], function.__name__) for field, function, *_ in PAIRS}
    assert {("method", "form_network"), ("k", "redundant_edges"),
            ("height_range", "periodogram"), ("min_coherence", "densify")} <= matched


def test_every_mapped_module_exists():
    for section, modules in ALSO_IMPLEMENTED_IN.items():
        assert section in {_qualified(s) for s in SECTIONS}, section
        for module_name in modules:
            assert module_name in MODULES, f"{section}: module {module_name} not found"


@pytest.mark.parametrize(("field", "function", "field_default", "parameter_default"),
                         [_case(*pair) for pair in PAIRS])
def test_a_section_field_and_its_functions_parameter_have_one_default(
        field, function, field_default, parameter_default):
    parameter = field.rsplit(".", 1)[-1]
    if _says_on_purpose(function, parameter):
        return
    assert parameter_default == field_default, (
        f"{_qualified(function)}({parameter}={parameter_default!r}) but {field} defaults to "
        f"{field_default!r}: use one named constant in both, or say in the function's "
        f"docstring why it differs '{_ON_PURPOSE}'")


def _field_default_source(section, name: str) -> ast.expr | None:
    """The expression a section's field default is written as (``Field``'s first argument or
    ``default=``, or the plain value)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(section)))
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
                keywords = {k.arg: k.value for k in value.keywords}
                return value.args[0] if value.args else keywords.get("default")
            return value
    return None


def _parameter_default_source(function, name: str) -> ast.expr | None:
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]],
                        args.defaults))
    defaults.update((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d)
    return defaults.get(name)


def _constant_name(node: ast.expr | None) -> str | None:
    """``DEFAULT_K`` for ``DEFAULT_K`` or ``module.DEFAULT_K``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


@pytest.mark.parametrize(("field", "function", "field_default", "parameter_default"),
                         [_case(*pair) for pair in PAIRS
                          if pair[2] is not None])
def test_a_section_field_and_its_functions_parameter_name_one_constant(
        field, function, field_default, parameter_default):
    section_name, parameter = field.rsplit(".", 1)
    if _says_on_purpose(function, parameter):
        return
    section = next(s for s in SECTIONS if _qualified(s) == section_name)
    in_section = _constant_name(_field_default_source(section, parameter))
    in_function = _constant_name(_parameter_default_source(function, parameter))
    assert in_section is not None and in_section == in_function, (
        f"{field} and {_qualified(function)}({parameter}=...): expected one named constant "
        f"as both defaults, found {in_section or 'a literal'} and {in_function or 'a literal'}")


def test_on_purpose_is_read_per_parameter():
    def keeps(points, *, k=1, n=2):
        """Join points.

        ``k`` keeps the peer's default on purpose; the chain uses its section's.
        """

    assert _says_on_purpose(keeps, "k")
    assert not _says_on_purpose(keeps, "n")
