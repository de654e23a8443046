"""The space-time matrix data model: conventions, validation, spatial order, ``.stm`` accessor."""

from depsi.stm.order import morton_key, morton_order
from depsi.stm.schema import DIMS, STMValidationError, validate
from depsi.stm import accessor as _accessor  # registers the .stm accessor

__all__ = ["DIMS", "STMValidationError", "morton_key", "morton_order", "validate"]
