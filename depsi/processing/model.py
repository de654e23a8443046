"""The import path of :mod:`depsi.processing.model_fit` before its rename: its public names, for
the code and notebooks that import them from here."""

from depsi.processing.model_fit import (
    FIT_BLOCK,
    UNITS,
    Z95,
    estimate_model,
    fit_with_atmosphere,
    point_uncertainty,
)

__all__ = [
    "FIT_BLOCK",
    "UNITS",
    "Z95",
    "estimate_model",
    "fit_with_atmosphere",
    "point_uncertainty",
]
