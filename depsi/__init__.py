"""depsi: Persistent Scatterer InSAR time-series analysis on space-time matrices.

``import depsi`` registers the ``.stm`` accessor on xarray Datasets and exposes the store
functions; the processing steps live in :mod:`depsi.processing`, the simulator in
:mod:`depsi.simulate`, the batched kernels in :mod:`depsi.kernels`.
"""

import logging

from depsi.io import append_epochs, from_csv, open_stm, save_stm
from depsi.kernels import configure_devices
from depsi.stm import STMValidationError, validate

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "STMValidationError",
    "__version__",
    "append_epochs",
    "configure_devices",
    "from_csv",
    "open_stm",
    "save_stm",
    "validate",
]
