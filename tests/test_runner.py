"""The pipeline runner and its CLI: products, manifests, resume, --from/--to, and the errors that
come before any work (bad key, missing file, missing earlier product)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from depsi.cli import main
from depsi.io import open_stm
from depsi.pipeline import PipelineError, RunSummary, load_config, parse_config, run_pipeline
from depsi.pipeline.runner import PRODUCTS, manifest_path, product_fingerprint
from depsi.pipeline.steps import STEP_NAMES as STEPS

SMALL = {"input": {"simulate": {"shape": [96, 96], "n_epochs": 16, "seed": 4,
                                "ps_fraction": 0.04}},
         "compute": {"scheduler": "threads", "threads": 2}}


def small_config(workspace, **sections):
    data = json.loads(json.dumps(SMALL))
    data["output"] = {"workspace": str(workspace), "exports": ["csv"]}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse_config(data)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A workspace after one complete run, and its summary."""
    workspace = tmp_path_factory.mktemp("runner") / "ws"
    config = small_config(workspace)
    return config, run_pipeline(config, progress=False)


def test_run_writes_every_product_and_its_manifest(finished):
    config, summary = finished
    workspace = config.output.workspace
    assert isinstance(summary, RunSummary)
    assert [r.status for r in summary.steps.values()] == ["ran"] * len(STEPS)
    for step, product in PRODUCTS.items():
        manifest = json.loads(manifest_path(workspace, step).read_text())
        assert manifest["fingerprint"] == product_fingerprint(workspace / product)
    result = open_stm(workspace / "stm.zarr")
    assert summary.steps["model"].counts["points"] == result.sizes["space"] > 50
    table = pd.read_csv(workspace / "exports" / "points.csv")
    np.testing.assert_allclose(table["velocity"], result["velocity"].values, rtol=1e-6)


def test_run_logs_to_the_workspace_with_a_summary(finished):
    config, summary = finished
    log = (config.output.workspace / "depsi.log").read_text()
    assert "step model: done" in log and "step densification: done" in log
    assert "depsi run finished" in log
    assert "stm.zarr" in summary.format() and "selection" in summary.format()
    assert not (config.output.workspace / "depsi.lock").exists()


def test_resume_skips_every_finished_step(finished):
    config, _ = finished
    before = manifest_path(config.output.workspace, "model").read_text()
    summary = run_pipeline(config, resume=True, progress=False)
    assert [r.status for r in summary.steps.values()] == ["skipped"] * len(STEPS)
    assert manifest_path(config.output.workspace, "model").read_text() == before


@pytest.mark.slow
def test_changed_densification_settings_redo_only_the_steps_after_it(finished, tmp_path):
    config, _ = finished
    workspace = tmp_path / "ws"
    shutil.copytree(config.output.workspace, workspace)
    changed = small_config(workspace, densification={"min_coherence": 0.8})
    summary = run_pipeline(changed, resume=True, progress=False)
    ran = [name for name, r in summary.steps.items() if r.status == "ran"]
    assert ran == ["densification", "model", "export"]
    assert {r.status for name, r in summary.steps.items() if name not in ran} == {"skipped"}


@pytest.mark.slow
def test_a_product_without_manifest_is_redone_not_trusted(finished, tmp_path):
    config, _ = finished
    workspace = tmp_path / "ws"
    shutil.copytree(config.output.workspace, workspace)
    manifest_path(workspace, "model").unlink()
    summary = run_pipeline(small_config(workspace), resume=True, progress=False)
    assert summary.steps["model"].status == "ran"
    assert summary.steps["densification"].status == "skipped"
    assert summary.steps["export"].status == "ran"  # its input was rewritten


@pytest.mark.slow
def test_a_damaged_product_is_redone_and_stale_temporaries_removed(finished, tmp_path):
    config, _ = finished
    workspace = tmp_path / "ws"
    shutil.copytree(config.output.workspace, workspace)
    shutil.rmtree(workspace / "ps.zarr" / "velocity", ignore_errors=True)
    shutil.rmtree(workspace / "ps.zarr" / "amplitude")
    stale = workspace / ".stm.zarr.writing-deadbeef"
    stale.mkdir()
    summary = run_pipeline(small_config(workspace), resume=True, progress=False)
    assert [r.status for r in summary.steps.values()] == ["skipped"] + ["ran"] * (len(STEPS) - 1)
    assert not stale.exists()
    assert "amplitude" in open_stm(workspace / "ps.zarr")


def test_from_needs_the_earlier_products_and_names_the_missing_one(finished, tmp_path):
    with pytest.raises(PipelineError, match=r"stack\.zarr"):
        run_pipeline(small_config(tmp_path / "empty"), start="network", progress=False)
    config, _ = finished
    workspace = tmp_path / "ws"
    shutil.copytree(config.output.workspace, workspace)
    shutil.rmtree(workspace / "ps.zarr")
    with pytest.raises(PipelineError, match=r"ps\.zarr is missing"):
        run_pipeline(small_config(workspace), start="network", progress=False)


@pytest.mark.slow
def test_from_and_to_run_a_sub_range(finished, tmp_path):
    config, _ = finished
    workspace = tmp_path / "ws"
    shutil.copytree(config.output.workspace, workspace)
    summary = run_pipeline(small_config(workspace), start="densification",
                           stop="densification", progress=False)
    assert [r.status for r in summary.steps.values()] == ["reused"] * 6 + ["ran"] + ["not run"] * 2


def test_start_after_stop_is_refused(tmp_path):
    with pytest.raises(ValueError, match="comes after"):
        run_pipeline(small_config(tmp_path), start="export", stop="selection")


# ---------------------------------------------------------------------------------------- CLI
def test_cli_config_example_loads_back(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    assert main(["config", "--example", str(path)]) == 0
    assert load_config(path) == parse_config({})
    assert "# " in path.read_text()


def test_cli_run_with_an_unknown_key_fails_naming_it(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text("selection:\n  threshhold: 0.2\n")
    assert main(["run", str(path)]) == 2
    assert "threshhold" in caplog.text and "selection" in caplog.text
    assert not (tmp_path / "depsi-workspace").exists()


def test_cli_run_with_a_missing_input_fails_naming_the_file(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(f"input: {{path: {tmp_path / 'nowhere.zarr'}}}\n"
                    f"output: {{workspace: {tmp_path / 'ws'}}}\n")
    assert main(["run", str(path)]) == 2
    assert "nowhere.zarr" in caplog.text
    assert not (tmp_path / "ws").exists()


@pytest.mark.slow
def test_cli_run_then_resume(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    data = json.loads(json.dumps(SMALL)) | {"output": {"workspace": str(tmp_path / "ws"),
                                                        "exports": []}}
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--to", "selection", "--no-progress"]) == 0
    assert main(["run", str(path), "--resume", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "selection     skipped" in out and "densification ran" in out


def test_cli_slurm_script_has_the_directives_and_runs_resume(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"compute": {"scheduler": "slurm", "slurm": {
        "queue": "gpu", "account": "proj1", "walltime": "02:30:00", "memory": "8GB",
        "job_directives": ["--qos=short"]}}}))
    script = tmp_path / "job.sh"
    assert main(["slurm-script", str(path), "-o", str(script)]) == 0
    text = script.read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj1",
                 "#SBATCH --time=02:30:00", "#SBATCH --job-name=depsi", "#SBATCH --output=",
                 "#SBATCH --qos=short", "#SBATCH --mem=", "#SBATCH --cpus-per-task=1"):
        assert line in text, line
    assert f"run {path.resolve()} --resume" in text
    assert text.startswith("#!/bin/bash\n")


def test_slurm_driver_job_takes_its_own_walltime_and_memory(tmp_path):
    from depsi.cli import slurm_batch_script
    from depsi.pipeline.config import parse_config

    config = parse_config({"compute": {"scheduler": "slurm", "slurm": {
        "walltime": "01:00:00", "memory": "16GB",
        "driver_walltime": "2-00:00:00", "driver_memory": "2GB"}}})
    text = slurm_batch_script(tmp_path / "config.yaml", config=config)
    assert "#SBATCH --time=2-00:00:00" in text
    assert "#SBATCH --mem=1907M" in text  # 2 GB, not the workers' 16 GB
    assert "#SBATCH --cpus-per-task=1" in text


@pytest.mark.parametrize("compute, cpus", [
    ({"scheduler": "threads", "threads": 8}, 8),
    ({"scheduler": "threads", "slurm": {"cores": 16}}, 16),
    ({"scheduler": "local", "workers": 4, "threads": 2}, 8),
    ({"scheduler": "synchronous"}, 1),
    ({"scheduler": "slurm", "slurm": {"cores": 32, "jobs": 2}}, 1),
])
def test_slurm_script_asks_for_the_cores_the_scheduler_uses(tmp_path, compute, cpus):
    from depsi.cli import slurm_batch_script
    from depsi.pipeline.config import parse_config

    text = slurm_batch_script(tmp_path / "config.yaml", config=parse_config({"compute": compute}))
    assert f"#SBATCH --cpus-per-task={cpus}\n" in text
    if compute["scheduler"] == "threads":  # the run uses exactly what SLURM gave the job
        assert f"--threads ${{SLURM_CPUS_PER_TASK:-{cpus}}}" in text
    if compute["scheduler"] == "slurm":
        assert "submits 2 worker job(s) of 32 cores" in text


def test_run_threads_option_overrides_the_configuration(tmp_path, monkeypatch):
    import depsi.pipeline.runner as runner
    from depsi.cli import main

    seen = {}

    class Summary:
        def format(self):
            return "summary"

    def fake_run(config, **kwargs):
        seen["threads"] = config.compute.threads
        return Summary()

    monkeypatch.setattr(runner, "run_pipeline", fake_run)
    path = tmp_path / "config.yaml"
    stack = tmp_path / "stack.zarr"
    stack.mkdir()
    path.write_text(yaml.safe_dump({"input": {"path": str(stack)},
                                    "compute": {"scheduler": "threads", "threads": 2}}))
    assert main(["run", str(path), "--threads", "6"]) == 0
    assert seen["threads"] == 6


def test_run_prints_one_summary_on_stdout_and_no_escapes_when_redirected(tmp_path, capfd):
    """Redirected output (not a terminal): no progress bars, so no carriage returns or
    cursor-up escapes; the summary table once, on stdout, and in the workspace log."""
    path = tmp_path / "config.yaml"
    data = json.loads(json.dumps(SMALL)) | {"output": {"workspace": str(tmp_path / "ws"),
                                                        "exports": []}}
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--to", "selection"]) == 0
    out, err = capfd.readouterr()
    assert out.count("selection     ran") == 1
    assert "selection     ran" not in err
    assert "\x1b[A" not in out + err and "\r" not in out + err
    assert "selection     ran" in (tmp_path / "ws" / "depsi.log").read_text()


def test_heartbeat_logs_while_a_long_step_runs(caplog):
    import logging
    import time as clock

    from depsi.pipeline.workspace import heartbeat

    with caplog.at_level(logging.INFO, logger="depsi.pipeline.workspace"):
        with heartbeat("step chain", every=0.05):
            clock.sleep(0.18)
    beats = [r for r in caplog.records if "step chain: still running" in r.getMessage()]
    assert 2 <= len(beats) <= 4


def test_progress_bars_only_on_a_terminal_or_in_a_notebook(monkeypatch):
    import sys

    from depsi.io.prefetch import bars_wanted

    class Terminal:
        def isatty(self):
            return True

    class ZMQInteractiveShell:  # the kernel's shell, by name
        pass

    class IPython:
        shell = None

        @classmethod
        def get_ipython(cls):
            return cls.shell

    monkeypatch.setitem(sys.modules, "IPython", IPython)
    monkeypatch.setitem(sys.modules, "ipykernel", object())  # imported, but no kernel runs
    assert not bars_wanted(True)  # pytest captures stderr: not a terminal
    assert not bars_wanted(False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert bars_wanted(True)
    monkeypatch.setattr(sys, "stderr", None)
    IPython.shell = ZMQInteractiveShell()
    assert bars_wanted(True)


def test_a_run_opens_and_checks_its_stack_once(tmp_path, monkeypatch):
    """The stack's checks read a sample of its chunks: a run opens and checks it once, for
    every step that reads it; a resumed run too (the check of its finished product is the
    opening the later steps take)."""
    from depsi.io import validate

    opened = []
    real = validate.validate_stack

    def counting(*args, **kwargs):
        opened.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(validate, "validate_stack", counting)
    config = small_config(tmp_path / "ws")
    run_pipeline(config, stop="selection", progress=False)
    assert len(opened) == 1
    opened.clear()
    changed = small_config(tmp_path / "ws", selection={"threshold": 0.3})
    summary = run_pipeline(changed, resume=True, stop="selection", progress=False)
    assert [summary.steps[s].status for s in ("stack", "selection")] == ["skipped", "ran"]
    assert len(opened) == 1
