"""Numba for depsi's fused CPU kernels: the optional import, and a compilation cache that never
breaks a read-only install (docs/design.md, "Kernels").

Numba's own cache locators write beside the package's sources when they can, and make the
decoration fail when no locator can write at all. :func:`jit_cached` caches only in
:func:`cache_dir`, and compiles per process where that cannot be written.

Compiling them costs about 20 s of a first run. :func:`ready` decides, once a process and
kernel module, whether the compiled kernels run: where the cache holds them (loaded then), or
where ``DEPSI_NUMBA_COMPILE=inline`` (compiled at their first call, in this process). Otherwise
the module's NumPy reference runs (the same results to the bit, the periodogram's to the
tolerance its tests hold it to), and with a writable cache a background process
(:mod:`depsi.kernels.warmup`), started when this process exits so that it takes no core from
the run, compiles every kernel into it for the next run; with none nothing is compiled, which
per process would cost every run those 20 s.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def jit_cached(function=None, **options):
    """``numba.njit(nogil=True, **options)``, cached in :func:`cache_dir` only (compiled per
    process when that cannot be written). ``@jit_cached`` or ``jit_cached(fastmath=...)(f)``."""
    if function is None:
        return lambda f: jit_cached(f, **options)
    path = cache_dir()
    if path is None:
        logger.debug("numba_support: no writable cache directory; compiling per process")
        return numba.njit(nogil=True, **options)(function)
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(path)  # read once, when the dispatcher locates its cache
    try:
        return numba.njit(nogil=True, cache=True, **options)(function)
    except RuntimeError:  # no locator accepted the directory after all
        return numba.njit(nogil=True, **options)(function)
    finally:
        numba.config.CACHE_DIR = saved


#: A kernel module's sample calls: each dispatcher with arguments of the types its module
#: passes it (tiny arrays), what :func:`ready` looks up and :mod:`depsi.kernels.warmup` compiles.
Samples = Callable[[], Sequence[tuple[Any, tuple]]]

_decided: dict[str, bool] = {}
_background: list[subprocess.Popen] = []
_pending: list[Path] = []
_deciding = threading.Lock()  # Dask's threads ask at once: one decision, one message


def sample_array(dtype, ndim: int):
    """A C-contiguous array of one element per axis: a sample argument's type."""
    import numpy as np

    return np.zeros((1,) * ndim, dtype=dtype)


def compile_mode() -> str:
    """``DEPSI_NUMBA_COMPILE``: ``background`` (the default) or ``inline``."""
    mode = os.environ.get("DEPSI_NUMBA_COMPILE", "background").strip().lower()
    if mode not in ("background", "inline"):
        raise ValueError(f"DEPSI_NUMBA_COMPILE={mode!r}: expected 'background' or 'inline'")
    return mode


def signature(dispatcher, args: tuple) -> tuple:
    """The Numba argument types of ``dispatcher(*args)``."""
    return tuple(dispatcher.typeof_pyval(a) for a in args)


def loaded(dispatcher, args: tuple) -> bool:
    """Whether ``dispatcher(*args)`` runs without compiling: compiled in this process already,
    or in the cache (then loaded)."""
    sig = signature(dispatcher, args)
    if sig in dispatcher.overloads:
        return True
    cache = getattr(dispatcher, "_cache", None)
    load = getattr(cache, "load_overload", None)
    if load is None:  # a Numba without the cache's lookup: compiled at the first call
        return True
    if load(sig, dispatcher.targetctx) is None:
        return False
    dispatcher.compile(sig)  # the cache's entry, as the first call would load it
    return True


def ready(name: str, samples: Samples) -> bool:
    """Whether the compiled kernels of module ``name`` run in this process (decided at the
    first call, the same for the rest of the process, so that one run takes one path): True
    where the cache holds every sample's compilation or ``DEPSI_NUMBA_COMPILE=inline``; else
    False, the NumPy reference runs, and a background process fills a writable cache."""
    with _deciding:
        return _decide(name, samples)


def _decide(name: str, samples: Samples) -> bool:
    if name in _decided:
        return _decided[name]
    if numba is None:
        result = False
    elif compile_mode() == "inline":
        result = True
    else:
        result = all([loaded(dispatcher, args) for dispatcher, args in samples()])
        if not result:
            _fall_back(name)
    _decided[name] = result
    return result


def _fall_back(name: str) -> None:
    """Say (once a process) that the NumPy kernels run, and start the background compilation
    where the cache can be written."""
    told = bool(_pending) or any(not done for done in _decided.values())
    log = logger.debug if told else logger.info
    path = cache_dir()
    if path is None:
        (logger.debug if told else logger.warning)(
            "Numba's compiled kernels cannot be cached (no writable cache directory; set "
            "NUMBA_CACHE_DIR): the NumPy kernels run instead of compiling them in every run, "
            "about 20 s (DEPSI_NUMBA_COMPILE=inline compiles them) [%s]", name)
        return
    if not _pending:
        _pending.append(path)
        atexit.register(compile_pending)
    log("Numba's compiled kernels are not in the cache %s yet: this run uses the NumPy kernels, "
        "and a background process compiles them for the next run when it ends (its log: "
        "warmup.log there; `depsi warmup` compiles them now) [%s]", path, name)


def compile_pending() -> subprocess.Popen | None:
    """Start the background compilation a run's missing kernels asked for (at exit)."""
    return compile_in_background(_pending[0]) if _pending else None


#: Bytes of ``warmup.log`` kept (its end) before a background compilation appends to it.
LOG_KEEP_BYTES = 256 * 1024


def trim_log(log: Path, keep: int = LOG_KEEP_BYTES) -> None:
    """Keep the last ``keep`` bytes of ``log`` (from a line's start), where it is longer: each
    background compilation appends its lines, so the log would otherwise grow with every run
    that finds the cache cold. A log that cannot be read or written is left as it is."""
    try:
        if log.stat().st_size <= keep:
            return
        with open(log, "rb") as file:
            file.seek(-keep, os.SEEK_END)
            tail = file.read()
        newline = tail.find(b"\n")
        tail = tail[newline + 1:] if newline >= 0 else tail
        partial = log.with_name(log.name + ".trim")
        partial.write_bytes(tail)
        partial.replace(log)  # atomic: the log is whole before and after
    except OSError as error:
        logger.debug("numba_support: %s not trimmed: %s", log, error)


def compile_in_background(path: Path) -> subprocess.Popen | None:
    """Start :mod:`depsi.kernels.warmup` in a background process (once a process) that
    compiles every kernel into the cache ``path``, at a low priority; its log is
    ``path/warmup.log``."""
    if _background:
        return _background[0]
    env = dict(os.environ, NUMBA_CACHE_DIR=str(path))
    trim_log(path / "warmup.log")
    try:
        with open(path / "warmup.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "depsi.kernels.warmup", "--background"], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)  # outlives this process, and its Ctrl-C
    except OSError as error:
        logger.warning("numba_support: the background compilation did not start: %s", error)
        return None
    _background.append(process)
    logger.info("compiling Numba's kernels into %s in a background process (%d)", path,
                process.pid)
    return process
