"""A step's manifest: the record, written beside its finished product, that lets a resumed run
trust the product (config hash, input run ids, product fingerprint), and the record of the
step that failed last."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from depsi.io.paths import temporary_sibling

#: Version of the manifest layout; a manifest of another version is not trusted.
MANIFEST_VERSION = 1


def section_hash(config: Any, sections: tuple[str, ...]) -> str:
    """SHA-256 of the config ``sections`` (dotted names: a step's
    :attr:`~depsi.pipeline.steps.Step.sections`)."""
    data = config.model_dump(mode="json")
    picked = {}
    for dotted in sections:
        value: Any = data
        for part in dotted.split("."):
            value = value[part]
        picked[dotted] = value
    text = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def product_fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 of a product's file listing (relative names and sizes) and its metadata files.

    Cheap even for large Zarr stores (no chunk is read); changes when any file is added,
    removed, resized, or when any JSON metadata changes.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}".encode())
        return digest.hexdigest()
    if not path.is_dir():
        raise FileNotFoundError(f"product {str(path)!r} does not exist")
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = Path(root, name)
            relative = full.relative_to(path).as_posix()
            digest.update(f"{relative}:{full.stat().st_size}\n".encode())
            if name.endswith((".json", ".zattrs", ".zarray", ".zgroup", ".zmetadata")):
                digest.update(full.read_bytes())
    return digest.hexdigest()


def manifest_path(workspace: str | os.PathLike, step: str) -> Path:
    """Where the manifest of ``step`` lives: ``<workspace>/<step>.done.json``."""
    return Path(workspace) / f"{step}.done.json"


#: Name of the record of the step that failed last, beside the manifests; removed when a later
#: run completes that step.
FAILED_FILE = "failed.json"


def failed_path(workspace: str | os.PathLike) -> Path:
    """Where the record of the last failed step lives: ``<workspace>/failed.json``."""
    return Path(workspace) / FAILED_FILE


def read_failure(workspace: str | os.PathLike) -> dict[str, Any] | None:
    """The record of the step that failed last (:func:`failed_path`), or None (none, or
    unreadable: it only explains, it decides nothing)."""
    try:
        record = json.loads(failed_path(workspace).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "step" in record else None


#: Keys every manifest has, with their types; the stack step's also has ``input_fingerprint``
#: (:func:`~depsi.pipeline.fingerprint.input_fingerprint`). One without them is damaged.
MANIFEST_KEYS: dict[str, type | tuple[type, ...]] = {
    "version": int, "step": str, "run_id": str, "config_hash": str, "inputs": dict,
    "product": str, "fingerprint": str, "counts": dict, "seconds": (int, float),
    "finished": (int, float)}


def load_manifest(workspace: str | os.PathLike,
                  step: str) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest of ``step`` and ``None``, or ``None`` and why it cannot be used.

    The reason starts with ``no manifest`` when there is none, ``manifest NAME is damaged``
    when it is unreadable, not a JSON object, of another version or missing an expected key
    (:data:`MANIFEST_KEYS`): its step is then redone, never trusted.
    """
    path = manifest_path(workspace, step)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"no manifest {path.name}"
    except (OSError, ValueError) as err:
        return None, f"manifest {path.name} is damaged (unreadable: {err})"
    if not isinstance(manifest, dict):
        return None, (f"manifest {path.name} is damaged (expected a JSON object, found a "
                      f"{type(manifest).__name__})")
    if manifest.get("version") != MANIFEST_VERSION:
        return None, (f"manifest {path.name} is damaged (expected version {MANIFEST_VERSION}, "
                      f"found {manifest.get('version')!r})")
    expected: dict[str, type | tuple[type, ...]] = dict(MANIFEST_KEYS) | (
        {"input_fingerprint": dict} if step == "stack" else {})
    missing = [key for key in expected if key not in manifest]
    wrong = [key for key, kind in expected.items()
             if key in manifest and not isinstance(manifest[key], kind)]
    if missing or wrong:
        found = [f"missing {', '.join(missing)}"] if missing else []
        found += [f"wrong type of {', '.join(wrong)}"] if wrong else []
        return None, f"manifest {path.name} is damaged ({'; '.join(found)})"
    return manifest, None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = temporary_sibling(path)
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
