"""Shared fixtures: where the real data lives, temporary stores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Real SAR/InSAR data shared beside the checkout (../shared/realdata); tests skip without it.
REALDATA = Path(os.environ.get("DEPSI_REALDATA", REPO.parent / "shared" / "realdata"))


@pytest.fixture(scope="session")
def realdata() -> Path:
    """Path to ``../shared/realdata``; skips the test when that folder is absent."""
    if not REALDATA.is_dir():
        pytest.skip(f"real data folder {REALDATA} is absent")
    return REALDATA
