"""What the stack step reads, fingerprinted: a record of the input files (size, mtime, content
hashes) kept in the stack step's manifest, so that ``depsi run --resume`` redoes the pipeline
when an input file changed, and says which.

Small metadata files (``.res``, ``.par``, ``.xml``, ...) are hashed whole; large rasters by
:data:`HEAD_BYTES` at each end and :data:`SAMPLES` evenly spaced :data:`SAMPLE_BYTES` reads, so
a replaced SLC is seen even with its size and mtime kept, while a stack of thousands of files
fingerprints in seconds; Zarr chunks by name, size and mtime only (a store may hold millions).

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> from depsi.pipeline import parse_config
>>> folder = Path(tempfile.mkdtemp())
>>> _ = (folder / "master.res").write_text("Radar_wavelength (m): 0.0555\\n")
>>> config = parse_config({"input": {"format": "binary", "path": str(folder)}})
>>> before = input_fingerprint(config)
>>> sorted(before["files"])
['master.res']
>>> _ = (folder / "master.res").write_text("Radar_wavelength (m): 0.0556\\n")
>>> input_changes(before, input_fingerprint(config))
['master.res (content)']
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat as stat_kinds
from pathlib import Path
from typing import Any

#: Version of the fingerprint layout; one of another version compares as changed.
FINGERPRINT_VERSION = 1

#: Metadata files below this size are hashed whole (a real one is a few kB; 1 MB bounds a
#: mislabelled raster).
FULL_HASH_MAX_BYTES = 2**20
#: Suffixes of the text and metadata files the readers parse (hashed whole when small).
METADATA_SUFFIXES = (".res", ".par", ".xml", ".vrt", ".hdr", ".dim", ".json", ".txt", ".csv",
                     ".yaml", ".yml", ".ini", ".cfg", ".rsc")
#: Zarr metadata files (hashed whole); a Zarr store's other files are chunks.
ZARR_METADATA = (".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json")
#: Bytes read at the start and at the end of a raster.
HEAD_BYTES = 64 * 2**10
#: Evenly spaced reads between head and tail of a raster, and their size: a file replaced by
#: other bytes of the same size differs in every sample.
SAMPLES = 16
SAMPLE_BYTES = 4 * 2**10

#: Files and folders that are nobody's input: desktop litter, editors' and depsi's own
#: temporaries and locks (``.<name>-lock``, ``*.part``), version control.
JUNK_FILES = (".DS_Store", "Thumbs.db", "desktop.ini", "._*", "*~", ".*.swp", ".nfs*",
              ".*-lock", "*.part", ".*.writing-*", ".*.tmp-*")
JUNK_FOLDERS = (".git", ".svn", "__pycache__", ".ipynb_checkpoints", ".*.writing-*",
                ".*.tmp-*")
_JUNK_FILE = re.compile("|".join(fnmatch.translate(p) for p in JUNK_FILES))
_JUNK_FOLDER = re.compile("|".join(fnmatch.translate(p) for p in JUNK_FOLDERS))


def input_fingerprint(config: Any) -> dict[str, Any]:
    """A record of what the stack step of ``config`` reads, to compare with :func:`input_changes`.

    Parameters
    ----------
    config
        The pipeline configuration (:class:`~depsi.pipeline.config.PipelineConfig`).

    Returns
    -------
    dict
        ``version``, ``format``, ``path``, ``input`` (the input section), ``simulate`` (the
        simulated stack's parameters, else None) and ``files``: per file, labelled by its path
        relative to ``input.path`` (``input.dem: NAME``, ``input.h2ph: NAME`` for those),
        ``size``, ``mtime_ns`` and ``sha256`` (metadata, hashed whole) or ``sample`` (rasters,
        sampled); Zarr chunks have size and mtime only. JSON-able.
    """
    section = config.input
    record: dict[str, Any] = {"version": FINGERPRINT_VERSION, "format": section.format,
                              "path": None if section.path is None else str(section.path),
                              "input": section.model_dump(mode="json"), "simulate": None,
                              "files": {}}
    if section.format == "simulated":
        record["simulate"] = section.simulate.model_dump(mode="json")
        return record
    workspace = Path(config.output.workspace).absolute()
    files = record["files"]
    files.update(_tree(Path(section.path), exclude=workspace))
    if section.format == "dimap" and Path(section.path).is_file():
        data = Path(section.path).with_suffix(".data")
        files.update({f"{data.name}/{label}": entry
                      for label, entry in _tree(data, exclude=workspace).items()})
    for key in ("dem", "h2ph"):
        extra = getattr(section, key, None)
        if extra is not None:
            files.update({f"input.{key}: {label}": entry
                          for label, entry in _tree(Path(extra), exclude=workspace).items()})
    return record


def input_changes(old: Any, new: dict[str, Any], *, limit: int | None = None) -> list[str]:
    """What differs between two :func:`input_fingerprint` records, one ``NAME (why)`` each.

    ``why`` is ``content`` (a hash differs), ``size``, ``modified`` (a sampled raster or a
    Zarr chunk with a new mtime: its unread bytes may have changed), ``added`` or ``removed``.
    A metadata file whose hash is unchanged is unchanged whatever its mtime. ``limit``: at
    most that many, then ``and N more``.
    """
    if not isinstance(old, dict) or old.get("version") != new.get("version") \
            or not isinstance(old.get("files"), dict):
        return ["no earlier input fingerprint to compare with"]
    changes = [f"input.{key} ({old.get(key)!r} -> {new.get(key)!r})"
               for key in ("format", "path") if old.get(key) != new.get(key)]
    if old.get("simulate") != new.get("simulate"):
        changes.append("input.simulate (parameters)")
    before, after = old["files"], new["files"]
    for label in sorted(set(before) | set(after)):
        why = _entry_change(before.get(label), after.get(label))
        if why:
            changes.append(f"{label} ({why})")
    if limit is not None and len(changes) > limit:
        changes = [*changes[:limit], f"and {len(changes) - limit} more"]
    return changes


def _entry_change(old: Any, new: dict[str, Any] | None) -> str | None:
    if new is None:
        return "removed"
    if not isinstance(old, dict):
        return "added" if old is None else "content"
    for key in ("sha256", "sample"):
        if key in new or key in old:
            if old.get(key) != new.get(key):
                return "content"
    if old.get("size") != new["size"]:
        return "size"
    if "sha256" not in new and old.get("mtime_ns") != new["mtime_ns"]:
        return "modified"
    return None


# ------------------------------------------------------------------------------------- walking
def _tree(root: Path, *, exclude: Path | None = None) -> dict[str, dict[str, Any]]:
    """Entries of every file under ``root`` (``root`` itself when a file), by relative name."""
    if root.is_file():
        return {root.name: _entry(root, chunk=False)}
    if not root.is_dir():
        return {}
    skip = exclude.resolve() if exclude is not None else None
    entries: dict[str, dict[str, Any]] = {}
    seen: set[Path] = set()
    zarr_roots: list[str] = []  # folders holding Zarr metadata: their other files are chunks
    for folder, dirs, names in os.walk(root, followlinks=True):  # stacks link their SLCs
        here = Path(folder)
        real = here.resolve()
        if real in seen or real == skip:  # a link cycle, or the workspace inside the input
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not _JUNK_FOLDER.match(d))
        relative = here.relative_to(root).as_posix()
        relative = "" if relative == "." else relative + "/"
        if any(name in ZARR_METADATA for name in names):
            zarr_roots.append(relative)
        in_zarr = any(relative.startswith(prefix) for prefix in zarr_roots)
        for name in sorted(names):
            if _JUNK_FILE.match(name):
                continue
            path = here / name
            try:
                stat = path.stat()
            except OSError:  # a dangling link: nothing a reader could read
                continue
            if not stat_kinds.S_ISREG(stat.st_mode):
                continue
            chunk = in_zarr and name not in ZARR_METADATA \
                and not name.lower().endswith(METADATA_SUFFIXES)
            entries[relative + name] = _entry(path, chunk=chunk, stat=stat)
    return entries


def _entry(path: Path, *, chunk: bool, stat: os.stat_result | None = None) -> dict[str, Any]:
    stat = path.stat() if stat is None else stat
    entry: dict[str, Any] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if chunk:
        return entry
    metadata = path.name in ZARR_METADATA or path.name.lower().endswith(METADATA_SUFFIXES)
    if metadata and stat.st_size < FULL_HASH_MAX_BYTES:
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        entry["sample"] = sampled_hash(path, stat.st_size)
    return entry


def sampled_hash(path: str | os.PathLike, size: int | None = None) -> str:
    """SHA-256 of a file's first and last :data:`HEAD_BYTES` and :data:`SAMPLES` evenly spaced
    :data:`SAMPLE_BYTES` reads between them (the whole file when that is smaller)."""
    size = os.path.getsize(path) if size is None else size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if size <= 2 * HEAD_BYTES + SAMPLES * SAMPLE_BYTES:
            digest.update(handle.read())
            return digest.hexdigest()
        middle = size - 2 * HEAD_BYTES - SAMPLE_BYTES
        offsets = [0, *(HEAD_BYTES + middle * (i + 1) // (SAMPLES + 1) for i in range(SAMPLES)),
                   size - HEAD_BYTES]
        for offset, length in zip(offsets, [HEAD_BYTES, *[SAMPLE_BYTES] * SAMPLES, HEAD_BYTES]):
            handle.seek(offset)
            digest.update(handle.read(length))
    return digest.hexdigest()
