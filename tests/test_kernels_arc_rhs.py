"""The compiled formation of the arcs' right-hand sides against its NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.kernels import arc_rhs_numba


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32])
def test_formed_rows_are_the_references_to_the_bit(dtype):
    """Every row, with phases at -pi and pi, a missing epoch, differences past pi either way
    and any cycles' dtype: the NumPy rows exactly (the wrap's float32 constants and order)."""
    rng = np.random.default_rng(11)
    n, n_epochs, m = 2000, 31, 60_000
    phase = rng.uniform(-np.pi, np.pi, (n, n_epochs)).astype(np.float32)
    phase[:50] = np.float32(np.pi)
    phase[50:100] = np.float32(-np.pi)
    phase[100:120] = np.nextafter(np.float32(np.pi), np.float32(0))
    phase[7, 3] = np.nan
    source = rng.integers(0, n, m)
    target = rng.integers(0, n, m)
    motion = rng.normal(size=(m, 2)).astype(np.float32)
    info = np.iinfo(dtype)
    cycles = rng.integers(max(info.min, -1000), min(info.max, 1000), (m, n_epochs)).astype(dtype)
    rows = rng.permutation(m)[: m // 2]
    got = arc_rhs_numba.form_rows(phase, source, target, rows, motion, cycles)
    expected = arc_rhs_numba.form_rows_reference(phase, source, target, rows, motion, cycles)
    assert np.isnan(expected).any()
    np.testing.assert_array_equal(got, expected)
