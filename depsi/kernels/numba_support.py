"""Numba for depsi's fused CPU kernels: the optional import, and a compilation cache that never
breaks a read-only install (docs/design.md, "Kernels").

Numba's own cache locators write beside the package's sources when they can, and make the
decoration fail when no locator can write at all. :func:`jit_cached` caches only in
:func:`cache_dir`, and compiles per process where that cannot be written.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

try:
    import numba
except ImportError:  # pragma: no cover - numba is a core dependency; kept for stripped installs
    numba = None  # type: ignore[assignment]  # a module or None: mypy types it the module


def cache_dir() -> Path | None:
    """Where compiled kernels are cached: ``NUMBA_CACHE_DIR`` if set, else
    ``$XDG_CACHE_HOME/depsi/numba`` (``~/.cache/depsi/numba``); None when that cannot be
    written (a read-only home), and then nothing is cached, nor written anywhere else."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        path = Path(configured)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "depsi" / "numba"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError:
        return None
    return path


def jit_cached(function):
    """``numba.njit(nogil=True)``, cached in :func:`cache_dir` only (compiled per process when
    that cannot be written)."""
    path = cache_dir()
    if path is None:
        logger.debug("numba_support: no writable cache directory; compiling per process")
        return numba.njit(nogil=True)(function)
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(path)  # read once, when the dispatcher locates its cache
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError:  # no locator accepted the directory after all
        return numba.njit(nogil=True)(function)
    finally:
        numba.config.CACHE_DIR = saved

