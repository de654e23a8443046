"""Compile depsi's Numba kernels into the cache ahead of a run: ``depsi warmup``, and the
background process that :func:`depsi.kernels.numba_support.ready` starts where a run finds the
cache without them (docs/design.md, "Kernels").

One compilation at a time a cache directory (a lock file there); Numba writes each cache file
under a temporary name and renames it, so a compilation killed midway leaves no entry that a
run would load, and its temporary files are removed by the next one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import time
from pathlib import Path

from depsi.kernels.numba_support import cache_dir, loaded, signature

logger = logging.getLogger("depsi.kernels.warmup")  # also when run as __main__

#: The kernel modules compiled, each with ``samples()`` and ``AVAILABLE``.
MODULES = ("periodogram_numba", "arc_rhs_numba", "ldl_numba", "normal_rhs_numba",
           "statistics_numba", "misclosure_numba", "kriging_numba", "gather_numba")

#: Age (s) past which a temporary file of Numba's cache writer is an interrupted write's.
STALE_TEMPORARY_S = 600.0


@contextlib.contextmanager
def _exclusive(lock: Path):
    """Hold an exclusive lock on the file ``lock`` (waiting for another holder)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: concurrent compilations only repeat work
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_stale_temporaries(path: Path, older_than: float = STALE_TEMPORARY_S) -> list[Path]:
    """Remove the temporary files (``*.tmp.*``) of interrupted cache writes under ``path``."""
    removed = []
    now = time.time()
    for candidate in path.rglob("*.tmp.*"):
        with contextlib.suppress(OSError):
            if now - candidate.stat().st_mtime > older_than:
                candidate.unlink()
                removed.append(candidate)
    return removed


def warmup() -> dict[str, float]:
    """Compile every kernel module's samples into the cache (loading those it holds): the
    seconds each module took. Raises OSError where no cache directory can be written."""
    path = cache_dir()
    if path is None:
        raise OSError("no writable cache directory for Numba's kernels: set NUMBA_CACHE_DIR")
    seconds = {}
    with _exclusive(path / "warmup.lock"):
        for stale in remove_stale_temporaries(path):
            logger.info("removed %s, an interrupted cache write", stale)
        for name in MODULES:
            module = importlib.import_module(f"depsi.kernels.{name}")
            if not module.AVAILABLE:
                continue
            start = time.perf_counter()
            compiled = 0
            for dispatcher, args in module.samples():
                if not loaded(dispatcher, args):
                    dispatcher.compile(signature(dispatcher, args))
                    compiled += 1
            seconds[name] = time.perf_counter() - start
            logger.info("%s: %s in %.1f s", name,
                        f"compiled {compiled} of its kernels" if compiled else "in the cache",
                        seconds[name])
    logger.info("Numba's kernels are in %s", path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--background", action="store_true",
                        help="at the lowest priority (the process a run starts)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    if args.background and hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(19)  # the run that started it keeps the cores
    try:
        warmup()
    except OSError as error:
        logger.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
