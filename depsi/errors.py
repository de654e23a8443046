"""Exit codes of the ``depsi`` command, depsi's own exceptions, and the one line each kind of
failure is reported as.

Every exception class depsi defines derives from :class:`DepsiError`, whose class attribute
``exit_code`` is the code ``depsi`` exits with (builtin errors, depsi's own ``ValueError`` checks
among them, are classified by their type): :class:`BadInputError` (2),
:class:`DiskFullError` (3), :class:`ResourceError` (6; :class:`TooLargeError` for work refused
before it starts), :class:`BusyError` (7) and :class:`SystemFaultError` (8). Each also keeps
the builtin base its callers catch (``ConfigError`` is a ``ValueError``, ``StoreLockedError`` a
``TimeoutError``).

:func:`classify` turns an exception into ``(code, message)``: what happened, where (the paths of
the error), what is still intact, and how to go on. ``depsi`` logs the message as one ERROR line
(and into the workspace's ``depsi.log`` for ``depsi run``) and exits with the code:

==== ===================== ========================================================================
code name                  when
==== ===================== ========================================================================
0    ``OK``                the command finished
1    ``INTERNAL_ERROR``    an unexpected exception: a bug in depsi; the traceback is kept, report it
2    ``BAD_INPUT``         bad configuration or input: a :class:`BadInputError` (``ConfigError``,
                           ``MetadataError``, ``StoreIntegrityError``, ``PipelineError``, ...)
                           or ``ValueError``, a missing input (``FileNotFoundError``), an
                           existing output (``FileExistsError``), a path through a file
                           (``NotADirectoryError``), text that is not UTF-8, a missing optional
                           package (``ImportError``)
3    ``DISK_FULL``         no space left or disk quota exceeded (``ENOSPC``, ``EDQUOT``;
                           :class:`DiskFullError`)
4    ``PERMISSION_DENIED`` permission denied or a read-only file system (``EACCES``, ``EPERM``,
                           ``EROFS``)
5    ``INTERRUPTED``       Ctrl-C (``SIGINT``) or ``SIGTERM`` (``scancel``, a job's walltime)
6    ``RESOURCE_LIMIT``    work refused before it starts because it would not fit the machine
                           (a :class:`TooLargeError`: ``ResourceLimitError``), or not enough
                           memory or another resource (a :class:`ResourceError`:
                           ``SchedulerStartError``, the scheduler's workers not starting;
                           ``MemoryError``, ``ENOMEM``, too many open files, ``EMFILE``,
                           ``ENFILE``)
7    ``WORKSPACE_BUSY``    another run holds the workspace, or another writer a store's lock
                           (a :class:`BusyError`: ``WorkspaceBusyError``, ``StoreLockedError``;
                           or ``TimeoutError``)
8    ``SYSTEM_ERROR``      any other error of the operating system (``EIO``, ``ESTALE``, ...;
                           :class:`SystemFaultError`)
==== ===================== ========================================================================

Every product is written to a temporary sibling and moved into place when complete, so after
any of these a product under its name is complete, and ``depsi run CONFIG --resume`` continues
after the last complete one.

Examples
--------
>>> import errno
>>> code, message = classify(OSError(errno.ENOSPC, "No space left on device", "/ws/ps.zarr"),
...                          workspace="/ws", config="run.yaml")
>>> code
<ExitCode.DISK_FULL: 3>
>>> message.startswith("disk full (ENOSPC: No space left on device) at '/ws/ps.zarr'")
True
>>> message.endswith("free space on that file system (or set output.workspace to a larger "
...                  "file system) and run `depsi run run.yaml --resume`")
True
"""

from __future__ import annotations

import errno
import os
import re
import shlex
from enum import IntEnum
from pathlib import Path
from typing import ClassVar


class ExitCode(IntEnum):
    """Exit status of ``depsi``, one per kind of fault (table in the module docstring)."""

    OK = 0
    INTERNAL_ERROR = 1
    BAD_INPUT = 2
    DISK_FULL = 3
    PERMISSION_DENIED = 4
    INTERRUPTED = 5
    RESOURCE_LIMIT = 6
    WORKSPACE_BUSY = 7
    SYSTEM_ERROR = 8


#: One line per exit code, for ``depsi --help``.
EXIT_CODE_MEANINGS = {
    ExitCode.OK: "finished",
    ExitCode.INTERNAL_ERROR: "internal error, a bug (traceback kept): please report it",
    ExitCode.BAD_INPUT: "bad configuration or input (a key, a value, a missing or "
                        "existing file)",
    ExitCode.DISK_FULL: "disk full or quota exceeded (ENOSPC, EDQUOT)",
    ExitCode.PERMISSION_DENIED: "permission denied or read-only file system (EACCES, EPERM, "
                                "EROFS)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM)",
    ExitCode.RESOURCE_LIMIT: "refused before work as too large for the machine, or out of "
                             "memory, open files or workers",
    ExitCode.WORKSPACE_BUSY: "workspace or store in use by another run (lock held)",
    ExitCode.SYSTEM_ERROR: "other operating-system error (EIO, ...)",
}


def exit_codes_help() -> str:
    """The exit code table as the epilog of ``depsi --help``."""
    lines = ["exit codes:"]
    lines += [f"  {int(code)}  {meaning}" for code, meaning in EXIT_CODE_MEANINGS.items()]
    lines.append("After codes 3-8 the products finished before are intact: fix the cause and "
                 "run\n`depsi run CONFIG --resume`.")
    return "\n".join(lines)


class Terminated(KeyboardInterrupt):
    """``SIGTERM`` received (``scancel``, a job's walltime): unwinds like Ctrl-C."""


# ------------------------------------------------------------------------- depsi's exceptions
class DepsiError(Exception):
    """Base of the exception classes of depsi; ``exit_code`` is what ``depsi`` exits with.

    A subclass names its kind (:class:`BadInputError`, :class:`TooLargeError`, ...) and keeps
    the builtin base its callers catch, e.g. ``class ConfigError(BadInputError, ValueError)``.
    Its report (:func:`classify`) is ``heading: message``, then, where ``advice`` is set, what
    stays intact and the advice followed by how to go on.

    Examples
    --------
    >>> class StackTooShort(BadInputError, ValueError):
    ...     pass
    >>> classify(StackTooShort("input.path: expected 3 epochs, found 2"))
    (<ExitCode.BAD_INPUT: 2>, 'input.path: expected 3 epochs, found 2')
    """

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL_ERROR
    #: Words before the message in the one-line report ("" for none).
    heading: ClassVar[str] = ""
    #: What to do before running again ("" when the message says it already).
    advice: ClassVar[str] = ""


class BadInputError(DepsiError):
    """Bad configuration or input: a key, a value, a file missing or contradicting another."""

    exit_code = ExitCode.BAD_INPUT


class ResourceError(DepsiError):
    """Not enough memory, workers or another resource of the machine for the work."""

    exit_code = ExitCode.RESOURCE_LIMIT


class TooLargeError(ResourceError):
    """Work refused before it starts because it would not fit the machine; nothing is written."""

    heading = "refused before any work"
    advice = "lower the key named or run where more memory is available"


class BusyError(DepsiError):
    """Another run holds the workspace, or another writer the lock of a store."""

    exit_code = ExitCode.WORKSPACE_BUSY
    heading = "busy"
    advice = "once the other run has finished (or with a larger DEPSI_LOCK_TIMEOUT),"


class DiskFullError(DepsiError, OSError):
    """No space left or quota exceeded, found by depsi in a driver's own error; an ``OSError``
    with ``errno`` ``ENOSPC`` or ``EDQUOT`` and the file being written as ``filename``."""

    exit_code = ExitCode.DISK_FULL


class SystemFaultError(DepsiError, OSError):
    """An operating-system fault that is neither a full disk nor a permission (``EIO``, a file
    system without a feature depsi needs); an ``OSError`` with its ``errno``."""

    exit_code = ExitCode.SYSTEM_ERROR


#: errno values of each kind of fault.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
RESOURCE_ERRNOS = frozenset({errno.ENOMEM, errno.EMFILE, errno.ENFILE})
BAD_PATH_ERRNOS = frozenset({errno.ENOENT, errno.EEXIST, errno.ENOTDIR, errno.EISDIR,
                             errno.ENAMETOOLONG, errno.ELOOP})

#: A temporary sibling in a path (``.ps.zarr.writing-1f2e3d4c``; :mod:`depsi.io.paths`).
_SIBLING = re.compile(r"^\.(?P<product>.+?)\.(?:writing|replaced|tmp)-[0-9a-f]{8}")

#: Encodings to suggest for text that is not UTF-8, tried in this order.
_LIKELY_ENCODINGS = ("WINDOWS-1252", "ISO-8859-1")


def classify(exc: BaseException, *, workspace: str | os.PathLike | None = None,
             config: str | os.PathLike | None = None) -> tuple[ExitCode, str]:
    """The exit code of an exception and the one line that explains it.

    Parameters
    ----------
    exc
        The exception that ended the command.
    workspace
        The workspace of ``depsi run`` (named as the place whose products stay intact).
    config
        The configuration file of ``depsi run`` (for the ``--resume`` advice).

    Returns
    -------
    tuple of (ExitCode, str)
        The code (module docstring's table) and a message of one line: what happened, where,
        what is intact, and how to go on.
    """
    context = _Context(Path(workspace) if workspace is not None else None,
                       Path(config) if config is not None else None)
    for kind in (_interrupted, _depsi_error, _busy, _os_error, _unicode, _resource, _bad_input):
        found = kind(exc, context)
        if found is not None:
            return found
    cause = _known_cause(exc)
    if cause is not None:
        return classify(cause, workspace=workspace, config=config)
    return ExitCode.INTERNAL_ERROR, _internal(exc, context)


class _Context:
    def __init__(self, workspace: Path | None, config: Path | None):
        self.workspace, self.config = workspace, config

    def intact(self) -> str:
        if self.workspace is not None and self.workspace.is_dir():
            return (f"products finished before stay intact in {self.workspace}; nothing was "
                    "half-written under a product's name")
        return ("nothing was half-written under its name (depsi writes to a temporary sibling "
                "and moves it into place when complete)")

    def resume_command(self) -> str:
        return f"`depsi run {shlex.quote(str(self.config))} --resume`"

    def go_on(self, first: str) -> str:
        if self.config is not None:
            return f"{first} and run {self.resume_command()}"
        return f"{first} and run the command again"

    def in_workspace(self, path: str | None) -> bool:
        if path is None or self.workspace is None:
            return path is None and self.workspace is not None
        try:
            return Path(os.path.abspath(path)).is_relative_to(self.workspace.absolute())
        except (TypeError, ValueError):
            return False


def _paths(exc: OSError) -> list[str]:
    return [os.fsdecode(p) for p in (exc.filename, exc.filename2) if p not in (None, "")]


def _where(exc: OSError) -> str:
    """`` at 'PATH'`` (``'A' -> 'B'`` for a rename), naming the product of a temporary sibling."""
    paths = _paths(exc)
    if not paths:
        return ""
    text = " at " + " -> ".join(repr(p) for p in paths)
    for part in Path(paths[0]).parts:
        match = _SIBLING.match(part)
        if match:
            return f"{text} (while writing {match['product']})"
    return text


def _errno_text(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{name}: {reason}" if name else reason


def _interrupted(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    if not isinstance(exc, KeyboardInterrupt):
        return None
    what = ("terminated by SIGTERM (scancel or the job's walltime)" if isinstance(exc, Terminated)
            else "interrupted by Ctrl-C (SIGINT)")
    then = (f"run {context.resume_command()} to continue after the last complete product"
            if context.config is not None else "run the command again")
    return ExitCode.INTERRUPTED, (
        f"{what}: {context.intact()}; the step that was running left at most a temporary "
        f"sibling, removed by the next run; {then}")


def _depsi_error(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    """An exception of depsi: its class gives the code and the form of its line."""
    if not isinstance(exc, DepsiError):
        return None
    if isinstance(exc, OSError):  # its line names errno and path as the operating system's do
        return exc.exit_code, _os_error_line(exc, context)[1]
    line = _one_line(exc)
    if exc.heading:
        line = f"{exc.heading}: {line}"
    decode_error = _decode_cause(exc)
    if decode_error is not None:
        line += "; " + _encoding_advice(decode_error, _decode_error_file(decode_error))
    if not exc.advice:
        return exc.exit_code, line
    intact = "nothing was written" if isinstance(exc, TooLargeError) else context.intact()
    return exc.exit_code, f"{line}; {intact}; " + context.go_on(exc.advice)


def _busy(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    """A ``TimeoutError`` of another package: a lock held by another writer."""
    if not isinstance(exc, TimeoutError):
        return None
    return ExitCode.WORKSPACE_BUSY, (
        f"{BusyError.heading}: {_one_line(exc)}; {context.intact()}; "
        + context.go_on(BusyError.advice))


def _os_error(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    """An ``OSError`` by its ``errno`` (a ``TimeoutError`` is :func:`_busy`'s)."""
    if not isinstance(exc, OSError) or isinstance(exc, TimeoutError):
        return None
    return _os_error_line(exc, context)


def _os_error_line(exc: OSError, context: _Context) -> tuple[ExitCode, str]:
    code = exc.errno
    paths = _paths(exc)
    where = _where(exc)
    if code in DISK_FULL_ERRNOS:
        what = "disk full" if code == errno.ENOSPC else "disk quota exceeded"
        first = ("free space on that file system" if code == errno.ENOSPC
                 else "free space within your quota (or ask for a larger one)")
        if context.workspace is not None:
            first += " (or set output.workspace to a larger file system)"
        return ExitCode.DISK_FULL, (f"{what} ({_errno_text(exc)}){where}: {context.intact()}; "
                                    + context.go_on(first))
    if isinstance(exc, PermissionError) or code in PERMISSION_ERRNOS:
        what = ("read-only file system" if code == errno.EROFS else "permission denied")
        target = paths[0] if paths else None
        if context.in_workspace(target) or (target is None and context.workspace is not None):
            first = (f"make {context.workspace} writable for this user or set output.workspace "
                     "to a folder you can write")
        elif target is not None:
            first = f"make {target!r} accessible to this user (or choose another path)"
        else:
            first = "give this user access to the path"
        return ExitCode.PERMISSION_DENIED, (f"{what} ({_errno_text(exc)}){where}: "
                                            f"{context.intact()}; " + context.go_on(first))
    if code in RESOURCE_ERRNOS:
        first = ("raise the open-file limit (ulimit -n) or use fewer threads"
                 if code != errno.ENOMEM else "give the run more memory or use fewer threads")
        return ExitCode.RESOURCE_LIMIT, (f"out of a resource ({_errno_text(exc)}){where}: "
                                         f"{context.intact()}; " + context.go_on(first))
    if isinstance(exc, (FileNotFoundError, FileExistsError, NotADirectoryError,
                        IsADirectoryError)) or code in BAD_PATH_ERRNOS:
        return ExitCode.BAD_INPUT, _bad_path(exc, paths, context)
    return ExitCode.SYSTEM_ERROR, (
        f"system error ({_errno_text(exc)}){where}: {context.intact()}; "
        + context.go_on("check the file system and the device (dmesg)"))


def _bad_path(exc: OSError, paths: list[str], context: _Context) -> str:
    message = _one_line(exc)
    if isinstance(exc, NotADirectoryError) and paths:
        advice = (f"a part of {paths[0]!r} is a file, not a folder: choose a path whose "
                  "parents are folders"
                  + (" (output.workspace)" if context.in_workspace(paths[0]) else ""))
        return f"not a folder ({_errno_text(exc)}){_where(exc)}: {advice}"
    return message


def _unicode(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    """Text that is not UTF-8: a ``UnicodeDecodeError``, or a ``ValueError`` raised from one."""
    decode_error = exc if isinstance(exc, UnicodeDecodeError) else None
    if decode_error is None and isinstance(exc, ValueError):
        decode_error = _decode_cause(exc)  # under a reader's own message, which names the file
    if decode_error is None:
        return None
    path = _decode_error_file(decode_error)
    advice = _encoding_advice(decode_error, path)
    if decode_error is not exc:
        return ExitCode.BAD_INPUT, f"{_one_line(exc)}; {advice}"
    where = f" in {path!r}" if path else ""
    return ExitCode.BAD_INPUT, (
        f"not UTF-8 text{where}: byte {_hex(decode_error)} at offset {decode_error.start}"
        f"{_of_what(decode_error, path)} ({decode_error.reason}); {advice}")


def _decode_cause(exc: BaseException) -> UnicodeDecodeError | None:
    inner = exc.__cause__ or exc.__context__
    return inner if isinstance(inner, UnicodeDecodeError) else None


def _decode_error_file(exc: UnicodeDecodeError) -> str | None:
    """The file a reader named: ``exc.filename``, or a note ``file: PATH`` (``add_note``)."""
    name = getattr(exc, "filename", None)
    if name:
        return os.fsdecode(name)
    for note in getattr(exc, "__notes__", ()):
        if note.startswith("file: "):
            return note[len("file: "):]
    return None


def _hex(exc: UnicodeDecodeError) -> str:
    return " ".join(f"0x{b:02x}" for b in exc.object[exc.start:min(exc.end, exc.start + 4)])


def _of_what(exc: UnicodeDecodeError, path: str | None) -> str:
    """The offset is the file's only when the whole file was decoded at once."""
    try:
        whole = path is not None and os.path.getsize(path) == len(exc.object)
    except OSError:
        whole = False
    return "" if whole else " of the bytes being decoded"


def _encoding_advice(exc: UnicodeDecodeError, path: str | None) -> str:
    data = bytes(exc.object)
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        guess = "UTF-16"
    else:
        guess = next(name for name in _LIKELY_ENCODINGS if _decodes(data, name))
    file = shlex.quote(path) if path else "FILE"
    return (f"expected UTF-8, this looks like {guess}: save it as UTF-8 (iconv -f {guess} -t "
            f"UTF-8 {file} > {file}.utf8)")


def _decodes(data: bytes, encoding: str) -> bool:
    try:
        data.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def _resource(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    """A ``MemoryError``: its own words when it has some."""
    if not isinstance(exc, MemoryError):
        return None
    what = _one_line(exc) if str(exc) else "out of memory (MemoryError)"
    return ExitCode.RESOURCE_LIMIT, (
        f"{what}: {context.intact()}; "
        + context.go_on("give the run more memory (a larger job, compute.memory_limit) or "
                        "use fewer threads or smaller chunks"))


def _bad_input(exc: BaseException, context: _Context) -> tuple[ExitCode, str] | None:
    """A ``ValueError`` (a reader's own check) or an ``ImportError`` (an optional package)."""
    if isinstance(exc, (ValueError, ImportError)):
        return ExitCode.BAD_INPUT, _one_line(exc)
    return None


def _known_cause(exc: BaseException) -> BaseException | None:
    """An OS or memory error under a wrapper (``raise X from err``) that would be a bug."""
    seen = {id(exc)}
    inner = exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen:
        if isinstance(inner, (OSError, MemoryError)):
            return inner
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    return None


def _internal(exc: BaseException, context: _Context) -> str:
    log = f" and {context.workspace / 'depsi.log'}" if context.workspace is not None else ""
    return (f"internal error {type(exc).__name__}: {_one_line(exc)}: this is a bug in depsi "
            f"{_version()}, please report it with the traceback below{log}; {context.intact()}")


def _one_line(exc: BaseException) -> str:
    """The message on one line: its lines joined by "; " (a heading ending in ":" by a space),
    so that several problems stay apart."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    for previous, line in zip(lines, lines[1:]):
        text += (" " if previous.endswith(":") else "; ") + line
    return text


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("depsi")
    except PackageNotFoundError:
        return "(not installed)"
