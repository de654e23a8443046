"""The one registry of stack formats (:data:`depsi.io.formats.READERS`): the pipeline's
``input.format``, ``depsi simulate --format`` and the format table of the reading guide name the
same formats, and each format's needs are what the configuration asks for."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from depsi.io.formats import READERS, STACK_FORMATS
from depsi.pipeline.config import INPUT_FORMATS, ConfigError, InputConfig, parse_config

ROOT = Path(__file__).resolve().parents[1]
READING_GUIDE = ROOT / "docs" / "steps" / "reading.md"


def guide_formats() -> set[str]:
    """The ``input.format`` column of the reading guide's table of sources."""
    lines = READING_GUIDE.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| source |"))
    column = [cell.strip() for cell in lines[header].strip("|").split("|")].index(
        "`input.format`")
    found = set()
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cell = [c.strip() for c in line.strip().strip("|").split("|")][column]
        found |= set(re.findall(r"`([a-z0-9_]+)`", cell))
    return found


def test_the_reading_guide_names_exactly_the_registrys_formats():
    assert guide_formats() == set(READERS) | {"simulated"}


def test_the_configuration_takes_exactly_the_registrys_formats():
    assert INPUT_FORMATS == (*READERS, "simulated")
    literal = typing.get_args(InputConfig.model_fields["format"].annotation)[0]
    assert set(typing.get_args(literal)) == set(INPUT_FORMATS)


def test_the_formats_with_a_writer_are_those_depsi_writes():
    assert STACK_FORMATS == tuple(name for name, entry in READERS.items() if entry.write)
    assert {"zarr", "binary", "interferograms"}.isdisjoint(STACK_FORMATS)


NEEDS_VALUES = {"dates": ["2020-01-01", "2020-01-13"], "wavelength": 0.0555,
                "pixel_spacing": [14.0, 4.0]}


@pytest.mark.parametrize("fmt", [name for name, entry in READERS.items() if entry.needs])
def test_each_need_of_a_format_is_required_by_the_configuration(fmt, tmp_path):
    needs = READERS[fmt].needs
    section = {"format": fmt, "path": str(tmp_path)} | {k: NEEDS_VALUES[k] for k in needs}
    parse_config({"input": section, "output": {"workspace": str(tmp_path / "ws")}})
    for need in needs:
        without = {k: v for k, v in section.items() if k != need}
        with pytest.raises(ConfigError, match=need):
            parse_config({"input": without, "output": {"workspace": str(tmp_path / "ws")}})


@pytest.mark.parametrize("fmt", STACK_FORMATS)
def test_a_second_stack_in_the_same_folder_is_refused_unless_overwrite(fmt, tmp_path):
    """Every writer refuses a folder that holds a stack of its format already, naming the
    folder, and replaces it with ``overwrite``; the replaced stack reads back."""
    from depsi.simulate import write_stack

    kwargs = dict(shape=(12, 10), n_epochs=4, seed=1)
    first = write_stack(tmp_path / fmt, format=fmt, **kwargs)
    with pytest.raises(FileExistsError, match=str(tmp_path / fmt)):
        write_stack(tmp_path / fmt, format=fmt, **kwargs)
    again = write_stack(tmp_path / fmt, format=fmt, overwrite=True, **kwargs)
    assert again["path"] == first["path"] and again["dates"] == first["dates"]
    given = {need: again[need] for need in READERS[fmt].needs}  # geotiff: dates, wavelength
    options = InputConfig(format=fmt, path=str(again["path"]), **given)
    stack = READERS[fmt].read(Path(again["path"]), options)
    assert stack.sizes["time"] == 4 and (stack.sizes["azimuth"], stack.sizes["range"]) == (12, 10)
