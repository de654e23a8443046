"""The pipeline configuration: defaults, the commented example, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from depsi.pipeline.config import (
    ConfigError,
    PipelineConfig,
    dump_config,
    example_config_yaml,
    load_config,
    parse_config,
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_example_config_loads_back_to_the_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, example_config_yaml())
    assert load_config(path) == PipelineConfig()


def test_example_config_comments_every_key() -> None:
    lines = example_config_yaml().splitlines()
    for before, line in zip(lines, lines[1:]):
        if line.strip() and not line.lstrip().startswith("#"):
            assert before.lstrip().startswith("#"), f"key without a comment: {line!r}"


def test_every_field_has_a_description() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            sub = getattr(field.annotation, "model_fields", None)
            if sub is not None:
                missing += walk(field.annotation)
        return missing

    assert walk(PipelineConfig) == []


def test_dumped_config_round_trips(tmp_path: Path) -> None:
    config = parse_config({
        "input": {"path": str(tmp_path / "stack.zarr")},
        "network": {"method": "redundant", "k": 6, "max_length": 800.0},
        "output": {"workspace": str(tmp_path / "ws"), "exports": ["csv", "geotiff"]},
        "compute": {"scheduler": "slurm", "slurm": {
            "queue": "gpu", "account": "insar", "cores": 4, "processes": 2, "memory": "16GB",
            "walltime": "10:00:00", "job_directives": ["--qos=short"], "gpus_per_job": 1,
            "adaptive": {"minimum": 1, "maximum": 8}, "interface": "ib0"}},
    })
    assert load_config(_write(tmp_path, dump_config(config))) == config
    assert config.input.format == "zarr"


def test_walltime_with_hours_over_nine_stays_a_string(tmp_path: Path) -> None:
    # YAML 1.1 reads 10:00:00 as the integer 36000; the loader must not.
    config = load_config(_write(tmp_path, "compute:\n  slurm:\n    walltime: 10:00:00\n"))
    assert config.compute.slurm.walltime == "10:00:00"


def test_unknown_key_is_named_with_its_section_and_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "compute:\n  schedular: local\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert "'schedular'" in message and "'compute'" in message
    assert "did you mean 'scheduler'" in message


def test_unknown_top_level_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'selektion'"):
        load_config(_write(tmp_path, "selektion:\n  method: nad\n"))


@pytest.mark.parametrize(("data", "key", "value"), [
    ({"compute": {"scheduler": "slurmm"}}, "compute.scheduler", "slurmm"),
    ({"selection": {"method": "mad"}}, "selection.method", "mad"),
    ({"selection": {"threshold": -1}}, "selection.threshold", "-1"),
    ({"compute": {"slurm": {"walltime": "2h"}}}, "compute.slurm.walltime", "2h"),
    ({"compute": {"slurm": {"memory": "lots"}}}, "compute.slurm.memory", "lots"),
    ({"compute": {"memory_limit": "2 gigs"}}, "compute.memory_limit", "2 gigs"),
    ({"output": {"exports": ["csv", "shp"]}}, "output.exports.1", "shp"),
])
def test_wrong_value_names_the_key_and_the_value(data: dict, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, source="run.yaml")
    message = str(err.value)
    assert message.startswith("run.yaml:")
    assert key in message and value in message


def test_input_path_without_known_format_is_refused() -> None:
    with pytest.raises(ConfigError, match="input: format is needed for path 'stack.h5'"):
        parse_config({"input": {"path": "stack.h5"}})


def test_input_without_path_is_a_simulated_stack() -> None:
    config = parse_config({"input": {"simulate": {"shape": [50, 60], "seed": 3}}})
    assert config.input.format == "simulated"
    assert config.input.simulate.shape == (50, 60)


def test_cores_not_divisible_by_processes_are_refused() -> None:
    with pytest.raises(ConfigError, match="compute.slurm: cores 3 is not a multiple"):
        parse_config({"compute": {"slurm": {"cores": 3, "processes": 2}}})


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "compute: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_missing_file_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "")) == PipelineConfig()
    assert yaml.safe_load(dump_config(PipelineConfig()))["compute"]["scheduler"] == "threads"
