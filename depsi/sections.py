"""The base of every configuration section: a strict pydantic model, and shared validators.

A section is the one home of a part's parameters and defaults (a processing step's, the
scheduler's), defined beside the code that uses it; :mod:`depsi.pipeline.config` composes them
into the configuration of ``depsi run``. This module sits at the bottom of the layers (it
imports nothing of depsi), so every layer can define its own sections.

Examples
--------
>>> from pydantic import Field
>>> class Demo(Section):
...     k: int = Field(3, ge=1, description="Neighbours.")
>>> Demo(k=4).k
4
>>> Demo(k=2.0).k  # a whole number written as a float is still a count
2
"""

from __future__ import annotations

import datetime
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


def iso_dates(values: Any) -> Any:
    """``values`` with each ``datetime.date`` or ``datetime.datetime`` as ISO text (YAML reads
    an unquoted ``2023-01-06`` as a date); a datetime at midnight as its date alone. Anything
    else is left for the field's own validation.

    Examples
    --------
    >>> iso_dates([datetime.date(2023, 1, 6), datetime.datetime(2023, 1, 18), "2023-01-30"])
    ['2023-01-06', '2023-01-18', '2023-01-30']
    """
    def text(value: Any) -> Any:
        if isinstance(value, datetime.datetime):
            return (value.date().isoformat() if value.time() == datetime.time()
                    and value.tzinfo is None else value.isoformat())
        return value.isoformat() if isinstance(value, datetime.date) else value

    return [text(value) for value in values] if isinstance(values, (list, tuple)) else values


def ordered_pair(pair: tuple[float, float], name: str) -> tuple[float, float]:
    """``pair`` when ``pair[0] < pair[1]``, else a ValueError naming ``name``."""
    if not pair[0] < pair[1]:
        raise ValueError(f"{name}: expected [low, high] with low < high, got {list(pair)}")
    return pair


def describe_errors(err: Any) -> list[str]:
    """One line per problem of a pydantic ``ValidationError``: the dotted key, what was
    expected and (cut to 200 characters) the value found."""
    lines = []
    for error in err.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown key {key!r}")
        elif error["type"] == "value_error" or "input" not in error:
            lines.append(f"{key}: {message}")
        else:
            shown = repr(error["input"])
            shown = shown if len(shown) <= 200 else shown[:200] + "..."
            lines.append(f"{key}: {message} (got {shown})")
    return lines
