"""The layers of docs/design.md, "Layers": every import of a depsi module points down (or within its
layer), and no modules import each other, directly or round a longer loop.

Every module of depsi/ is parsed with ``ast``; its ``depsi.*`` imports are collected wherever they
are (top level, inside functions, under ``TYPE_CHECKING``), since a deferred import is still a
dependency. ``python tests/test_layers.py [FILE]`` writes the import graph by layer (default
``IMPORT_GRAPH.txt`` in the repository root).
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "depsi"

#: The layers from the bottom up, with the modules (and packages) each holds. A module imports
#: only from its own layer and the layers below.
#:
#: - ``conventions``: the foundations, importing nothing of depsi: :mod:`depsi.conventions`
#:   (NumPy and the standard library only), :mod:`depsi.sections` (the pydantic base of
#:   every configuration section, so that each layer can define its own sections) and
#:   :mod:`depsi.errors` (exit codes and the classification of faults, standard library only).
#: - ``geometry``: :mod:`depsi.geometry`, the SAR geometry from orbits (science that the readers
#:   and writers of io use to compute h2ph and positions): below io, above stm.
#: - ``simulate``: :mod:`depsi.simulate` is a test-data generator. It writes stores through io
#:   and its ``accuracy`` forms interferograms with processing, and the pipeline (its
#:   ``simulated`` input) and the demo use it: so it sits above processing and below cluster.
#: - ``viewer``: :mod:`depsi.viewer`, the web explorer of a result (``depsi view``); it reads
#:   results through io and a model's regressors from processing; only the faces import it.
#: - ``faces``: the command line, the demo and the package root (``import depsi``), which
#:   re-exports the public API.
LAYERS = (
    ("conventions", ("depsi.conventions", "depsi.sections", "depsi.errors")),
    ("kernels", ("depsi.kernels",)),
    ("stm", ("depsi.stm",)),
    ("geometry", ("depsi.geometry",)),
    ("io", ("depsi.io",)),
    ("processing", ("depsi.processing",)),
    ("simulate", ("depsi.simulate",)),
    ("cluster", ("depsi.cluster",)),
    ("pipeline", ("depsi.pipeline",)),
    ("viewer", ("depsi.viewer",)),
    ("faces", ("depsi.cli", "depsi.demo", "depsi")),
)

#: Third-party packages a layer must not import (docs/design.md, "Layers", the column
#: "knows nothing of").
FORBIDDEN_PACKAGES = {
    "conventions": {"xarray", "dask", "zarr", "scipy", "pandas", "distributed"},
    "kernels": {"xarray", "dask", "zarr", "pydantic", "distributed"},
    "geometry": {"dask", "zarr", "distributed"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _module_paths() -> tuple[tuple[str, Path], ...]:
    return tuple((module_name(p), p) for p in sorted(PACKAGE.rglob("*.py")))


def modules() -> dict[str, Path]:
    """Every module of depsi by dotted name (a package by its ``__init__.py``); the tree is
    walked once per process."""
    return dict(_module_paths())


def layer_of(name: str) -> str:
    """The layer of a module: the layer of its longest matching prefix."""
    best, best_length = None, -1
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            matches = name == prefix or (prefix != "depsi" and name.startswith(prefix + "."))
            if matches and len(prefix) > best_length:
                best, best_length = layer, len(prefix)
    if best is None:
        raise KeyError(f"module {name!r}: expected in one of the layers {[n for n, _ in LAYERS]}"
                       f"; add it to LAYERS in tests/test_layers.py")
    return best


def _resolve(target: str, known: dict[str, Path]) -> str:
    """The module an imported name lives in: the longest known dotted prefix."""
    parts = target.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def _imports(name: str, path: Path) -> tuple[set[str], set[str]]:
    """(depsi modules, other top-level packages) that ``name`` imports anywhere (each file
    parsed once per process)."""
    inner, outer = _parsed_imports(name, path)
    return set(inner), set(outer)


@functools.cache
def _parsed_imports(name: str, path: Path) -> tuple[frozenset[str], frozenset[str]]:
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner, outer = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from depsi.io import paths" imports the module depsi.io.paths
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
        for target in targets:
            if target == "depsi" or target.startswith("depsi."):
                resolved = _resolve(target, known)
                if resolved and resolved != name:
                    inner.add(resolved)
            else:
                outer.add(target.split(".")[0])
    return frozenset(inner), frozenset(outer)


def import_graph(*, packages: bool = False) -> dict[str, set[str]]:
    """Each depsi module and the depsi modules it imports.

    With ``packages``, also the packages Python runs on the way: importing ``depsi.pipeline.
    config`` first runs ``depsi/pipeline/__init__.py`` (which imports the runner), unless the
    importer is inside that package already. A loop through such an ``__init__`` is a real
    import cycle too (it was one between cluster and the pipeline).
    """
    graph = {name: _imports(name, path)[0] for name, path in modules().items()}
    if packages:
        known = modules()
        for name, targets in graph.items():
            parents = set()
            for target in targets:
                parts = target.split(".")
                for n in range(2, len(parts)):
                    parent = ".".join(parts[:n])
                    if parent in known and not (name == parent or name.startswith(parent + ".")):
                        parents.add(parent)
            targets |= parents
    return graph


def _rank(layer: str) -> int:
    return [n for n, _ in LAYERS].index(layer)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _rank(layer_of(target)) > _rank(layer_of(name)):
                found.append(f"{name} ({layer_of(name)}) imports {target} "
                             f"({layer_of(target)})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def format_import_graph() -> str:
    """The import graph by layer, bottom first: each module and the depsi modules it imports
    (``(same layer)`` marks imports within the layer)."""
    graph = import_graph()
    by_layer = defaultdict(list)
    for name in graph:
        by_layer[layer_of(name)].append(name)
    lines = ["depsi import graph by layer (bottom first); a module imports only from its layer "
             "and those below", ""]
    for rank, (layer, _) in enumerate(LAYERS):
        lines.append(f"{rank} {layer}")
        for name in sorted(by_layer[layer]):
            below = sorted(t for t in graph[name] if layer_of(t) != layer)
            same = sorted(t for t in graph[name] if layer_of(t) == layer)
            text = ", ".join(below + [f"{t} (same layer)" for t in same]) or "-"
            lines.append(f"    {name:<38} <- {text}")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- tests
def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_goes_up_a_layer():
    upward = upward_imports(import_graph(packages=True))
    assert not upward, ('imports against the layers of docs/design.md, "Layers":\n'
                        + "\n".join(upward))


def test_no_modules_import_each_other():
    loops = cycles(import_graph(packages=True))
    assert not loops, f"modules that import each other (directly or round a loop): {loops}"


def test_the_lowest_layers_know_no_frameworks():
    for name, path in modules().items():
        forbidden = FORBIDDEN_PACKAGES.get(layer_of(name), set())
        used = _imports(name, path)[1] & forbidden
        assert not used, f"{name} ({layer_of(name)}) imports {sorted(used)}"
    outer = _imports("depsi.conventions", PACKAGE / "conventions.py")[1]
    assert outer <= set(sys.stdlib_module_names) | {"numpy"}, outer


def test_the_chain_is_composed_only_in_the_pipeline_layer():
    """Processing keeps the science: the steps (a function ``run(inputs, config, context)``,
    or one named ``<step>_step`` for a step of the table) and the composed chain configuration
    live in depsi.pipeline, so no lower module wires steps together."""
    from depsi.pipeline.steps import STEP_NAMES

    step_functions = {f"{name}_step" for name in STEP_NAMES}
    step_signature = ["inputs", "config", "context"]
    found = []
    for name, path in modules().items():
        if layer_of(name) in ("pipeline", "faces"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and (
                    node.name in step_functions
                    or [arg.arg for arg in node.args.args] == step_signature):
                found.append(f"{name}.{node.name}")
            if isinstance(node, ast.ClassDef) and node.name == "ChainConfig":
                found.append(f"{name}.{node.name}")
    assert not found, f"composition outside the pipeline layer: {found}"


def test_the_checks_find_an_upward_import_and_a_loop():
    graph = {"depsi.kernels.a": {"depsi.processing.b"}, "depsi.processing.b": set(),
             "depsi.io.c": {"depsi.io.d"}, "depsi.io.d": {"depsi.io.c"}}
    assert upward_imports(graph) == [
        "depsi.kernels.a (kernels) imports depsi.processing.b (processing)"]
    assert cycles(graph) == [["depsi.io.c", "depsi.io.d"]]


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "IMPORT_GRAPH.txt"
    out.write_text(format_import_graph() + "\n")
    print(f"wrote {out}")
