"""Reading metadata files with bounded work, whatever their size or content: bytes and text
refused from their size and longest line before any parsing, XML without entity declarations
and with bounded nesting, and the :class:`MetadataError` every metadata reader raises."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn, cast

from depsi.errors import BadInputError

#: Longest line of a text metadata file (``.res``, GAMMA ``.par``, ENVI ``.hdr``), in
#: characters: real lines are under 200; a longer one is refused before any field is parsed.
MAX_LINE_CHARS = 64 * 2**10
#: Largest XML metadata file read (ISCE2 ``.xml``, SNAP ``.dim``), in bytes: real ones are a
#: few MB (a .dim with every band and orbit vector of a 100-epoch stack is about 5 MB).
MAX_XML_BYTES = 64 * 2**20
#: Deepest nesting of XML elements: ISCE2 and DIMAP documents have about 10 levels; a deeper
#: one is refused while parsing, before the tree grows.
MAX_XML_DEPTH = 256


class MetadataError(BadInputError, ValueError):
    """A metadata file is malformed, or the files of a stack do not belong together.

    The message names the file(s), each bad field, what was expected and what was found;
    ``problems`` holds the same as ``(field, expected, found)`` tuples and ``paths`` the files.
    """

    def __init__(self, message: str, *, paths: Sequence[str] = (),
                 problems: Sequence[tuple[str, str, str]] = ()) -> None:
        super().__init__(message)
        self.paths = list(paths)
        self.problems = list(problems)


def _refuse(path: str | os.PathLike, what: str, message: str) -> NoReturn:
    raise MetadataError(f"{what} '{path}': {message}", paths=[str(path)])


def read_bounded_bytes(path: str | os.PathLike, *, what: str, max_bytes: int) -> bytes:
    """The bytes of a metadata file of at most ``max_bytes``, refused from its size alone.

    Raises
    ------
    MetadataError
        When the file is larger, naming the file, the limit and the size found.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        _refuse(path, what, f"expected at most {max_bytes} bytes, found {size} bytes")
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since the stat
        _refuse(path, what, f"expected at most {max_bytes} bytes, found more")
    return data


def check_line_lengths(text: str, path: str | os.PathLike, *, what: str,
                       max_chars: int = MAX_LINE_CHARS) -> None:
    """Refuse a text whose longest line exceeds ``max_chars`` (linear in the text's length)."""
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", start)
        end = size if end < 0 else end
        if end - start > max_chars:
            _refuse(path, what, f"expected lines of at most {max_chars} characters, found "
                                f"one of {end - start} characters at character {start}")
        start = end + 1


def read_bounded_text(path: str | os.PathLike, *, what: str, max_bytes: int,
                      max_line: int = MAX_LINE_CHARS, encoding: str = "utf-8",
                      errors: str = "replace") -> str:
    """A text metadata file of at most ``max_bytes`` with lines of at most ``max_line``
    characters; the parsers after it then do bounded work per line.

    Raises
    ------
    MetadataError
        A larger file or a longer line, naming the file, the limit and the size found.
    UnicodeDecodeError
        With ``errors="strict"`` and bytes that are not ``encoding``.
    """
    text = read_bounded_bytes(path, what=what, max_bytes=max_bytes).decode(encoding, errors)
    check_line_lengths(text, path, what=what, max_chars=max_line)
    return text


def parse_xml(path: str | os.PathLike, *, what: str, max_bytes: int = MAX_XML_BYTES,
              max_depth: int = MAX_XML_DEPTH) -> ET.Element:
    """The root element of an XML metadata file, parsed with bounded work.

    Refuses, before parsing, a file over ``max_bytes`` and any DOCTYPE or ENTITY declaration
    (entity expansion, "billion laughs": metadata files never declare entities; defusedxml
    is not a dependency), and, while parsing, nesting deeper than ``max_depth``.

    Raises
    ------
    MetadataError
        On any of those, naming the file, the limit and what was found.
    xml.etree.ElementTree.ParseError
        On XML that is not well formed (callers word the message).
    """
    data = read_bounded_bytes(path, what=what, max_bytes=max_bytes)
    for declaration in (b"<!DOCTYPE", b"<!ENTITY"):
        at = data.find(declaration)
        if at >= 0:
            _refuse(path, what, f"expected XML without document type or entity declarations, "
                                f"found {declaration.decode()} at byte {at}")
    parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start", "end"))
    depth, root, step = 0, None, 1 << 16  # small feeds: a deep tree stops early
    for offset in range(0, len(data) + 1, step):
        if offset < len(data):
            parser.feed(data[offset:offset + step])
        else:
            parser.close()
        # with only start and end events, each event is (name, element)
        for event, element in cast(Iterator[tuple[str, ET.Element]], parser.read_events()):
            if event == "end":
                depth -= 1
                continue
            depth += 1
            root = element if root is None else root
            if depth > max_depth:
                _refuse(path, what, f"expected XML nested at most {max_depth} elements deep, "
                                    f"found deeper nesting near byte {offset}")
    if root is None:
        raise ET.ParseError("no element found")
    return root


def _raise_problems(path: Path | str, problems: Sequence[tuple[str, str, str]]) -> NoReturn:
    lines = [f"  - field {field!r}: expected {expected}; found {found}"
             for field, expected, found in problems]
    raise MetadataError(
        f"metadata file '{path}' is malformed ({len(problems)} problem"
        f"{'s' if len(problems) > 1 else ''}):\n" + "\n".join(lines),
        paths=[str(path)], problems=problems)


__all__ = [
    "MAX_LINE_CHARS",
    "MAX_XML_BYTES",
    "MAX_XML_DEPTH",
    "MetadataError",
    "check_line_lengths",
    "parse_xml",
    "read_bounded_bytes",
    "read_bounded_text",
]
