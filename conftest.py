"""Shared by the tests and the docstring examples of depsi/ (pyproject's testpaths collect both):
the names every docstring example may use unimported, and the slow mark of the examples that run
the pipeline (the tests' own fixtures are in tests/conftest.py, their shared scenes in
tests/scenes.py).
"""

from __future__ import annotations

import re

import pytest

#: A docstring example is slow when it runs the pipeline (``run_pipeline``, ``run_demo``: every
#: step, a workspace and its products on disk; 1-5 s each). ``pytest -m "not slow"`` skips them
#: like the slow tests. The examples running ``run_ps_chain`` (small stacks in memory, under 1 s)
#: stay quick: they are the quick subset's whole-chain example and its only run of ``accuracy``.
PIPELINE_CALL = re.compile(r"\b(run_pipeline|run_demo)\(")


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
                PIPELINE_CALL.search(example.source) for example in item.dtest.examples):
            item.add_marker(pytest.mark.slow)
