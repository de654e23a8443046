"""One writer at a time: an inter-process lock beside every path depsi writes.

Every write path (``save_stm``, ``append_epochs``, the exports, the pipeline's products) holds
:func:`write_lock` on its target while it writes, so two processes never interleave their
writes to one store. The lock is a hidden sibling file ``.<name>-lock`` that exists only while
a writer holds it; a second writer waits up to ``timeout`` seconds and then raises
:class:`StoreLockedError`.

Two kinds of lock (``DEPSI_LOCK`` in the environment, or ``kind=``):

- ``flock`` (default): ``fcntl.flock`` on the lock file. The kernel releases it when the holder
  dies, even by SIGKILL. Local file systems, and Lustre/GPFS/NFSv4 mounted with working
  ``flock`` (Lustre: ``-o flock``); where the file system says it has no ``flock``, the lock
  falls back to the soft kind by itself. The holder removes the file before it unlocks, and an
  acquirer counts its lock only if the file it locked is still the one at the path (same
  inode), else it retries: a waiter on a removed file never becomes a second holder.
- ``soft``: the lock file is created with ``O_CREAT | O_EXCL`` (:class:`filelock.SoftFileLock`),
  which is atomic on every POSIX file system, NFS and Lustre without ``flock`` included. A holder
  killed by SIGKILL leaves the file behind: remove it by hand once no writer runs (the timeout
  error says which file).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from depsi.errors import BusyError, SystemFaultError

try:
    import fcntl
except ImportError:  # Windows: filelock's msvcrt lock, which removes its file itself
    fcntl = None  # type: ignore[assignment]  # no module here: tested before use

logger = logging.getLogger(__name__)

#: Seconds a writer waits for another writer of the same path (``DEPSI_LOCK_TIMEOUT``).
LOCK_TIMEOUT = 600.0

#: Lock kinds: ``flock`` (kernel lock, released on death) or ``soft`` (O_EXCL lock file).
LOCK_KINDS = ("flock", "soft")

#: Seconds between two tries of a busy lock (filelock's default).
POLL_SECONDS = 0.05

#: ``flock`` errors that mean "this file system has no flock": use the soft kind there.
_NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP)

_held = threading.local()


class StoreLockedError(BusyError, TimeoutError):
    """Another writer holds the lock of a path for longer than the timeout."""


class _NoFlock(SystemFaultError):
    """The file system of the lock file has no ``flock``."""


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


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _open_lock_file(lock_file: Path) -> tuple[int, bool] | None:
    """An open descriptor of the lock file and whether we created it (None: gone meanwhile)."""
    try:
        return os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        pass
    try:
        return os.open(lock_file, os.O_RDWR), False
    except FileNotFoundError:  # its holder removed it between our two opens
        return None


def _try_flock(lock_file: Path) -> int | None:
    """The descriptor of the lock file when we now hold it, None when it is busy.

    The lock counts only if the inode we locked is still the one at the path: a holder removes
    the file while holding it, so a waiter that opened it before gets a lock on a file nobody
    else will ever lock again, and must try anew on the path's new file.
    """
    opened = _open_lock_file(lock_file)
    if opened is None:
        return None
    fd, created = opened
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        current = os.stat(lock_file)
    except BlockingIOError:
        os.close(fd)
        return None
    except FileNotFoundError:  # locked, but its holder had removed it: not the lock any more
        os.close(fd)
        return None
    except OSError as err:
        os.close(fd)
        if err.errno in _NO_FLOCK:
            if created:  # our probe, not another writer's soft lock
                lock_file.unlink(missing_ok=True)
            raise _NoFlock(err.errno, err.strerror, str(lock_file)) from None
        raise
    except BaseException:
        os.close(fd)
        raise
    if not _same_file(current, os.fstat(fd)):
        os.close(fd)  # a holder removed this file after we opened it; the path has a new one
        return None
    return fd


def _acquire_flock(lock_file: Path, seconds: float) -> int:
    """Hold ``flock`` on the lock file (see :func:`_try_flock`); its descriptor."""
    deadline = time.monotonic() + seconds
    while True:
        fd = _try_flock(lock_file)
        if fd is not None:
            return fd
        if time.monotonic() >= deadline:
            raise filelock.Timeout(str(lock_file))
        time.sleep(POLL_SECONDS)


def _release_flock(lock_file: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then unlock: nothing stays behind."""
    try:
        try:
            if _same_file(os.stat(lock_file), os.fstat(fd)):
                lock_file.unlink()
        except FileNotFoundError:
            pass
    finally:
        os.close(fd)  # closing the last descriptor drops the flock


def _acquire(lock_file: Path, seconds: float, kind: str) -> Callable[[], None]:
    """Take the lock file of one kind; the function that releases it (and removes the file)."""
    if kind == "flock" and fcntl is not None:
        try:
            fd = _acquire_flock(lock_file, seconds)
        except _NoFlock:
            logger.warning("%s: the file system has no flock; using a soft lock", lock_file)
        else:
            return lambda: _release_flock(lock_file, fd)
    cls = filelock.FileLock if kind == "flock" else filelock.SoftFileLock
    lock = cls(str(lock_file), timeout=seconds)
    lock.acquire()
    return lock.release  # SoftFileLock (and FileLock on Windows) remove the file


@contextmanager
def write_lock(path: str | os.PathLike, *, timeout: float | None = None,
               kind: str | None = None) -> Iterator[Path]:
    """Hold the writer's lock of ``path`` (re-entrant within a thread).

    The lock file ``.<name>-lock`` exists while the lock is held and is removed on release,
    also when the block raises.

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
    ...     held.name, held.exists()
    ('.ps.zarr-lock', True)
    >>> held.exists()
    False
    """
    target = Path(path).absolute()
    lock_file = lock_path(target)
    held = _held.__dict__.setdefault("paths", set())
    if lock_file in held:
        yield lock_file
        return
    seconds, kind = _timeout(timeout), _kind(kind)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        release = _acquire(lock_file, seconds, kind)
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
        release()
