"""One writer at a time: an inter-process lock beside every path depsi writes.

Every write path (``save_stm``, ``append_epochs``, the exports, the pipeline's products) holds
:func:`write_lock` on its target while it writes, so two processes never interleave their
writes to one store. The lock is a hidden sibling file ``.<name>-lock``; a second writer waits
up to ``timeout`` seconds and then raises :class:`StoreLockedError`.

Two kinds of lock (``DEPSI_LOCK`` in the environment, or ``kind=``):

- ``flock`` (default): ``fcntl.flock`` on the lock file through :class:`filelock.FileLock`.
  The kernel releases it when the holder dies, even by SIGKILL. Local file systems, and
  Lustre/GPFS/NFSv4 mounted with working ``flock`` (Lustre: ``-o flock``); where the file
  system says it has no ``flock``, filelock falls back to the soft kind by itself.
- ``soft``: the lock file is created with ``O_CREAT | O_EXCL`` (:class:`filelock.SoftFileLock`),
  which is atomic on every POSIX file system, NFS and Lustre without ``flock`` included. A holder
  killed by SIGKILL leaves the file behind: remove it by hand once no writer runs (the timeout
  error says which file).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

#: Seconds a writer waits for another writer of the same path (``DEPSI_LOCK_TIMEOUT``).
LOCK_TIMEOUT = 600.0

#: Lock kinds: ``flock`` (kernel lock, released on death) or ``soft`` (O_EXCL lock file).
LOCK_KINDS = ("flock", "soft")

_held = threading.local()


class StoreLockedError(TimeoutError):
    """Another writer holds the lock of a path for longer than the timeout."""


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of ``path``: its hidden sibling ``.<name>-lock``."""
    path = Path(path).absolute()
    return path.with_name(f".{path.name}-lock")


def _timeout(timeout: float | None) -> float:
    if timeout is not None:
        return float(timeout)
    text = os.environ.get("DEPSI_LOCK_TIMEOUT")
    try:
        return float(text) if text else LOCK_TIMEOUT
    except ValueError:
        raise ValueError(f"DEPSI_LOCK_TIMEOUT: expected seconds, found {text!r}") from None


def _kind(kind: str | None) -> str:
    kind = kind or os.environ.get("DEPSI_LOCK") or "flock"
    if kind not in LOCK_KINDS:
        raise ValueError(f"lock kind (DEPSI_LOCK): expected one of {LOCK_KINDS}, found {kind!r}")
    return kind


@contextmanager
def write_lock(path: str | os.PathLike, *, timeout: float | None = None,
               kind: str | None = None) -> Iterator[Path]:
    """Hold the writer's lock of ``path`` (re-entrant within a thread).

    Parameters
    ----------
    path
        The store or file about to be written; its parent folder is created when missing.
    timeout
        Seconds to wait for another writer; default ``DEPSI_LOCK_TIMEOUT`` or
        :data:`LOCK_TIMEOUT`. 0 fails at once.
    kind
        ``flock`` or ``soft`` (see the module text); default ``DEPSI_LOCK`` or ``flock``.

    Raises
    ------
    StoreLockedError
        Another process (or thread) held the lock for ``timeout`` seconds.

    Examples
    --------
    >>> import tempfile
    >>> with write_lock(tempfile.mkdtemp() + "/ps.zarr", timeout=1) as held:
    ...     held.name
    '.ps.zarr-lock'
    """
    target = Path(path).absolute()
    lock_file = lock_path(target)
    held = _held.__dict__.setdefault("paths", set())
    if lock_file in held:
        yield lock_file
        return
    seconds, kind = _timeout(timeout), _kind(kind)
    target.parent.mkdir(parents=True, exist_ok=True)
    cls = filelock.SoftFileLock if kind == "soft" else filelock.FileLock
    lock = cls(str(lock_file), timeout=seconds)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise StoreLockedError(
            f"lock of {str(target)!r}: expected no other writer, found one holding "
            f"{str(lock_file)!r} for {seconds:g} s; wait for it to finish"
            + (" (a soft lock left by a killed writer: remove the file once no writer runs)"
               if kind == "soft" else "")) from None
    held.add(lock_file)
    try:
        yield lock_file
    finally:
        held.discard(lock_file)
        lock.release()
