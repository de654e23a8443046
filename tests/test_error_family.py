"""Every exception class depsi defines derives from :class:`depsi.errors.DepsiError`, whose
class gives the exit code of ``depsi``; each keeps the builtin base its callers catch."""

from __future__ import annotations

import ast
import errno
import importlib
from pathlib import Path

import pytest

from depsi.errors import (
    BadInputError,
    BusyError,
    DepsiError,
    DiskFullError,
    ExitCode,
    ResourceError,
    SystemFaultError,
    Terminated,
    TooLargeError,
    classify,
)

PACKAGE = Path(__file__).resolve().parents[1] / "depsi"

def _exception_classes() -> list[type[BaseException]]:
    """The exception classes defined in depsi's modules, found by parsing each module and
    importing those that define a class deriving from an ``...Error``/``...Exception`` name."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and any(
            isinstance(base, ast.Name) and base.id.endswith(("Error", "Exception", "Interrupt"))
            for base in node.bases)]
        if not names:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(p for p in parts if p != "__init__"))
        found += [getattr(module, name) for name in names
                  if issubclass(getattr(module, name), BaseException)]
    return found


EXCEPTIONS = _exception_classes()


def test_the_family_is_found_in_every_layer():
    modules = {cls.__module__ for cls in EXCEPTIONS}
    assert {"depsi.errors", "depsi.cluster", "depsi.io.store", "depsi.stm.schema",
            "depsi.pipeline.config", "depsi.pipeline.preflight"} <= modules
    assert len(EXCEPTIONS) >= 20


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_depsi_exception_is_a_depsi_error_with_an_exit_code(cls):
    if cls is Terminated:  # SIGTERM unwinds like Ctrl-C: never caught by `except Exception`
        assert issubclass(cls, KeyboardInterrupt) and not issubclass(cls, Exception)
        return
    assert issubclass(cls, DepsiError), f"{cls.__module__}.{cls.__name__}: not a DepsiError"
    assert isinstance(cls.exit_code, ExitCode)


@pytest.mark.parametrize(("module", "name", "kind", "builtin"), [
    ("depsi.pipeline.config", "ConfigError", BadInputError, ValueError),
    ("depsi.io.bounded", "MetadataError", BadInputError, ValueError),
    ("depsi.io.store", "StoreIntegrityError", BadInputError, ValueError),
    ("depsi.stm.schema", "STMKeyError", BadInputError, KeyError),
    ("depsi.stm.accessor", "UnknownMethodError", BadInputError, NotImplementedError),
    ("depsi.stm.polygons", "UnsupportedPolygonsError", BadInputError, TypeError),
    ("depsi.pipeline.workspace", "PipelineError", BadInputError, RuntimeError),
    ("depsi.pipeline.preflight", "ResourceLimitError", TooLargeError, ValueError),
    ("depsi.cluster", "SchedulerStartError", ResourceError, RuntimeError),
    ("depsi.pipeline.workspace", "WorkspaceBusyError", BusyError, RuntimeError),
    ("depsi.io.lock", "StoreLockedError", BusyError, TimeoutError),
])
def test_each_error_has_its_kind_and_keeps_its_builtin_base(module, name, kind, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, kind) and issubclass(cls, builtin)
    assert cls.exit_code == kind.exit_code


@pytest.mark.parametrize(("error", "code", "start"), [
    (BadInputError("selection.threshold: expected > 0, found -1"), ExitCode.BAD_INPUT,
     "selection.threshold: expected > 0, found -1"),
    (TooLargeError("arcs.height_step: needs 9 bytes"), ExitCode.RESOURCE_LIMIT,
     "refused before any work: arcs.height_step: needs 9 bytes; nothing was written; lower"),
    (ResourceError("workers: 0 of 4 started"), ExitCode.RESOURCE_LIMIT, "workers: 0 of 4"),
    (BusyError("lock of '/ws/ps.zarr' held"), ExitCode.WORKSPACE_BUSY,
     "busy: lock of '/ws/ps.zarr' held; "),
    (DiskFullError(errno.ENOSPC, "No space left on device", "/ws/points.gpkg"),
     ExitCode.DISK_FULL, "disk full (ENOSPC: No space left on device) at '/ws/points.gpkg'"),
    (SystemFaultError(errno.ENOLCK, "No locks available", "/ws/.ps.zarr-lock"),
     ExitCode.SYSTEM_ERROR, "system error (ENOLCK"),
])
def test_classify_decides_by_the_class(error, code, start):
    got, message = classify(error, workspace="/ws", config="run.yaml")
    assert got == code and message.startswith(start) and "\n" not in message


def test_the_words_of_a_message_do_not_change_its_code():
    from depsi.pipeline.workspace import PipelineError, WorkspaceBusyError

    assert classify(PipelineError("workspace '/ws' is in use by run pid 7"))[0] == \
        ExitCode.BAD_INPUT
    assert classify(WorkspaceBusyError("another run holds it"))[0] == ExitCode.WORKSPACE_BUSY


def test_a_bad_input_error_raised_from_undecodable_text_suggests_the_encoding():
    try:
        try:
            "Zoë".encode("cp1252").decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadInputError("input.path: 'stack.res' is not UTF-8") from err
    except BadInputError as error:
        code, message = classify(error)
    assert code == ExitCode.BAD_INPUT
    assert message.startswith("input.path: 'stack.res' is not UTF-8; expected UTF-8, this "
                              "looks like WINDOWS-1252")
