"""The design matrices of the temporal model (``depsi.kernels.design_matrices``), in metres
(time baselines: test_conventions)."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.conventions import phase_per_metre
from depsi.kernels.design_matrices import design_matrix


def test_design_matrix_columns_and_names():
    t = np.array([0.0, 0.25, 0.5])
    A, names = design_matrix(t, terms=("offset", "velocity", "seasonal"))
    assert names == ["offset", "velocity", "seasonal_sin", "seasonal_cos"]
    np.testing.assert_allclose(A, np.stack([np.ones(3), t, np.sin(2 * np.pi * t),
                                            np.cos(2 * np.pi * t)], axis=1), atol=1e-15)


def test_height_error_column_is_h2ph_and_per_point_h2ph_gives_one_design_per_point():
    t = np.arange(4.0)
    h2ph = np.arange(8.0).reshape(2, 4) * 1e-4
    A, names = design_matrix(t, terms=("velocity", "height_error"), h2ph=h2ph,
                             extra={"temperature": np.ones(4)})
    assert names == ["velocity", "height_error", "temperature"] and A.shape == (2, 4, 3)
    np.testing.assert_array_equal(A[:, :, 0], np.tile(t, (2, 1)))
    np.testing.assert_array_equal(A[:, :, 1], h2ph)


def test_wavelength_turns_the_design_into_radians():
    t = np.arange(3.0)
    A_m, _ = design_matrix(t, terms=("velocity",))
    A_rad, _ = design_matrix(t, terms=("velocity",), wavelength=0.056)
    np.testing.assert_allclose(A_rad, A_m * (-4 * np.pi / 0.056))
    assert phase_per_metre(0.056) == pytest.approx(-4 * np.pi / 0.056)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(terms=("acceleration",)), "terms"),
    (dict(terms=("height_error",)), "needs h2ph"),
    (dict(terms=("velocity",), extra={"velocity": np.ones(3)}), "already a term"),
    (dict(terms=("offset",), extra={"temperature": np.ones(4)}), "temperature"),
    (dict(terms=()), "at least one"),
])
def test_design_matrix_errors_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        design_matrix(np.arange(3.0), **kwargs)
