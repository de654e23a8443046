"""Property-based attacks on the readers: the CSV, DORIS and config readers and
``open_stm``, fed mutated copies of valid inputs. Every input either reads or raises one of our
errors (a ``ValueError`` subclass with a message) or ``FileNotFoundError`` -- never another
exception, never a hang (each example has a deadline)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depsi.io import from_csv, open_stm, read_metadata, save_stm
from depsi.pipeline.config import example_config_yaml, load_config

FUZZ = settings(max_examples=40, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

CSV = """pnt_id,pnt_line,pnt_pixel,pnt_lat,pnt_lon,pnt_height,d_20160327,d_20160408,d_20160420
L1P1,1,1,52.1,4.3,1.5,0.0,0.001,0.002
L0P0,0,0,52.0,4.2,-0.5,0.0,-0.002,0.001
L3P2,3,2,52.3,4.4,2.0,0.0,0.0,0.003
"""

DORIS5 = """DVersion: Version (2015) (For TOPSAR)
*_Start_readfiles:
Radar_wavelength (m):                      0.055465760
First_pixel_azimuth_time (UTC):            2018-Mar-06 17:24:29.954980
Pulse_Repetition_Frequency (computed, Hz): 486.486310
Range_time_to_first_pixel (2way) (ms):     6.013024343276740
Range_sampling_rate (computed, MHz):       64.345238126
Number_of_lines_original:                  6878
Number_of_pixels_original:                 25133
* End_readfiles:_NORMAL
"""

#: Text that hostile inputs like to contain.
NASTY = st.sampled_from(["\x00", "\n", "\r\n", ",", ";", '"', "'", "nan", "inf", "-1",
                         "1e308", "&a", "*a", "!!python/object:os.system", "[", "{", "]]",
                         "99999999999999999999", "2018-Feb-30", ":", "#", "\ufeff", "é",
                         "d_20160327", "pnt_line", " ", "\t"])


@st.composite
def mutated(draw, text: str) -> str:
    """``text`` with a few random deletions, insertions and duplicated slices."""
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "nasty", "repeat", "truncate"]))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif kind == "insert":
            text = text[:at] + draw(st.text(max_size=20)) + text[at:]
        elif kind == "nasty":
            text = text[:at] + draw(NASTY) + text[at:]
        elif kind == "repeat":
            text = text[:at] + text[at:at + 30] * draw(st.integers(2, 5)) + text[at:]
        else:
            text = text[:at]
    return text


def reads_or_refuses(read, path: Path) -> None:
    try:
        read(path)
    except (ValueError, FileNotFoundError) as err:
        assert str(err), f"{type(err).__name__} without a message"


@FUZZ
@given(text=mutated(CSV))
def test_mutated_csv_reads_or_is_refused(tmp_path, text):
    path = tmp_path / "ps.csv"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    reads_or_refuses(from_csv, path)


@FUZZ
@given(text=mutated(DORIS5))
def test_mutated_doris_reads_or_is_refused(tmp_path, text):
    path = tmp_path / "slave.res"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    reads_or_refuses(read_metadata, path)


@FUZZ
@given(text=mutated(example_config_yaml()))
def test_mutated_config_reads_or_is_refused(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    reads_or_refuses(load_config, path)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    n, t = 60, 4
    rng = np.random.default_rng(3)
    position = rng.permutation(n)
    ds = xr.Dataset(
        {"amplitude": (("space", "time"), rng.random((n, t)).astype("f4")),
         "point_id": ("space", np.array([f"P{i}" for i in range(n)]))},
        coords={"time": np.arange("2020-01-01", "2020-02-18", 12, dtype="datetime64[D]")
                .astype("datetime64[ns]"),
                "azimuth": ("space", position // 8), "range": ("space", position % 8)},
        attrs={"wavelength": 0.0555})
    return save_stm(ds, tmp_path_factory.mktemp("fuzz") / "ps.zarr", chunk_bytes=300)


def _open_and_read(path: Path) -> None:
    ds = open_stm(path)
    for var in ds.variables.values():
        _ = var.values


@FUZZ
@given(data=st.data())
def test_mutated_store_opens_or_is_refused(store, tmp_path, data):
    path = Path(shutil.copytree(store, tmp_path / f"s{len(list(tmp_path.iterdir()))}.zarr"))
    files = sorted(p for p in path.rglob("*") if p.is_file())
    target = data.draw(st.sampled_from(files))
    raw = target.read_bytes()
    action = data.draw(st.sampled_from(["truncate", "flip", "delete", "garbage", "json"]))
    if action == "truncate":
        target.write_bytes(raw[:data.draw(st.integers(0, max(len(raw) - 1, 0)))])
    elif action == "flip" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        target.write_bytes(raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))])
                           + raw[i + 1:])
    elif action == "delete":
        target.unlink()
    elif action == "garbage":
        target.write_bytes(data.draw(st.binary(max_size=64)))
    elif target.name == "zarr.json":
        target.write_text(data.draw(mutated(raw.decode())))
    reads_or_refuses(_open_and_read, path)
