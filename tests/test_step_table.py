"""The steps are listed once, in :data:`depsi.pipeline.steps.STEPS`: every other
list of them (the CLI's choices, the runner's products and upstreams, the executors' order,
a test's or benchmark's loop) derives from it. A literal that names three or more steps by
hand anywhere else fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from depsi.pipeline.config import PipelineConfig
from depsi.pipeline.steps import BY_NAME, CHAIN_STEPS, STEP_NAMES, STEPS, last_consumers

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "depsi" / "pipeline" / "steps" / "__init__.py"
#: Step names a literal may hold without being a list of steps.
AT_MOST = 2


#: Config sections that share a step's name: a mapping keyed by them is a config, not a list
#: of steps, unless it also names a step that is no section.
SECTIONS = set(PipelineConfig.model_fields)


def _named_steps(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [key for key in node.keys if key is not None]
    else:
        return set()
    names = {item.value for item in items
             if isinstance(item, ast.Constant) and item.value in BY_NAME}
    if isinstance(node, ast.Dict) and names <= SECTIONS:
        return set()
    return names


def _hand_written_lists(path: Path, *, constants_only: bool = False) -> list[str]:
    """Literals naming more than :data:`AT_MOST` steps (``constants_only``: only those
    assigned to a module-level name, a test's own step list)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = ([n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))]
             if constants_only else list(ast.walk(tree)))
    return [f"{path}:{node.lineno}: {sorted(_named_steps(node))}" for node in nodes
            if node is not None and len(_named_steps(node)) > AT_MOST]


def test_no_step_list_is_written_by_hand_outside_the_table():
    """In the package, benchmarks and scripts: no literal lists steps. In the tests: no
    module constant does (an expected outcome inside a test may name the steps it expects)."""
    found = []
    for folder in ("depsi", "benchmarks", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != TABLE:
                found += _hand_written_lists(path, constants_only=folder == "tests")
    assert not found, ("steps listed by hand (derive them from depsi.pipeline.steps.STEPS):\n"
                       + "\n".join(found))


def test_the_check_finds_a_hand_written_list(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('ORDER = ("network", "arcs", "integration")\nPAIR = ("network", "x")\n'
                      'PRODUCTS = {"stack": 1, "selection": 2, "model": 3}\n')
    assert [line.split(":")[1] for line in _hand_written_lists(sample)] == ["1", "3"]
    config = tmp_path / "config.py"
    config.write_text('DATA = {"network": {}, "arcs": {}, "integration": {}}\n')
    assert _hand_written_lists(config) == []


def test_the_table_is_consistent():
    """Inputs are earlier steps; the chain's steps are contiguous and read only chain
    products or the selection's points; every input has a last reader."""
    seen = set()
    for step in STEPS:
        assert set(step.inputs) <= seen, (step.name, step.inputs)
        seen.add(step.name)
        assert step.run is not None  # its function resolves
    assert CHAIN_STEPS == STEP_NAMES[2:-1]
    for name in CHAIN_STEPS:
        assert set(BY_NAME[name].inputs) <= set(CHAIN_STEPS) | {"selection"}
    last = last_consumers(STEP_NAMES)
    assert last["integration"] == "atmosphere" and last["selection"] == "model"


def test_the_cli_choices_are_the_table():
    from depsi.cli import build_parser

    parser = build_parser()
    run = next(a for a in parser._subparsers._group_actions[0].choices["run"]._actions
               if a.dest == "start")
    assert tuple(run.choices) == STEP_NAMES


def test_depsi_steps_prints_the_table(capsys):
    from depsi.cli import main

    assert main(["steps"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == list(STEP_NAMES)
    assert "network, integration.reference" in lines[1 + STEP_NAMES.index("network")]
