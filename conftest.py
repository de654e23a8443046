"""Shared by the tests and the docstring examples of depsi/ (pyproject's testpaths collect both):
the names every docstring example may use unimported, and the slow mark of the examples that run
the chain (the tests' own fixtures are in tests/conftest.py, their shared scenes in tests/scenes.py).
"""

from __future__ import annotations

import re

import pytest

#: A docstring example is slow when it runs the chain or the pipeline: a call of one of these
#: (``run_ps_chain`` and ``run_pipeline`` run every step; ``run_demo`` and ``accuracy`` run the
#: chain inside). ``pytest -m "not slow"`` skips them like the slow tests.
CHAIN_CALL = re.compile(r"\b(run_ps_chain|run_pipeline|run_demo|accuracy)\(")


@pytest.fixture(scope="session", autouse=True)
def _doctest_preamble(doctest_namespace: dict) -> None:
    """``np``, ``xr``, ``da`` and ``simulate_stack`` in every docstring example. An example that
    is a page's example in the docs may still import them, to read on its own."""
    import dask.array as da
    import numpy as np
    import xarray as xr

    from depsi.simulate import simulate_stack

    doctest_namespace.update(np=np, xr=xr, da=da, simulate_stack=simulate_stack)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.DoctestItem) and any(
                CHAIN_CALL.search(example.source) for example in item.dtest.examples):
            item.add_marker(pytest.mark.slow)
