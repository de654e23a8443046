"""depsi: Persistent Scatterer InSAR time-series analysis on space-time matrices."""

import logging

from depsi.stm import STMValidationError, validate

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["STMValidationError", "__version__", "validate"]
