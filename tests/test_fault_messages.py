"""Faults reported as one clear line and an exit code (:mod:`depsi.errors`).

Each ``depsi run`` below fails in the network step, after the stack and selection products are
finished: the console gets exactly one ERROR line naming the path and what to do, no traceback
(only a bug, exit 1, keeps one), the same line ends the workspace's ``depsi.log``, the finished
products are untouched, and ``depsi run --resume`` afterwards succeeds without redoing them.

The tests run as root, where a 0o555 folder is still writable: a read-only or full disk is
simulated by raising the operating system's error inside the store writer.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import depsi.io.store as store
import depsi.pipeline.steps.network as network
from depsi.cli import main
from depsi.errors import EXIT_CODE_MEANINGS, ExitCode, classify
from depsi.pipeline.runner import manifest_path

SIMULATE = {"shape": [40, 40], "n_epochs": 8, "seed": 1}
FINISHED = ("stack", "selection")


def write_config(folder: Path, workspace: Path) -> Path:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump({"input": {"simulate": dict(SIMULATE)},
                                    "output": {"workspace": str(workspace), "exports": []}}))
    return path


@pytest.fixture(scope="module")
def selected(tmp_path_factory) -> Path:
    """A workspace whose stack and selection steps have finished."""
    folder = tmp_path_factory.mktemp("selected")
    workspace = folder / "ws"
    assert main(["run", str(write_config(folder, workspace)), "--to", "selection",
                 "--no-progress"]) == 0
    return workspace


@pytest.fixture
def run(tmp_path, selected):
    """A copy of the finished workspace and its config: ``run(*options)`` is ``depsi run
    --resume``, which finds the stack and selection finished and goes on with the network."""
    workspace = tmp_path / "ws"
    shutil.copytree(selected, workspace)
    config = write_config(tmp_path, workspace)

    def depsi_run(*options: str) -> int:
        return main(["run", str(config), "--no-progress", "--resume", *options])

    depsi_run.workspace, depsi_run.config = workspace, config
    return depsi_run


def the_error_line(text: str, *expected: str, traceback: bool = False) -> str:
    """The one ERROR line of ``text``, holding each of ``expected``."""
    lines = [line for line in text.splitlines() if " ERROR " in line]
    assert len(lines) == 1, text
    for part in expected:
        assert part in lines[0], (part, lines[0])
    assert ("Traceback" in text) is traceback, text
    return lines[0]


def finished_products(workspace: Path) -> dict[str, tuple[str, int]]:
    """Manifest text and product mtime of each finished step."""
    products = {"stack": "stack.zarr", "selection": "ps.zarr"}
    return {step: (manifest_path(workspace, step).read_text(),
                   (workspace / products[step]).stat().st_mtime_ns) for step in FINISHED}


def assert_resumes(run, before: dict, *options: str) -> None:
    """``depsi run --resume`` succeeds, skipping the finished steps and leaving no temporary."""
    assert run(*options) == 0
    assert finished_products(run.workspace) == before
    last_run = (run.workspace / "depsi.log").read_text().rsplit("depsi run: steps", 1)[-1]
    for step in FINISHED:
        assert f"step {step}: skipped" in last_run, step
    assert not list(run.workspace.glob(".*.writing-*"))


def fail_when_writing(monkeypatch, product: str, error) -> None:
    """``error(tmp)`` raised once ``product``'s chunks are in its temporary sibling."""
    consolidate = store.consolidate_metadata

    def failing(tmp):
        if product in Path(tmp).name:
            raise error(Path(tmp))
        consolidate(tmp)

    monkeypatch.setattr(store, "consolidate_metadata", failing)


def raise_in_network_step(monkeypatch, error: BaseException) -> None:
    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(network, "run", failing)


# ------------------------------------------------------------------------------ disk and rights
def test_disk_full_while_writing_a_product_exits_3_naming_it(run, console, monkeypatch):
    before = finished_products(run.workspace)
    fail_when_writing(monkeypatch, "network.zarr", lambda tmp: OSError(
        errno.ENOSPC, "No space left on device", str(tmp / "zarr.json")))
    assert run() == ExitCode.DISK_FULL
    line = the_error_line(console(), "disk full (ENOSPC", "while writing network.zarr",
                          f"{run.workspace}/.network.zarr.writing-",
                          f"products finished before stay intact in {run.workspace}",
                          "free space on that file system", f"depsi run {run.config} --resume")
    assert (run.workspace / "depsi.log").read_text().rstrip().endswith(line.split(" ERROR ")[1])
    assert not (run.workspace / "network.zarr").exists()
    monkeypatch.undo()
    assert_resumes(run, before, "--to", "network")


def test_a_workspace_turned_read_only_mid_run_exits_4_naming_both_paths(run, console,
                                                                       monkeypatch):
    before = finished_products(run.workspace)

    def read_only(tmp, path):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp), None, str(path))

    monkeypatch.setattr(store, "move_into_place", read_only)
    assert run() == ExitCode.PERMISSION_DENIED
    the_error_line(console(), "read-only file system (EROFS",
                   f"-> '{run.workspace / 'network.zarr'}'",
                   f"make {run.workspace} writable for this user or set output.workspace",
                   "--resume")
    monkeypatch.undo()
    assert_resumes(run, before, "--to", "network")


def test_permission_denied_on_a_product_exits_4(run, console, monkeypatch):
    before = finished_products(run.workspace)
    fail_when_writing(monkeypatch, "network.zarr", lambda tmp: PermissionError(
        errno.EACCES, "Permission denied", str(tmp / "edge")))
    assert run() == ExitCode.PERMISSION_DENIED
    the_error_line(console(), "permission denied (EACCES", "while writing network.zarr",
                   f"make {run.workspace} writable", "--resume")
    monkeypatch.undo()
    assert_resumes(run, before, "--to", "network")


def test_a_workspace_that_cannot_be_created_exits_4_without_a_log(tmp_path, console,
                                                                 monkeypatch):
    workspace = tmp_path / "new" / "ws"
    config = write_config(tmp_path, workspace)
    mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if self == workspace:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", denied)
    assert main(["run", str(config), "--no-progress"]) == ExitCode.PERMISSION_DENIED
    the_error_line(console(), f"permission denied (EACCES: Permission denied) at "
                   f"'{workspace}'", "set output.workspace to a folder you can write")
    assert not workspace.exists()


def test_a_workspace_under_a_file_exits_2_saying_so(tmp_path, console):
    (tmp_path / "results").write_text("a file, not a folder")
    workspace = tmp_path / "results" / "ws"
    config = write_config(tmp_path, workspace)
    assert main(["run", str(config), "--no-progress"]) == ExitCode.BAD_INPUT
    the_error_line(console(), "not a folder (ENOTDIR", f"'{workspace}'",
                   "is a file, not a folder", "(output.workspace)")


# ---------------------------------------------------------------------------- interruptions
@pytest.mark.slow
def test_ctrl_c_inside_a_step_exits_5_and_the_rest_resumes(run, console, monkeypatch):
    before = finished_products(run.workspace)
    raise_in_network_step(monkeypatch, KeyboardInterrupt())
    assert run() == ExitCode.INTERRUPTED
    line = the_error_line(console(), "interrupted by Ctrl-C (SIGINT)",
                          f"products finished before stay intact in {run.workspace}",
                          f"run `depsi run {run.config} --resume` to continue")
    assert line.split(" ERROR ")[1] in (run.workspace / "depsi.log").read_text()
    assert not (run.workspace / "depsi.lock").exists()
    monkeypatch.undo()
    assert_resumes(run, before)  # the whole chain, to the end
    assert manifest_path(run.workspace, "export").exists()


#: ``depsi run`` that stalls inside the network step, touching a flag file first.
_STALLING_RUN = """
import pathlib, sys, time
import depsi.pipeline.steps.network as network
def stall(*args, **kwargs):
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(600)
network.run = stall
from depsi.cli import main
sys.exit(main(["run", sys.argv[1], "--no-progress", "--resume"]))
"""


@pytest.mark.slow
def test_sigterm_during_a_step_exits_5_with_one_line(run, tmp_path):
    before = finished_products(run.workspace)
    stalled = tmp_path / "stalled"
    process = subprocess.Popen([sys.executable, "-c", _STALLING_RUN, str(run.config),
                                str(stalled)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not stalled.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == ExitCode.INTERRUPTED
    the_error_line(stderr, "terminated by SIGTERM", f"depsi run {run.config} --resume")
    assert finished_products(run.workspace) == before


# ---------------------------------------------------------------------- resources, locks, bugs
def test_a_memory_refusal_exits_6_with_its_own_words(run, console, monkeypatch):
    raise_in_network_step(monkeypatch, MemoryError("network: refused, would need 12.0 GB"))
    assert run() == ExitCode.RESOURCE_LIMIT
    the_error_line(console(), "network: refused, would need 12.0 GB", "give the run more memory",
                   "--resume")


def test_work_refused_before_it_starts_exits_6_naming_the_key(run, console):
    before = finished_products(run.workspace)
    assert run("--threads", "100000") == ExitCode.RESOURCE_LIMIT
    the_error_line(console(), "refused before any work: compute.threads: expected at most",
                   "found 100000", "nothing was written", "lower the key named", "--resume")
    assert finished_products(run.workspace) == before


def test_a_workspace_held_by_a_live_run_exits_7(run, console):
    import json
    import socket

    before = finished_products(run.workspace)
    lock = run.workspace / "depsi.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    assert run() == ExitCode.WORKSPACE_BUSY
    the_error_line(console(), "workspace busy", f"is in use by run pid {os.getpid()}", str(lock))
    lock.unlink()
    assert_resumes(run, before, "--to", "network")


def test_an_unexpected_error_exits_1_keeping_its_traceback(run, console, monkeypatch):
    before = finished_products(run.workspace)
    raise_in_network_step(monkeypatch, RuntimeError("boom"))
    assert run() == ExitCode.INTERNAL_ERROR
    the_error_line(console(), "internal error RuntimeError: boom", "please report it",
                   str(run.workspace / "depsi.log"), traceback=True)
    log = (run.workspace / "depsi.log").read_text()
    assert "Traceback" in log and "RuntimeError: boom" in log
    monkeypatch.undo()
    assert_resumes(run, before, "--to", "network")


# ------------------------------------------------------------------------------- bad text
def test_a_config_that_is_not_utf8_exits_2_suggesting_its_encoding(tmp_path, console):
    config = tmp_path / "run.yaml"
    config.write_bytes("# Zoë's stack\ninput: {simulate: {shape: [40, 40]}}\n".encode("cp1252"))
    assert main(["run", str(config)]) == ExitCode.BAD_INPUT
    the_error_line(console(), str(config), "at byte 4", "looks like WINDOWS-1252",
                   "iconv -f WINDOWS-1252 -t UTF-8")


def test_a_csv_header_that_is_not_utf8_names_the_file_and_its_encoding(tmp_path):
    from depsi.io import from_csv

    path = tmp_path / "ps.csv"
    path.write_bytes("pnt_id,pnt_line,pnt_pixel,dé_20200101\na,1,2,0.1\n".encode("cp1252"))
    with pytest.raises(ValueError) as raised:
        from_csv(path, names="depsi")
    code, message = classify(raised.value)
    assert code == ExitCode.BAD_INPUT
    assert str(path) in message and "looks like WINDOWS-1252" in message


def test_a_decode_error_names_the_file_the_offset_and_the_encoding(tmp_path):
    path = tmp_path / "points.csv"
    data = "id,name\n1,Zoë\n".encode("cp1252")
    path.write_bytes(data)
    with pytest.raises(UnicodeDecodeError) as raised:
        data.decode("utf-8")
    raised.value.filename = str(path)  # a reader that knows its file says so
    code, message = classify(raised.value)
    assert code == ExitCode.BAD_INPUT
    assert message.startswith(f"not UTF-8 text in '{path}': byte 0xeb at offset 12 (")
    assert f"iconv -f WINDOWS-1252 -t UTF-8 {path} > {path}.utf8" in message
    utf16 = "id\n".encode("utf-16")
    with pytest.raises(UnicodeDecodeError) as raised:
        utf16.decode("utf-8")
    assert "looks like UTF-16" in classify(raised.value)[1]


# ---------------------------------------------------------------------------- the table
def test_every_exit_code_is_in_the_help_and_the_module_table(capsys):
    import depsi.errors

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert set(EXIT_CODE_MEANINGS) == set(ExitCode)
    for code, meaning in EXIT_CODE_MEANINGS.items():
        assert f"  {int(code)}  {meaning}" in help_text
        assert f"{int(code)}    ``{code.name}``" in depsi.errors.__doc__


@pytest.mark.parametrize(("error", "code", "words"), [
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/ws/ps.zarr"), ExitCode.DISK_FULL,
     "within your quota"),
    (OSError(errno.EMFILE, "Too many open files"), ExitCode.RESOURCE_LIMIT, "ulimit -n"),
    (OSError(errno.EIO, "Input/output error", "/ws/ps.zarr/c/0"), ExitCode.SYSTEM_ERROR,
     "system error (EIO"),
    (TimeoutError("lock of '/ws/ps.zarr': expected no other writer"), ExitCode.WORKSPACE_BUSY,
     "DEPSI_LOCK_TIMEOUT"),
    (FileNotFoundError("input.path: stack '/x.zarr' does not exist"), ExitCode.BAD_INPUT,
     "input.path: stack '/x.zarr' does not exist"),
    (RuntimeError("wrapper"), ExitCode.INTERNAL_ERROR, "please report it"),
])
def test_classify_names_the_fault_and_what_to_do(error, code, words):
    got, message = classify(error, workspace="/ws", config="run.yaml")
    assert got == code and words in message and "\n" not in message


def test_an_os_error_under_a_wrapper_is_classified_by_its_cause():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/ws/arcs.zarr")
        except OSError as err:
            raise RuntimeError("a writer failed") from err
    except RuntimeError as wrapper:
        code, message = classify(wrapper, workspace="/ws", config="run.yaml")
    assert code == ExitCode.DISK_FULL and "/ws/arcs.zarr" in message
