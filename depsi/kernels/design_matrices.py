"""Temporal models of a point's displacement: design matrices (time baselines come from
:func:`depsi.conventions.years_since`).

Columns are in metres of displacement per unit of each coefficient, so the coefficients come out in
SI units (m, m/yr) and one design serves every displacement-type observation. Under the phase model
of docs/design.md, "Conventions: signs and units", ``phase = m2ph * (displacement + h2ph *
height_error)``, the height error enters like a displacement of ``h2ph * height_error`` metres: its
column is ``h2ph``. Pass ``wavelength`` to get the same design in radians (every column times
``m2ph``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from depsi.conventions import phase_per_metre
from depsi.kernels.backend import array_namespace

#: Terms :func:`design_matrix` knows, with the unit of their coefficient.
TERM_UNITS = {
    "offset": "m",
    "velocity": "m/yr",
    "height_error": "m",
    "seasonal": "m",  # two columns: seasonal_sin, seasonal_cos
}


def design_matrix(
    time_years: Any,
    *,
    terms: Sequence[str] = ("offset", "velocity"),
    h2ph: Any | None = None,
    extra: Mapping[str, Any] | None = None,
    wavelength: float | None = None,
) -> tuple[Any, list[str]]:
    """Design matrix of a temporal displacement model.

    Parameters
    ----------
    time_years : (T,)
        Time baselines in years (:func:`depsi.conventions.years_since`).
    terms
        Any of ``"offset"`` (column 1), ``"velocity"`` (``t``), ``"height_error"`` (``h2ph``),
        ``"seasonal"`` (annual ``sin(2 pi t)`` and ``cos(2 pi t)``, named ``seasonal_sin`` and
        ``seasonal_cos``), in the order given.
    h2ph : (T,) or (K, T), optional
        Height-to-phase factors; needed for ``"height_error"``. Per-point values give one design
        per point.
    extra
        User regressors appended after ``terms``, name to values ``(T,)`` or ``(K, T)`` in metres
        of displacement per unit of the coefficient (e.g. temperature in K: coefficient m/K).
    wavelength
        If given, every column is multiplied by ``m2ph = -4 pi / wavelength``: the design of
        (unwrapped) phase in radians, coefficients still in metres.

    Returns
    -------
    A : (T, P) or (K, T, P)
        Shared design, or one per point when ``h2ph`` or an extra regressor is per point.
    names : list of str
        The name of each column (the coefficient it multiplies).

    Examples
    --------
    >>> A, names = design_matrix(np.array([0.0, 0.5, 1.0]), terms=("offset", "velocity"))
    >>> names, A[:, 1].tolist()
    (['offset', 'velocity'], [0.0, 0.5, 1.0])
    >>> A, names = design_matrix(np.zeros(4), terms=("seasonal",),
    ...                          extra={"temperature": np.ones(4)})
    >>> names
    ['seasonal_sin', 'seasonal_cos', 'temperature']
    """
    xp = array_namespace(time_years, h2ph, *(extra or {}).values())
    t = xp.asarray(time_years, dtype=xp.float64)
    if t.ndim != 1:
        raise ValueError(f"time_years: expected shape (T,), found {tuple(t.shape)}")
    T = t.shape[0]
    columns: list[Any] = []
    names: list[str] = []
    for term in terms:
        if term == "offset":
            columns.append(xp.ones(T))
            names.append("offset")
        elif term == "velocity":
            columns.append(t)
            names.append("velocity")
        elif term == "height_error":
            if h2ph is None:
                raise ValueError("term 'height_error' needs h2ph, of shape (T,) or (K, T)")
            columns.append(xp.asarray(h2ph, dtype=xp.float64))
            names.append("height_error")
        elif term == "seasonal":
            columns += [xp.sin(2 * np.pi * t), xp.cos(2 * np.pi * t)]
            names += ["seasonal_sin", "seasonal_cos"]
        else:
            raise ValueError(f"terms: expected names from {sorted(TERM_UNITS)}, found {term!r}")
    for name, values in (extra or {}).items():
        if name in names:
            raise ValueError(f"extra regressor {name!r}: the name is already a term")
        columns.append(xp.asarray(values, dtype=xp.float64))
        names.append(str(name))
    if not columns:
        raise ValueError("design_matrix: expected at least one term or extra regressor")
    lead = [c.shape[:-1] for c in columns if c.ndim == 2]
    for c, name in zip(columns, names):
        if c.shape[-1] != T or c.ndim > 2:
            raise ValueError(f"{name}: expected shape (T={T},) or (K, T={T}), "
                             f"found {tuple(c.shape)}")
    if lead:
        K = lead[0][0]
        if any(shape[0] != K for shape in lead):
            raise ValueError(f"per-point regressors: expected one K, found {sorted(set(lead))}")
        A = xp.stack([xp.broadcast_to(c, (K, T)) for c in columns], axis=-1)
    else:
        A = xp.stack(columns, axis=-1)
    if wavelength is not None:
        A = A * phase_per_metre(wavelength)
    return A, names
