"""Properties of the SLC stack readers: a damaged stack is refused by name or read unchanged.

Each format of :data:`depsi.io.writers.STACK_FORMATS` is written once by depsi's own writer;
every example copies it, applies one damage drawn by hypothesis (orbits swapped between two
epochs, dates changed or swapped in file names, a raster's size changed, a byte order flipped,
a header field removed, a reference pointing out of the product folder) and reads it back.
The reader either raises an error whose message names the damaged file or field, or returns
exactly the values of the undamaged stack: never a different answer in silence. The raw
interferogram layout of :func:`depsi.io.interferograms.from_interferograms` is held to the
same property.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depsi.conventions import MONTH_ABBREVIATIONS
from depsi.io.interferograms import from_interferograms
from depsi.io.writers import STACK_FORMATS, write_slc_stack
from depsi.pipeline.config import parse_config
from depsi.pipeline.input_stack import _open_stack_unchecked
from depsi.simulate import simulate_stack
from depsi.simulate.scene import simulated_geometry

#: every example writes and reads a whole stack: about two minutes on 2 cores
pytestmark = pytest.mark.slow

PROPERTY = settings(max_examples=3, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

MONTHS = MONTH_ABBREVIATIONS


# ---------------------------------------------------------------- writing and reading a stack


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each format's valid stack, written once, with its dates and what its reader returns."""
    stack, _ = simulate_stack(shape=(12, 14), n_epochs=6, seed=11)
    stack = stack.compute()
    geometry = simulated_geometry(stack)
    dates = [str(np.datetime64(t, "D")) for t in stack["time"].values]
    stacks = {}
    for fmt in STACK_FORMATS:
        folder = tmp_path_factory.mktemp(fmt)
        path = write_slc_stack(folder / "stack", stack, geometry, format=fmt)
        section = {"format": fmt, "path": str(path)}
        if fmt == "geotiff":
            section |= {"dates": dates, "wavelength": geometry.wavelength}
        stacks[fmt] = {"root": folder / "stack", "section": section, "dates": dates,
                       "read": _read(section)}
    return stacks


def _read(section: dict):
    return _open_stack_unchecked(parse_config({"input": section})).compute()


def _same(read, reference) -> bool:
    if read["complex"].shape != reference["complex"].shape:
        return False
    if not np.array_equal(read["time"].values, reference["time"].values):
        return False
    if not np.array_equal(read["complex"].values, reference["complex"].values):
        return False
    if ("h2ph" in read) != ("h2ph" in reference):
        return False
    return "h2ph" not in read or np.array_equal(read["h2ph"].values, reference["h2ph"].values,
                                               equal_nan=True)


def _refused_by_name_or_unchanged(read, reference, names: list[str]) -> None:
    """The property: a named refusal, or the undamaged answer."""
    try:
        result = read()
    except Exception as error:  # noqa: BLE001 -- any refusal, as long as it says where
        message = str(error)
        assert any(name in message for name in names), (
            f"refused without naming any of {names}: {type(error).__name__}: {message}")
        return
    assert _same(result, reference), f"read a different stack in silence after damaging {names}"


# ---------------------------------------------------------------- damages


def _date_tokens(date: str) -> list[str]:
    """How a date appears in the file names of the formats: 20200101 and 01Jan2020."""
    year, month, day = date.split("-")
    return [f"{year}{month}{day}", f"{day}{MONTHS[int(month) - 1]}{year}"]


def _rename_dates(root: Path, mapping: dict[str, str]) -> list[str]:
    """Rename every file and folder under ``root`` by the date mapping (swaps allowed)."""
    pairs = []
    for old, new in mapping.items():
        pairs += list(zip(_date_tokens(old), _date_tokens(new), strict=True))
    names = []
    paths = list(root.rglob("*"))
    for depth in sorted({len(p.parts) for p in paths}, reverse=True):
        moved = []
        for path in (p for p in paths if len(p.parts) == depth):
            name = path.name
            for index, (old, _) in enumerate(pairs):
                name = name.replace(old, f"@{index}@")
            for index, (_, new) in enumerate(pairs):
                name = name.replace(f"@{index}@", new)
            if name != path.name:
                names += [path.name, name]
                # through a temporary name, so that two swapped names never collide
                moved.append((path.rename(path.with_name(f"{name}.moving")), name))
        for path, name in moved:
            path.rename(path.with_name(name))
    return names


def damage_dates_swapped(root, fmt, dates, data) -> list[str]:
    first, second = data.draw(st.lists(st.sampled_from(dates), min_size=2, max_size=2,
                                       unique=True))
    return _rename_dates(root, {first: second, second: first})


def damage_date_changed(root, fmt, dates, data) -> list[str]:
    old = data.draw(st.sampled_from(dates))
    shift = data.draw(st.integers(1, 5))
    new = str(np.datetime64(old) + np.timedelta64(shift, "D"))
    return _rename_dates(root, {old: new})


RASTERS = {
    "doris": ["*/slave_rsmp_reramped.raw", "*/h2ph_srd.raw"],
    "gamma": ["*.rslc"],
    "isce2": ["merged/SLC/*/*.slc.full", "merged/baselines/*/????????"],
    "dimap": ["*.data/*.img"],
    "snap": ["*.znap/*_VV_*/0.0"],
    "geotiff": ["slc_*.tif", "h2ph_*.tif"],
}


def _files(root: Path, patterns: list[str]) -> list[Path]:
    return sorted(path for pattern in patterns for path in root.glob(pattern))


def damage_raster_size(root, fmt, dates, data) -> list[str]:
    path = data.draw(st.sampled_from(_files(root, RASTERS[fmt])))
    content = path.read_bytes()
    if data.draw(st.booleans()):
        path.write_bytes(content[:-data.draw(st.integers(1, len(content)))])
    else:
        path.write_bytes(content + bytes(data.draw(st.integers(1, 64))))
    return [path.name]


def _swap_files(first: Path, second: Path) -> None:
    content = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(content)


def _swap_lines(first: Path, second: Path, keep) -> None:
    """Swap the lines that ``keep`` selects between two text files of the same layout."""
    a, b = (p.read_text().splitlines(keepends=True) for p in (first, second))
    chosen = [i for i, line in enumerate(a) if keep(i, line, a)]
    for i in chosen:
        a[i], b[i] = b[i], a[i]
    first.write_text("".join(a))
    second.write_text("".join(b))


def _in_orbit_block(i, line, lines) -> bool:
    before = "".join(lines[:i])
    return before.rfind("*_Start_precise_orbits") > before.rfind("* End_precise_orbits")


def damage_orbits_swapped(root, fmt, dates, data) -> list[str]:
    first, second = data.draw(st.lists(st.sampled_from(dates), min_size=2, max_size=2,
                                       unique=True))
    one, two = (_date_tokens(d) for d in (first, second))
    if fmt == "doris":
        files = [root / d[0] / "slave.res" for d in (one, two)]
        _swap_lines(*files, _in_orbit_block)
    elif fmt == "gamma":
        files = [root / f"r{d[0]}.rslc.par" for d in (one, two)]
        _swap_lines(*files, lambda i, line, _: line.startswith(
            ("state_vector_", "time_of_first_state_vector", "number_of_state_vectors")))
    elif fmt == "isce2":
        files = [next(root.glob(f"baselines/*_{d[0]}/*.txt"), None) for d in (one, two)]
        files = [f for f in files if f is not None]
        if len(files) < 2:                 # the reference has no baseline file of its own
            return []
        _swap_files(*files)
    elif fmt == "snap":
        files = [next(root.glob(f"{d[0]}-*/SNAP/product_metadata.json")) for d in (one, two)]
        _swap_files(*files)
    elif fmt == "dimap":
        return _swap_dimap_orbits(root, data)
    else:
        return []
    return [f.name for f in files] + [f.parent.name for f in files]


def _swap_dimap_orbits(root, data) -> list[str]:
    dim = next(root.glob("*.dim"))
    tree = ET.parse(dim)
    blocks = [e for e in tree.iter("MDElem") if e.get("name") == "Orbit_State_Vectors"]
    i, j = data.draw(st.lists(st.integers(0, len(blocks) - 1), min_size=2, max_size=2,
                              unique=True))
    a, b = list(blocks[i]), list(blocks[j])
    for block, children in ((blocks[i], b), (blocks[j], a)):
        for child in list(block):
            block.remove(child)
        block.extend(children)
    tree.write(dim, encoding="ISO-8859-1", xml_declaration=True)
    return [dim.name, "Orbit_State_Vectors"]


def _edit(path: Path, pattern: str, replacement: str) -> bool:
    text = path.read_text()
    edited = re.sub(pattern, replacement, text, flags=re.MULTILINE | re.DOTALL)
    path.write_text(edited)
    return edited != text


def damage_byte_order(root, fmt, dates, data) -> list[str]:
    if fmt == "dimap":
        path = data.draw(st.sampled_from(_files(root, ["*.data/*.hdr"])))
        _edit(path, r"^byte order = (\d)", lambda m: f"byte order = {1 - int(m[1])}")
        return [path.name, "byte order"]
    if fmt == "isce2":
        path = data.draw(st.sampled_from(_files(root, ["merged/SLC/*/*.slc.full.xml",
                                                       "merged/SLC/*/*.slc.full.vrt"])))
        if path.suffix == ".xml":
            _edit(path, r'(name="byte_order">\s*<value>)(\w)',
                  lambda m: m[1] + ("b" if m[2] == "l" else "l"))
            return [path.name, "byte_order"]
        _edit(path, r"<ByteOrder>(\w+)</ByteOrder>",
              lambda m: f"<ByteOrder>{'MSB' if m[1] == 'LSB' else 'LSB'}</ByteOrder>")
        return [path.name, "ByteOrder"]
    if fmt == "snap":
        path = data.draw(st.sampled_from(_files(root, ["*.znap/*_VV_*/.zarray"])))
        meta = json.loads(path.read_text())
        meta["dtype"] = ("<" if meta["dtype"][0] == ">" else ">") + meta["dtype"][1:]
        path.write_text(json.dumps(meta))
        return [path.parent.name, "dtype", "byte order"]
    if fmt == "geotiff":
        path = data.draw(st.sampled_from(_files(root, ["slc_*.tif"])))
        content = path.read_bytes()
        path.write_bytes((b"MM" if content[:2] == b"II" else b"II") + content[2:])
        return [path.name]
    return []


#: Header fields whose loss changes what a reader can know: (files, field name, its pattern).
FIELDS = {
    "doris": [("*/slave.res", name, rf"^{re.escape(name)}.*?\n") for name in (
        "First_pixel_azimuth_time (UTC):", "Number_of_lines_original:",
        "Number_of_pixels_original:", "Radar_wavelength (m):", "Data_output_format:")],
    "gamma": [("*.rslc.par", name, rf"^{name}:.*?\n") for name in (
        "date", "range_samples", "azimuth_lines", "image_format", "radar_frequency",
        "start_time")],
    "isce2": [("merged/SLC/*/*.slc.full.xml", name,
               rf'<property name="{name}">.*?</property>\s*') for name in (
        "width", "length", "file_name", "data_type", "byte_order")],
    "dimap": [("*.data/*.hdr", name, rf"^{name} = .*?\n") for name in (
        "samples", "lines", "data type", "byte order", "header offset")],
    "snap": [("*.znap/*_VV_*/.zarray", name, None) for name in ("shape", "dtype", "chunks")],
}


def damage_field_removed(root, fmt, dates, data) -> list[str]:
    if fmt not in FIELDS:
        return []
    pattern_files, name, pattern = data.draw(st.sampled_from(FIELDS[fmt]))
    path = data.draw(st.sampled_from(_files(root, [pattern_files])))
    if pattern is None:
        meta = json.loads(path.read_text())
        del meta[name]
        path.write_text(json.dumps(meta))
        return [path.parent.name, name]
    _edit(path, pattern, "")
    return [path.name, name.rstrip(":")]


def damage_reference_outside(root, fmt, dates, data) -> list[str]:
    """A reference inside the product pointing to another epoch's raster outside its folder."""
    outside = root.parent / "outside"
    outside.mkdir()
    if fmt == "dimap":
        dim = next(root.glob("*.dim"))
        hrefs = re.findall(r'DATA_FILE_PATH href="([^"]+)"', dim.read_text())
        target, other = data.draw(st.lists(st.sampled_from(
            [h for h in hrefs if Path(h).name.startswith("i_")]), min_size=2, max_size=2,
            unique=True))
        for suffix in (".hdr", ".img"):
            shutil.copy(root / Path(other).with_suffix(suffix),
                        outside / Path(target).with_suffix(suffix).name)
        new = f"../outside/{Path(target).name}"
        _edit(dim, rf'href="{re.escape(target)}"', f'href="{new}"')
        return [dim.name, Path(target).name, new, "DATA_FILE_PATH"]
    if fmt == "isce2":
        xmls = _files(root, ["merged/SLC/*/*.slc.full.xml"])
        target, other = data.draw(st.lists(st.sampled_from(xmls), min_size=2, max_size=2,
                                           unique=True))
        raster = outside / target.with_suffix("").name
        shutil.copy(other.with_suffix(""), raster)
        _edit(target, r'(name="file_name">\s*<value>)[^<]*', lambda m: m[1] + str(raster))
        return [target.name, str(raster), "file_name"]
    return []


DAMAGES = {
    "orbits_swapped": damage_orbits_swapped,
    "dates_swapped": damage_dates_swapped,
    "date_changed": damage_date_changed,
    "raster_size": damage_raster_size,
    "byte_order": damage_byte_order,
    "field_removed": damage_field_removed,
    "reference_outside": damage_reference_outside,
}

#: The (format, damage) pairs where the damage has a meaning for the format.
APPLICABLE = {
    "doris": ["orbits_swapped", "dates_swapped", "date_changed", "raster_size",
              "field_removed"],
    "gamma": ["orbits_swapped", "dates_swapped", "date_changed", "raster_size",
              "field_removed"],
    "isce2": ["orbits_swapped", "dates_swapped", "date_changed", "raster_size", "byte_order",
              "field_removed", "reference_outside"],
    "dimap": ["orbits_swapped", "dates_swapped", "date_changed", "raster_size", "byte_order",
              "field_removed", "reference_outside"],
    "snap": ["orbits_swapped", "dates_swapped", "date_changed", "raster_size", "byte_order",
             "field_removed"],
    "geotiff": ["dates_swapped", "date_changed", "raster_size", "byte_order"],
}

def _cases():
    for fmt, damages in APPLICABLE.items():
        for damage in damages:
            yield pytest.param(fmt, damage, id=f"{fmt}-{damage}")


@pytest.mark.parametrize(("fmt", "damage"), list(_cases()))
@PROPERTY
@given(data=st.data())
def test_damaged_stack_is_refused_by_name_or_read_unchanged(written, fmt, damage, data):
    stack = written[fmt]
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "stack"
        shutil.copytree(stack["root"], root)
        names = DAMAGES[damage](root, fmt, stack["dates"], data)
        section = stack["section"] | {"path": str(root / Path(stack["section"]["path"])
                                                  .relative_to(stack["root"]))}
        _refused_by_name_or_unchanged(lambda: _read(section), stack["read"], names)


# ---------------------------------------------------------------- raw interferogram layout

IFG_SHAPE = (6, 7)
IFG_REFERENCE = "20200113"
IFG_DATES = ("20200101", "20200113", "20200125", "20200206", "20200218")


@pytest.fixture(scope="module")
def interferograms(tmp_path_factory):
    """A raw single-reference stack of random complex64 pairs and amplitudes, and its read."""
    root = tmp_path_factory.mktemp("interferograms") / "stack"
    (root / "amplitude").mkdir(parents=True)
    (root / "igrams").mkdir()
    rng = np.random.default_rng(5)
    for date in IFG_DATES:
        (rng.normal(size=IFG_SHAPE) + 2.0).astype(np.float32).tofile(
            root / "amplitude" / f"{date}.amp")
        if date == IFG_REFERENCE:
            continue
        pair = f"{date}_{IFG_REFERENCE}" if date < IFG_REFERENCE else f"{IFG_REFERENCE}_{date}"
        values = rng.normal(size=IFG_SHAPE) + 1j * rng.normal(size=IFG_SHAPE)
        values.astype(np.complex64).tofile(root / "igrams" / f"{pair}.int")
    return root, _read_interferograms(root)


def _read_interferograms(root: Path):
    return from_interferograms(root, wavelength=0.0556, shape=IFG_SHAPE).compute()


def _damage_interferograms(root: Path, data) -> list[str]:
    kind = data.draw(st.sampled_from(["truncated", "renamed", "amplitude_removed",
                                      "second_reference"]))
    files = sorted(root.glob("igrams/*.int"))
    path = data.draw(st.sampled_from(files))
    if kind == "truncated":
        content = path.read_bytes()
        path.write_bytes(content[:-data.draw(st.integers(1, len(content)))])
        return [path.name]
    if kind == "renamed":
        new = path.name.replace("2020", "2019", 1)
        path.rename(path.with_name(new))
        changed = new[:8]
        return [path.name, new, f"{changed[:4]}-{changed[4:6]}-{changed[6:]}"]
    if kind == "amplitude_removed":
        amplitude = data.draw(st.sampled_from(sorted((root / "amplitude").glob("*.amp"))))
        amplitude.unlink()
        date = amplitude.stem
        return [amplitude.name, f"{date[:4]}-{date[4:6]}-{date[6:]}"]
    new = "20200125_20200206.int"
    shutil.copy(path, root / "igrams" / new)
    return [new]


@PROPERTY
@given(data=st.data())
def test_damaged_interferograms_are_refused_by_name_or_read_unchanged(interferograms, data):
    reference_root, reference = interferograms
    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "stack"
        shutil.copytree(reference_root, root)
        names = _damage_interferograms(root, data)
        _refused_by_name_or_unchanged(lambda: _read_interferograms(root), reference, names)
