"""The conventions module: phase wrapping, m2ph, time baselines, sentinels, constants; and the
guard that no module of depsi defines a second copy of them."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from depsi.conventions import (
    DAYS_PER_YEAR,
    MISSING_AMBIGUITY,
    MONTH_ABBREVIATIONS,
    MONTH_NUMBERS,
    SPEED_OF_LIGHT,
    phase_per_metre,
    wrap_phase,
    years_since,
)
from depsi.stm.schema import STMValidationError, years_since_mother

SOURCE = Path(__file__).resolve().parents[1] / "depsi"


# ------------------------------------------------------------------------------ phase wrapping
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wrap_phase_is_half_open_at_minus_pi_and_keeps_nan(dtype):
    pi = dtype(np.pi)
    phase = np.array([pi, -pi, 3 * pi, -3 * pi, 0.0, np.nan], dtype=dtype)
    wrapped = wrap_phase(phase)
    assert wrapped.dtype == dtype
    np.testing.assert_array_equal(wrapped[[0, 1, 4]], [pi, pi, 0.0])
    # odd multiples of pi, rounded to the dtype, lie an ulp or so to either side of the
    # boundary: pi, or the first value above -pi (never -pi itself)
    assert (wrapped[2:4] > -pi).all()
    np.testing.assert_allclose(np.abs(wrapped[2:4]), [pi, pi], rtol=4 * np.finfo(dtype).eps)
    assert np.isnan(wrapped[5])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wrap_phase_stays_within_minus_pi_exclusive_to_pi(dtype):
    phase = np.random.default_rng(0).uniform(-40, 40, 200_000).astype(dtype)
    near = np.array([np.nextafter(dtype(np.pi), dtype(s * 10)) for s in (-1, 1)]
                    + [np.nextafter(dtype(-np.pi), dtype(s * 10)) for s in (-1, 1)], dtype=dtype)
    wrapped = wrap_phase(np.concatenate([phase, near]))
    assert (wrapped > -dtype(np.pi)).all() and (wrapped <= dtype(np.pi)).all()
    # the same angle: a whole number of turns away, to the rounding of the input's dtype
    turns = (np.concatenate([phase, near]).astype(np.float64) - wrapped) / (2 * np.pi)
    np.testing.assert_allclose(turns, np.rint(turns), atol=1e-5 if dtype == np.float32 else 1e-12)


def test_wrap_phase_keeps_dask_lazy_and_xarray_labels():
    values = np.linspace(-10, 10, 12)
    lazy = wrap_phase(da.from_array(values, chunks=4))
    assert isinstance(lazy, da.Array)
    labelled = wrap_phase(xr.DataArray(values, dims="time"))
    assert isinstance(labelled, xr.DataArray) and labelled.dims == ("time",)
    np.testing.assert_array_equal(lazy.compute(), wrap_phase(values))
    np.testing.assert_array_equal(labelled.values, wrap_phase(values))


# ------------------------------------------------------------------------------------- m2ph
def test_phase_per_metre_is_minus_four_pi_over_wavelength():
    assert phase_per_metre(0.056) == -4 * np.pi / 0.056
    assert phase_per_metre(np.float32(0.0555)) == pytest.approx(-226.42, abs=0.01)


@pytest.mark.parametrize("bad", [0.0, -0.05, np.nan])
def test_phase_per_metre_refuses_a_wavelength_that_is_not_positive(bad):
    with pytest.raises(ValueError, match="wavelength: expected a positive length"):
        phase_per_metre(bad)


# --------------------------------------------------------------------------- time baselines
def test_years_since_counts_julian_years_from_the_named_origin():
    time = np.array(["2020-01-01", "2020-01-13", "2024-01-01"], dtype="datetime64[ns]")
    np.testing.assert_allclose(years_since(time, time[0]), [0.0, 12 / 365.25, 1461 / 365.25])
    assert years_since(time, "2020-01-13")[0] == pytest.approx(-12 / DAYS_PER_YEAR)
    assert years_since(time.astype(str), time[1])[1] == 0.0
    assert years_since(time, time[0]).dtype == np.float64


def test_years_since_refuses_numbers_for_dates():
    with pytest.raises(ValueError, match="times: expected datetime64"):
        years_since(np.arange(3), 0)


def test_years_since_mother_uses_mother_time_else_the_first_epoch():
    time = np.array(["2020-01-01", "2020-01-13", "2020-01-25"], dtype="datetime64[ns]")
    ds = xr.Dataset(coords={"time": time})
    np.testing.assert_array_equal(years_since_mother(ds), years_since(time, time[0]))
    ds.attrs["mother_time"] = "2020-01-13T00:00:00"
    np.testing.assert_array_equal(years_since_mother(ds), years_since(time, time[1]))
    with pytest.raises(STMValidationError, match="time.*datetime64.*assign"):
        years_since_mother(xr.Dataset(coords={"time": np.arange(3)}))


# ------------------------------------------------------------------- sentinels and constants
def test_missing_ambiguity_is_the_int32_minimum_not_a_valid_small_ambiguity():
    assert MISSING_AMBIGUITY == np.iinfo(np.int32).min
    assert np.int32(MISSING_AMBIGUITY) == MISSING_AMBIGUITY


def test_constants_and_month_names():
    assert SPEED_OF_LIGHT == 299792458.0 and DAYS_PER_YEAR == 365.25
    assert len(MONTH_ABBREVIATIONS) == 12 and MONTH_ABBREVIATIONS[2] == "Mar"
    assert MONTH_NUMBERS["mar"] == 3 and MONTH_NUMBERS["dec"] == 12


# ------------------------------------------------------------ one definition in all of depsi
#: Functions and constants that only depsi/conventions.py may define.
CONVENTION_NAMES = {"wrap_phase", "phase_per_metre", "phase_to_metres", "years_since",
                    "time_in_years", "MISSING_AMBIGUITY", "SPEED_OF_LIGHT", "DAYS_PER_YEAR",
                    "MONTH_ABBREVIATIONS", "MONTH_NUMBERS", "_MONTHS"}
#: Numbers that only depsi/conventions.py may write: days per year, the speed of light.
CONVENTION_NUMBERS = {365.25, 299792458}
#: Text patterns of a second copy (in code, not in comments or docstrings).
CONVENTION_PATTERNS = ("def wrap_phase", "4 * np.pi /", "4.0 * np.pi /", "4*np.pi/", "365.25",
                       "299792458", "299_792_458")


def _modules():
    return [p for p in sorted(SOURCE.rglob("*.py")) if p.name != "conventions.py"
            or p.parent != SOURCE]


def _code_without_strings_and_comments(text: str) -> str:
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            continue
        if token.type == getattr(tokenize, "FSTRING_MIDDLE", None):
            continue
        kept.append(token.string)
    return " ".join(kept)


def _second_copies(path: Path) -> list[str]:
    text = path.read_text()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name in CONVENTION_NAMES):
            found.append(f"defines {node.name}() (line {node.lineno})")
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id in CONVENTION_NAMES:
                found.append(f"assigns {target.id} (line {node.lineno})")
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and (
                not isinstance(node.value, bool) and node.value in CONVENTION_NUMBERS):
            found.append(f"writes the number {node.value} (line {node.lineno})")
        if isinstance(node, ast.Constant) and node.value in ("Jan", "jan"):
            found.append(f"spells month names (line {node.lineno})")
    code = " ".join(_code_without_strings_and_comments(text).split())
    squeezed = code.replace(" ", "")
    for pattern in CONVENTION_PATTERNS:
        if pattern in code or pattern.replace(" ", "") in squeezed:
            found.append(f"contains {pattern!r}")
    return found


def test_no_module_defines_a_second_copy_of_a_convention():
    copies = {str(p.relative_to(SOURCE.parent)): c for p in _modules() if (c := _second_copies(p))}
    assert not copies, f"define these in depsi/conventions.py only: {copies}"


def test_the_guard_finds_a_second_copy(tmp_path):
    copy = tmp_path / "copy.py"
    copy.write_text("import numpy as np\n\n\ndef wrap_phase(p):\n    return p\n\n\n"
                    "M2PH = -4 * np.pi / 0.0555  # m2ph\nYEAR = 365.25\nC = 299_792_458.0\n"
                    'DOC = "years of 365.25 days"  # strings and comments are fine\n')
    found = _second_copies(copy)
    assert any("wrap_phase" in f for f in found)
    assert any("4 * np.pi /" in f for f in found)
    assert any("365.25" in f for f in found) and any("299792458" in f for f in found)
    assert not any("DOC" in f for f in found)
