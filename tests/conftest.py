"""Shared fixtures: where the real data lives, temporary stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Real SAR/InSAR data kept in the repository (``tests/data``, provenance in its README.md);
#: ``$DEPSI_REALDATA`` points the tests at another copy of the same layout.
REALDATA = Path(os.environ.get("DEPSI_REALDATA", REPO / "tests" / "data"))


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Path to the real data (``tests/data``); fails, never skips, when it is not there."""
    if not REALDATA.is_dir():
        pytest.fail(f"real data folder {REALDATA} is absent: expected the repository's "
                    f"tests/data (or $DEPSI_REALDATA pointing at a copy of it)")
    return REALDATA
