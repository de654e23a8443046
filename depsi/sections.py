"""The base of every configuration section: a strict pydantic model, and shared validators.

A section is the one home of a part's parameters and defaults (a processing step's, the
scheduler's), defined beside the code that uses it; :mod:`depsi.pipeline.config` composes them
into the configuration of ``depsi run``. This module sits at the bottom of the layers (it
imports nothing of depsi), so every layer can define its own sections.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_BYTES = re.compile(r"^\s*\d+(\.\d+)?\s*([kKmMgGtT]i?[bB]?|[bB])?\s*$")


class Section(BaseModel):
    """A configuration section: unknown keys, ``.inf``/``.nan`` and multi-line text are errors.

    Examples
    --------
    >>> from pydantic import ValidationError
    >>> class Example(Section):
    ...     size: int = 1
    >>> try:
    ...     Example(sise=2)
    ... except ValidationError as err:
    ...     err.errors()[0]["type"]
    'extra_forbidden'
    """

    # finite numbers only: .inf or .nan is never a meaningful parameter of a step
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_of_text(cls, value: Any) -> Any:
        """Strings reach log lines and batch scripts: no newlines or control characters."""
        for text in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(text, (str, Path)) and _CONTROL.search(str(text)):
                raise ValueError(f"expected one line of printable text, found control "
                                 f"character(s) in {str(text)[:60]!r}")
        return value


def check_bytes(value: str | None, *, allow_auto: bool = True) -> str | None:
    """A memory size such as ``'4GB'`` or ``'500MiB'`` (or ``'auto'``, or None) unchanged.

    Raises
    ------
    ValueError
        For anything else, naming the value.

    Examples
    --------
    >>> check_bytes("16GiB"), check_bytes("auto")
    ('16GiB', 'auto')
    """
    if value is None or (allow_auto and value == "auto") or _BYTES.match(value):
        return value
    raise ValueError(f"expected a size such as '4GB', '500MiB'{' or auto' if allow_auto else ''}, "
                     f"got {value!r}")
