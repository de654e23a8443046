"""Names of the temporary siblings a product is written under before it moves into place.

Every writer of depsi (Zarr stores, exports, workspace manifests, simulated stacks) names its
temporary sibling here, and every recovery of an interrupted write looks for leftovers here, so
the name a writer makes and the name a recovery finds cannot drift apart. A sibling is hidden
(a leading dot), sits in the same folder (so moving it into place is one rename on one file
system) and carries a tag saying what it is and a random part so that writers never collide::

    .stm.zarr.writing-1f2e3d4c     a product being written (tag "writing")
    .stm.zarr.replaced-9a8b7c6d    an old product set aside while the new one moves in
    .velocity.writing-1f2e3d4c.tif with keep_suffix=True: the suffix stays last, for writers
                                   that choose the format by it (GDAL, matplotlib)
"""

from __future__ import annotations

import glob
import os
import uuid
from pathlib import Path

#: Tag of a product being written; recovery removes leftovers (:func:`depsi.io.store.
#: recover_interrupted`).
WRITING = "writing"
#: Tag of an old product set aside by a replace; recovery puts it back if the new one is missing.
REPLACED = "replaced"
#: Tag of the temporaries of writers that do their own clean-up (JSON documents, simulated
#: stacks); the pipeline removes leftovers in its workspace.
TEMPORARY = "tmp"

#: Hex digits of the random part.
_RANDOM_DIGITS = 8


def temporary_sibling(path: str | os.PathLike, tag: str = WRITING, *,
                      keep_suffix: bool = False) -> Path:
    """A new, unused name beside ``path``: ``.<name>.<tag>-<random>``.

    Parameters
    ----------
    path
        The product the sibling will become.
    tag
        What the sibling is: :data:`WRITING`, :data:`REPLACED` or :data:`TEMPORARY`.
    keep_suffix
        ``.<stem>.<tag>-<random><suffix>`` instead, for writers that pick the format by suffix.

    Examples
    --------
    >>> temporary_sibling("/data/stm.zarr").name.startswith(".stm.zarr.writing-")
    True
    >>> temporary_sibling("out/velocity.tif", keep_suffix=True).suffix
    '.tif'
    """
    path = Path(path)
    random = uuid.uuid4().hex[:_RANDOM_DIGITS]
    if keep_suffix:
        return path.with_name(f".{path.stem}.{tag}-{random}{path.suffix}")
    return path.with_name(f".{path.name}.{tag}-{random}")


def temporary_siblings(path: str | os.PathLike, tag: str = WRITING, *,
                       keep_suffix: bool = False) -> list[Path]:
    """The temporary siblings of ``path`` with ``tag`` that exist now (made by
    :func:`temporary_sibling` with the same arguments), sorted by name.

    Examples
    --------
    >>> import tempfile
    >>> product = Path(tempfile.mkdtemp()) / "ps.zarr"
    >>> temporary_sibling(product).mkdir()
    >>> [p.name.rsplit("-", 1)[0] for p in temporary_siblings(product)]
    ['.ps.zarr.writing']
    """
    path = Path(path)
    if keep_suffix:
        pattern = f".{glob.escape(path.stem)}.{tag}-*{glob.escape(path.suffix)}"
    else:
        pattern = f".{glob.escape(path.name)}.{tag}-*"
    return sorted(path.parent.glob(pattern))
