"""Habits of the test suite itself: test modules share scenes through tests/scenes.py and
fixtures through tests/conftest.py, never by importing one another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # from . import test_x
            found += [(node.lineno, f"{node.module or ''}.{alias.name}".lstrip("."))
                      for alias in node.names]
    return found


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and (parts[0].startswith("test_") or parts[0] == "conftest")


def test_no_test_module_imports_another_test_module():
    offenders = [f"{path.relative_to(TESTS.parent)}:{line}: imports {name}"
                 for path in sorted(TESTS.rglob("*.py"))
                 for line, name in _imported_modules(path) if _is_test_module(name)]
    assert not offenders, ("share scenes through tests/scenes.py and fixtures through "
                           "tests/conftest.py:\n" + "\n".join(offenders))


def test_the_rule_sees_the_import_forms():
    assert _is_test_module("test_network") and _is_test_module("tests.test_slurm")
    assert _is_test_module("conftest")
    assert not _is_test_module("scenes") and not _is_test_module("depsi.testing")
