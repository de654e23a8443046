"""Bounded work: hostile metadata files are parsed in linear time or refused at once, and a
configuration whose work cannot fit the machine is refused before any step runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from depsi.io.bounded import MetadataError, parse_xml
from depsi.io.dimap import _read_envi_header
from depsi.io.gamma_par import parse_par
from depsi.io.isce2 import read_image_header
from depsi.io.metadata import read_metadata
from depsi.pipeline.config import parse_config
from depsi.pipeline.preflight import (
    ResourceLimitError,
    check_feasible,
    claimed_vs_stored,
    periodogram_task_bytes,
)

MB = 2**20

# hostile bodies, by name: (prefix, repeated unit); sized to n bytes
TEXT_BODIES = {
    "one giant line": ("", " "),
    "many lines": ("", "a b\n"),
    "huge number field": ("Radar_wavelength (m): ", "1"),
    "colon-less words": ("", "a "),
}


def _write(path: Path, head: str, unit: str, size: int, tail: str = "x") -> Path:
    body = unit * max(1, (size - len(head)) // len(unit))
    path.write_text(head + body + tail)
    return path


def _timed(parse, path: Path) -> float:
    began = time.perf_counter()
    try:
        parse(path)
    except (ValueError, FileNotFoundError):
        pass
    return time.perf_counter() - began


def _sparse(path: Path, size: int, head: bytes = b"") -> Path:
    with open(path, "wb") as handle:
        handle.write(head)
        handle.truncate(size)
    return path


PARSERS = {
    "doris": (lambda p: read_metadata(p, driver="doris5"), "DVersion: x\n*_Start_readfiles:\n"),
    "gamma": (parse_par, "title: x\n"),
    "envi": (_read_envi_header, "ENVI\n"),
}


@pytest.mark.parametrize("body", sorted(TEXT_BODIES))
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_hostile_text_metadata_parses_in_linear_time(tmp_path, parser, body):
    parse, header = PARSERS[parser]
    head, unit = TEXT_BODIES[body]
    small = _timed(parse, _write(tmp_path / "small", header + head, unit, 1 * MB // 10))
    large = _timed(parse, _write(tmp_path / "large", header + head, unit, 1 * MB))
    assert large < 20 * max(small, 0.05)
    assert large < 5.0


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_a_100_mb_text_metadata_file_is_refused_at_once(tmp_path, parser):
    parse, header = PARSERS[parser]
    path = _sparse(tmp_path / "huge", 100 * MB, header.encode())
    began = time.perf_counter()
    with pytest.raises(MetadataError, match=r"huge.*at most \d+ bytes, found 104857600 bytes"):
        parse(path)
    assert time.perf_counter() - began < 2.0


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_a_line_over_the_limit_is_refused_naming_the_file(tmp_path, parser):
    parse, header = PARSERS[parser]
    path = _write(tmp_path / "long.txt", header, " ", MB // 2)
    with pytest.raises(MetadataError, match=r"long\.txt.*lines of at most 65536 characters"):
        parse(path)


def test_an_entity_bomb_is_refused_before_parsing(tmp_path):
    bomb = ('<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">'
            + "".join(f'<!ENTITY lol{i} "{"&lol%s;" % (i - 1 if i > 1 else "") * 10}">'
                      for i in range(1, 10))
            + ']>\n<imageFile>&lol9;</imageFile>\n')
    path = tmp_path / "slc.xml"
    path.write_text(bomb)
    began = time.perf_counter()
    with pytest.raises(MetadataError, match="DOCTYPE"):
        parse_xml(path, what="ISCE2 image header")
    with pytest.raises(MetadataError, match="DOCTYPE"):
        read_image_header(path.with_suffix(""))
    assert time.perf_counter() - began < 1.0


def test_deeply_nested_xml_is_refused_while_parsing(tmp_path):
    path = tmp_path / "deep.dim"
    depth = 10**6
    path.write_text("<a>" * depth + "</a>" * depth)
    began = time.perf_counter()
    with pytest.raises(MetadataError, match="nested at most 256"):
        parse_xml(path, what="DIMAP product")
    assert time.perf_counter() - began < 2.0


def test_a_100_mb_xml_file_is_refused_at_once(tmp_path):
    path = _sparse(tmp_path / "huge.xml", 100 * MB, b"<imageFile>")
    began = time.perf_counter()
    with pytest.raises(MetadataError, match="found 104857600 bytes"):
        parse_xml(path, what="ISCE2 image header")
    assert time.perf_counter() - began < 2.0


def test_xml_with_a_huge_text_field_parses_in_linear_time(tmp_path):
    times = []
    for size in (MB // 10, MB):
        path = tmp_path / f"field{size}.xml"
        path.write_text("<imageFile><property name='width'><value>" + "1" * size
                        + "</value></property></imageFile>")
        began = time.perf_counter()
        parse_xml(path, what="ISCE2 image header")
        times.append(time.perf_counter() - began)
    assert times[1] < 20 * max(times[0], 0.01)


# ------------------------------------------------------------------------------- preflight
def test_defaults_pass_preflight():
    report = check_feasible(parse_config({}))
    assert report["arcs"]["grid_nodes"] < 10**5


def test_a_fine_height_step_is_refused_naming_the_key_and_bytes():
    with pytest.raises(ResourceLimitError, match=r"arcs\.height_step: .*\d+ bytes"):
        check_feasible(parse_config({"arcs": {"height_step": 1e-4}}))


def test_a_grid_over_the_memory_limit_names_predicted_bytes_and_limit():
    config = parse_config({"arcs": {"velocity_step": 1e-7}})
    with pytest.raises(ResourceLimitError, match=r"arcs\.velocity_step: .* needs \d+ bytes.*"
                                                 r"expected at most 800000000 bytes"):
        check_feasible(config, memory_bytes=10**9)


def test_a_fine_height_step_stops_the_run_before_any_step(tmp_path):
    from depsi.pipeline.runner import run_pipeline

    config = parse_config({"arcs": {"height_step": 1e-4},
                           "input": {"simulate": {"shape": [20, 20], "n_epochs": 5}},
                           "output": {"workspace": str(tmp_path / "ws")}})
    with pytest.raises(ResourceLimitError, match=r"arcs\.height_step"):
        run_pipeline(config, progress=False)
    written = [p for p in (tmp_path / "ws").rglob("*") if p.is_dir() or p.suffix != ".log"] \
        if (tmp_path / "ws").exists() else []
    assert not [p for p in written if p.name.endswith(".zarr")]


def test_a_million_threads_are_refused():
    with pytest.raises(ResourceLimitError, match=r"compute\.threads: expected at most"):
        check_feasible(parse_config({"compute": {"threads": 10**6}}))


def test_a_simulated_scene_larger_than_the_disk_is_refused():
    config = parse_config({"input": {"simulate": {"shape": [10**6, 10**6], "n_epochs": 100}}})
    with pytest.raises(ResourceLimitError, match=r"input\.simulate\.shape: .* bytes on disk"):
        check_feasible(config)


def test_a_zarr_store_claiming_a_trillion_pixels_is_refused_fast(tmp_path):
    store = tmp_path / "claims.zarr"
    (store / "complex").mkdir(parents=True)
    (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (store / "complex" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [10**6, 10**6], "chunks": [1000, 1000], "dtype": "<c8",
        "compressor": None, "fill_value": None, "filters": None, "order": "C"}))
    claimed, stored = claimed_vs_stored(store)
    assert claimed == 8 * 10**12 and stored < 10**4
    began = time.perf_counter()
    with pytest.raises(ResourceLimitError, match=r"claim 8000000000000 bytes.*hold \d+ bytes"):
        check_feasible(parse_config({"input": {"path": str(store)}}))
    assert time.perf_counter() - began < 2.0


def test_the_grid_prediction_is_within_2x_of_the_kernels_allocation():
    import tracemalloc

    from depsi.kernels.periodogram import periodogram

    T, heights, velocities = 30, 2001, 101
    rng = np.random.default_rng(0)
    phase, h2ph = rng.uniform(-np.pi, np.pi, (1, T)), rng.normal(0, 3e-4, (1, T))
    # once before tracing: the first call in a process loads the compiled kernel (about 30 MB
    # of Numba's own allocations, once per process, not per task)
    periodogram(phase, h2ph, np.linspace(0, 3, T), wavelength=0.0555, height_step=1.0,
                velocity_step=0.01, max_batch=1)
    tracemalloc.start()
    try:
        periodogram(phase, h2ph, np.linspace(0, 3, T), wavelength=0.0555, height_step=0.05,
                    velocity_step=0.001, max_batch=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    predicted = periodogram_task_bytes(heights, velocities, T)
    assert 0.5 < predicted / peak < 2.0
