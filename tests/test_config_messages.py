"""Configuration errors speak the user's terms: what the key expects, named from its
type ("a list of two numbers", "one of 'nad', 'nmad'", "a section of keys"), one problem a line
with its full key path, and YAML syntax errors with the file, line, column and a caret."""

from __future__ import annotations

from pathlib import Path

import pytest

from depsi.pipeline.config import ConfigError, load_config, parse_config

#: Words of Python and pydantic that a message must never show the user.
JARGON = ("Input should", "tuple", "dict", "Config", "pydantic", "<unicode string>",
          "<class", "NoneType", "True", "False", "None")


def message_of(data, source: str = "run.yaml") -> str:
    with pytest.raises(ConfigError) as raised:
        parse_config(data, source=source)
    return str(raised.value)


def assert_plain(message: str) -> None:
    for word in JARGON:
        assert word not in message, (word, message)


@pytest.mark.parametrize(("data", "line"), [
    ({"arcs": {"height_range": 200}},
     "arcs.height_range: expected a list of two numbers, found 200"),
    ({"arcs": {"height_range": [1, 2, 3]}},
     "arcs.height_range: expected a list of two numbers, found [1, 2, 3]"),
    ({"arcs": {"height_range": [-50, "x"]}},
     "arcs.height_range: expected a list of two numbers, found [-50, 'x']"),
    ({"input": {"simulate": {"shape": 5}}},
     "input.simulate.shape: expected a list of two whole numbers, found 5"),
    ({"input": {"simulate": {"chunks": "big"}}},
     "input.simulate.chunks: expected a list of two whole numbers or null, found 'big'"),
    ({"selection": {"threshold": "abc"}},
     "selection.threshold: expected a number or null, found 'abc'"),
    ({"selection": {"threshold": -1}},
     "selection.threshold: expected a number greater than 0, found -1"),
    ({"integration": {"alpha": 2}},
     "integration.alpha: expected a number greater than 0 and less than 1, found 2"),
    ({"network": {"k": 2.5}}, "network.k: expected a whole number, found 2.5"),
    ({"network": {"k": 0}}, "network.k: expected a whole number at least 1, found 0"),
    ({"selection": {"method": "mad"}},
     "selection.method: expected one of 'nad', 'nmad', 'phase', found 'mad'"),
    ({"selection": 5},
     "selection: expected a section of keys (method, threshold, engine, ...), found 5"),
    ({"compute": {"slurm": {"adaptive": [1, 8]}}},
     "compute.slurm.adaptive: expected a section of keys (minimum, maximum) or null, "
     "found [1, 8]"),
    ({"selection": {"threshold": True}},
     "selection.threshold: expected a number or null, found true"),
    ({"compute": {"workers": False}},
     "compute.workers: expected a whole number or null, found false"),
    ({"arcs": {"velocity_range": [True, 0.05]}},
     "arcs.velocity_range: expected a list of two numbers, found [true, 0.05]"),
    ({"integration": {"reference_noise": 5}},
     "integration.reference_noise: expected true or false, found 5"),
    ({"input": {"path": 5}}, "input.path: expected a path or null, found 5"),
    ({"output": {"exports": "csv"}},
     "output.exports: expected a list of 'csv', 'gpkg', 'geotiff', 'plots', 'egms' or "
     "'qgis', found 'csv'"),
    ({"input": {"dates": "2020-01-01"}},
     "input.dates: expected a list of strings or null, found '2020-01-01'"),
    ({"compute": {"devices": [[0]]}},
     "compute.devices.0: expected a whole number or a string, found [0]"),
    ({"arcs": {"height_step": float("inf")}},
     "arcs.height_step: expected a finite number or null, found .inf"),
])
def test_a_wrong_value_says_what_the_key_expects(data: dict, line: str) -> None:
    message = message_of(data)
    assert message == f"run.yaml: {line}"
    assert_plain(message)


def test_a_validator_names_its_key_once() -> None:
    message = message_of({"arcs": {"height_range": [5, -5]}})
    assert message == ("run.yaml: arcs.height_range: expected [low, high] with low < high, "
                       "got [5.0, -5.0]")


def test_errors_in_two_sections_are_counted_and_listed_one_a_line_by_key() -> None:
    message = message_of({"selection": {"threshold": "abc", "method": "mad"},
                          "arcs": {"height_range": 200}})
    assert message.splitlines() == [
        "run.yaml: 3 problems in the configuration:",
        "  arcs.height_range: expected a list of two numbers, found 200",
        "  selection.method: expected one of 'nad', 'nmad', 'phase', found 'mad'",
        "  selection.threshold: expected a number or null, found 'abc'"]


def test_an_unknown_key_keeps_its_did_you_mean_among_other_problems() -> None:
    message = message_of({"compute": {"schedular": "local", "slurm": {"cores": "x"}}})
    lines = message.splitlines()
    assert lines[0] == "run.yaml: 2 problems in the configuration:"
    assert lines[1].startswith("  unknown key 'schedular' in section 'compute' (allowed: ")
    assert lines[1].endswith("; did you mean 'scheduler'?")
    assert lines[2] == "  compute.slurm.cores: expected a whole number, found 'x'"


def test_a_top_level_that_is_not_a_mapping_shows_the_value() -> None:
    message = message_of([1, 2])
    assert message == ("run.yaml: expected a mapping of sections (input, selection, ..., "
                       "compute), found [1, 2]")
    assert_plain(message)


def test_a_huge_value_is_shown_by_its_size() -> None:
    message = message_of({"compute": {"workers": ["x"] * 10**6}})
    assert message == ("run.yaml: compute.workers: expected a whole number or null, "
                       "found a list of 1000000 items")


def test_a_yaml_syntax_error_in_a_file_names_the_line_and_column_with_a_caret(
        tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("selection:\n  method: nad\n threshold: 3\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).splitlines() == [
        f"{path}, line 3, column 2: not valid YAML: expected the end of the indented block, "
        "but found an indented mapping (while parsing an indented mapping at line 1, column 1)",
        "   threshold: 3",
        "   ^"]
    assert_plain(str(raised.value))


def test_an_unclosed_list_points_at_where_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("arcs:\n  height_range: [-50, 50\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    first, line, caret = str(raised.value).splitlines()
    assert first.startswith(f"{path}, line 3, column 1: not valid YAML: ")
    assert "(while parsing a [...] list at line 2, column 17)" in first
    assert line == "    height_range: [-50, 50"
    assert caret == "                  ^"


def test_yaml_text_given_to_parse_config_is_called_config_text() -> None:
    message = message_of("compute:\n  scheduler: 'local\n", source=None)
    assert message.startswith("<config text>, line 3, column 1: not valid YAML: found "
                              "unexpected end of the text")
    assert message.splitlines()[1:] == ["    scheduler: 'local", "               ^"]
    assert_plain(message)


def test_yaml_text_given_to_parse_config_is_validated() -> None:
    assert parse_config("selection:\n  method: nmad\n").selection.method == "nmad"
    assert message_of("arcs:\n  height_range: 200\n", source=None) == (
        "<config text>: arcs.height_range: expected a list of two numbers, found 200")


def test_a_control_character_is_placed_and_shown_printably(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("compute:\n  scheduler: lo\x07cal\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).splitlines() == [
        f"{path}, line 2, column 16: not valid YAML: expected printable text, found the "
        "control character #x0007",
        "    scheduler: lo\ufffdcal",
        "                 ^"]


def test_a_very_long_line_is_cut_around_the_caret(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("[" * 1000 + "]" * 1000)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    first, line, caret = str(raised.value).splitlines()
    assert "levels of nesting" in first and "line 1, column 33" in first
    assert len(line) < 140 and line.endswith("...")
    assert caret == " " * (2 + 32) + "^"
