"""A first run on a cold Numba cache: the NumPy kernels run while a background process compiles
the fused ones into the cache, which the next run loads without compiling; where the cache
cannot be written nothing is compiled (depsi.kernels.numba_support.ready)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from depsi.kernels import numba_support, warmup

MODULES = ("periodogram_numba", "arc_rhs_numba", "ldl_numba", "normal_rhs_numba",
           "statistics_numba", "misclosure_numba", "kriging_numba", "gather_numba")

# one process's run: which modules run compiled, what it compiled itself, and whether the
# periodogram's result is the reference's (the NumPy kernels) or the fused kernel's
_RUN = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    logging.basicConfig(level=logging.INFO)
    from depsi.kernels import (arc_rhs_numba, gather_numba, kriging_numba, ldl_numba,
                               misclosure_numba, normal_rhs_numba, numba_support,
                               periodogram_numba, statistics_numba)
    from depsi.kernels.periodogram import periodogram
    t = np.linspace(0, 3, 20)
    h2ph = 3e-4 * np.sin(7.0 * np.arange(20))
    rng = np.random.default_rng(1)
    phase = np.angle(np.exp(1j * ((-4 * np.pi / 0.0555) * (0.01 * t + h2ph * 12.0)
                                  + rng.normal(0, 0.3, (40, 20)))))
    auto = periodogram(phase, h2ph, t, wavelength=0.0555)
    modules = (periodogram_numba, arc_rhs_numba, ldl_numba, normal_rhs_numba,
               statistics_numba, misclosure_numba, kriging_numba, gather_numba)
    ready = {m.__name__.rsplit(".", 1)[1]: m.ready() for m in modules}
    misses = sum(sum(d.stats.cache_misses.values()) for m in modules for d, _ in m.samples())
    reference = periodogram(phase, h2ph, t, wavelength=0.0555, fused=False)
    same = bool(np.array_equal(auto.velocity, reference.velocity, equal_nan=True)
                and np.array_equal(auto.height_error, reference.height_error, equal_nan=True))
    pending = bool(numba_support._pending)
    if pending and "--wait" in sys.argv:  # what the exit would start, now, to wait for it
        numba_support.compile_pending().wait(timeout=600)
    print(json.dumps({"ready": ready, "compiled": misses, "same_as_reference": same,
                      "background": pending}))
""")


def _run(env, *args):
    done = subprocess.run([sys.executable, "-c", _RUN, *args], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def _env(cache, **more):
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache), DEPSI_NUMBA_COMPILE="background",
                **more)


@pytest.mark.slow
def test_cold_cache_runs_numpy_and_the_next_run_loads_the_compiled_kernels(tmp_path):
    cache = tmp_path / "numba"
    first, log = _run(_env(cache), "--wait")
    assert first == {"ready": dict.fromkeys(MODULES, False), "compiled": 0,
                     "same_as_reference": True, "background": True}
    assert log.count("background process compiles them") == 1, log  # once, not a module
    assert "compiled" in (cache / "warmup.log").read_text()

    second, log = _run(_env(cache))
    assert second == {"ready": dict.fromkeys(MODULES, True), "compiled": 0,
                      "same_as_reference": False, "background": False}
    assert "background process" not in log


@pytest.mark.slow
def test_the_background_compilation_starts_when_the_run_exits(tmp_path):
    """It takes no core from the run that asked for it: started at its exit, detached."""
    cache = tmp_path / "numba"
    script = textwrap.dedent("""
        import logging
        logging.basicConfig(level=logging.INFO)
        from depsi.kernels import arc_rhs_numba, numba_support
        assert not arc_rhs_numba.ready()
        assert numba_support._pending and not numba_support._background
    """)
    done = subprocess.run([sys.executable, "-c", script], env=_env(cache), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "in a background process" in done.stderr.splitlines()[-1], done.stderr
    deadline = time.time() + 600
    while "Numba's kernels are in" not in _text(cache / "warmup.log"):
        assert time.time() < deadline, _text(cache / "warmup.log")
        time.sleep(1)


def _text(path):
    return path.read_text() if path.exists() else ""


def test_unwritable_cache_runs_numpy_without_compiling(tmp_path):
    """A read-only install: compiling in every run would cost it about 20 s a run, so the
    NumPy kernels run, and no process is started; one warning says so."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result, log = _run(_env(blocker / "numba", XDG_CACHE_HOME=str(blocker / "xdg"),
                            HOME=str(blocker)))
    assert result == {"ready": dict.fromkeys(MODULES, False), "compiled": 0,
                      "same_as_reference": True, "background": False}
    assert log.count("WARNING") == 1 and "no writable cache directory" in log, log


def test_inline_mode_compiles_in_the_process(monkeypatch):
    monkeypatch.setattr(numba_support, "_decided", {})
    monkeypatch.setenv("DEPSI_NUMBA_COMPILE", "inline")
    assert numba_support.ready("a module", lambda: pytest.fail("no lookup needed"))
    monkeypatch.setenv("DEPSI_NUMBA_COMPILE", "later")
    with pytest.raises(ValueError, match="DEPSI_NUMBA_COMPILE"):
        numba_support.ready("another module", list)


def test_the_decision_holds_for_the_process(monkeypatch, tmp_path):
    """One run takes one path: a module's decision is not revisited when the cache fills."""
    monkeypatch.setattr(numba_support, "_decided", {})
    monkeypatch.setattr(numba_support, "_pending", [tmp_path])  # asked for already
    monkeypatch.setenv("DEPSI_NUMBA_COMPILE", "background")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(numba_support, "loaded", lambda dispatcher, args: False)
    calls = []
    assert not numba_support.ready("m", lambda: calls.append(1) or [(None, ())])
    monkeypatch.setattr(numba_support, "loaded", lambda dispatcher, args: True)
    assert not numba_support.ready("m", lambda: calls.append(1) or [(None, ())])
    assert calls == [1]


def test_interrupted_cache_writes_are_removed(tmp_path):
    """Numba writes a cache file under a temporary name and renames it: a killed compilation
    leaves only such a temporary, which no run loads, and the next compilation removes."""
    stale = tmp_path / "sub" / "kernels.f-1.py311.nbi.tmp.0123456789abcdef"
    fresh = tmp_path / "sub" / "kernels.g-1.py311.nbc.tmp.fedcba9876543210"
    stale.parent.mkdir()
    stale.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    old = time.time() - 2 * warmup.STALE_TEMPORARY_S
    os.utime(stale, (old, old))
    assert warmup.remove_stale_temporaries(tmp_path) == [stale]
    assert fresh.exists() and not stale.exists()


def test_warmup_without_a_writable_cache_fails_with_a_reason(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker / "numba"))
    with caplog.at_level(logging.ERROR):
        assert warmup.main([]) == 1
    assert "NUMBA_CACHE_DIR" in caplog.text


def test_the_warmup_command_says_why_it_cannot_compile(tmp_path, monkeypatch, caplog):
    from depsi.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker / "numba"))
    assert main(["warmup"]) == 1
    assert "no writable cache directory" in caplog.text


def test_every_compiled_kernel_module_is_warmed_and_checked_here():
    kernels = Path(warmup.__file__).parent
    assert set(MODULES) == set(warmup.MODULES) == {p.stem for p in kernels.glob("*_numba.py")}


def test_the_warmup_log_keeps_its_end_only(tmp_path):
    log = tmp_path / "warmup.log"
    lines = [f"line {i} compiled\n".encode() for i in range(40_000)]
    log.write_bytes(b"".join(lines))
    numba_support.trim_log(log, keep=1000)
    kept = log.read_bytes()
    assert len(kept) <= 1000 and kept.endswith(lines[-1])
    assert kept.startswith(b"line ")  # from a line's start
    assert kept == b"".join(lines[-len(kept.splitlines()):])
    numba_support.trim_log(log, keep=10_000)  # shorter than kept: untouched
    assert log.read_bytes() == kept
    numba_support.trim_log(tmp_path / "absent.log")  # no log yet: nothing to do
    assert not (tmp_path / "absent.log").exists()
