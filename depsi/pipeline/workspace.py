"""The workspace of ``depsi run``: its lock (one run at a time), its log file, the heartbeat of
long steps and the removal of what an interrupted run left."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from depsi.errors import BadInputError, BusyError
from depsi.io.lock import write_lock
from depsi.io.store import recover_interrupted
from depsi.pipeline.manifest import write_json_atomic

logger = logging.getLogger(__name__)
#: The run summary goes to the workspace log file only (not to the console's handlers).
SUMMARY_LOGGER = logging.getLogger("depsi.run_summary")
SUMMARY_LOGGER.propagate = False

#: Name of the log file written in the workspace.
LOG_FILE = "depsi.log"
#: Name of the lock file that keeps two runs out of one workspace.
LOCK_FILE = "depsi.lock"


class PipelineError(BadInputError, RuntimeError):
    """The pipeline cannot run as asked (missing earlier product, bad range)."""


class WorkspaceBusyError(BusyError, PipelineError):
    """Another live run holds the workspace's lock; the message names its pid and the lock."""

    heading = "workspace busy"
    advice = ""  # the message says to wait or to remove a lock whose run is gone


#: Seconds between the "still running" lines of a long step.
HEARTBEAT_SECONDS = 30.0


@contextmanager
def heartbeat(what: str, every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Log ``<what>: still running (N s)`` every ``every`` seconds until the block ends, so a
    redirected log (no progress bars) shows that a long step is alive."""
    done = threading.Event()
    began = time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            logger.info("%s: still running (%.0f s)", what, time.perf_counter() - began)

    thread = threading.Thread(target=beat, name="depsi-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()



def remove_stale_temporaries(workspace: Path, products: list[str],
                             records: list[str]) -> None:
    """Temporary siblings (``.<product>.writing-*``, ...) left by an interrupted run.

    Products are recovered under their writer's lock (a product set aside by a killed replace
    comes back, a killed append is finished or rolled back); other leftovers are removed.
    """
    for product in products:
        with write_lock(workspace / product):
            recover_interrupted(workspace / product)
    for name in records:
        for stale in glob.glob(str(workspace / f".{glob.escape(name)}.*")):
            logger.warning("removing %s, left by an interrupted run (never used as a product)",
                           stale)
            stale_path = Path(stale)
            if stale_path.is_dir():
                shutil.rmtree(stale_path, ignore_errors=True)
            else:
                stale_path.unlink(missing_ok=True)
    for temporary in workspace.glob(".*.tmp-*"):  # write_stack_zarr's temporary stores
        logger.warning("removing %s, left by an interrupted run", temporary)
        shutil.rmtree(temporary, ignore_errors=True)


@contextmanager
def workspace_lock(workspace: Path) -> Iterator[None]:
    """Keep a second run out of a workspace while one runs (stale locks of dead runs go)."""
    lock = workspace / LOCK_FILE
    host = socket.gethostname()
    with write_lock(lock, timeout=30):  # two runs starting at once: one reads, then writes
        try:
            holder = json.loads(lock.read_text())
        except (OSError, ValueError):
            holder = None
        if holder and holder.get("host") == host and _pid_alive(int(holder.get("pid", -1))):
            raise WorkspaceBusyError(
                f"workspace {str(workspace)!r} is in use by run pid {holder['pid']} (lock "
                f"{lock}); wait for it, or remove the lock if it is gone")
        if holder and holder.get("host") != host:
            logger.warning("workspace lock %s was left by a run on host %s; taking it over",
                           lock, holder.get("host"))
        write_json_atomic(lock, {"pid": os.getpid(), "host": host, "started": time.time()})
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0 or pid == os.getpid():
        return pid == os.getpid()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def log_to_file(path: Path) -> Iterator[None]:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    package = logging.getLogger("depsi")
    old_level = package.level
    if package.getEffectiveLevel() > logging.INFO:
        package.setLevel(logging.INFO)
    package.addHandler(handler)
    SUMMARY_LOGGER.addHandler(handler)
    SUMMARY_LOGGER.setLevel(logging.INFO)
    try:
        yield
    finally:
        SUMMARY_LOGGER.removeHandler(handler)
        package.removeHandler(handler)
        package.setLevel(old_level)
        handler.close()
