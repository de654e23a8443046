"""The space-time matrix data model: conventions, validation, spatial order, ``.stm`` accessor."""

from depsi.stm import accessor as _accessor  # noqa: F401  (registers the .stm accessor)
from depsi.stm.order import morton_key, morton_order
from depsi.stm.schema import DIMS, STMValidationError, validate, years_since_mother

__all__ = ["DIMS", "STMValidationError", "morton_key", "morton_order", "validate",
           "years_since_mother"]
