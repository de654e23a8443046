"""Reading and writing STMs and SLC stacks: Zarr stores, CSV, raw binary, SNAP, metadata."""

from depsi.io.store import DEFAULT_CHUNK_BYTES, append_epochs, open_stm, save_stm

__all__ = ["DEFAULT_CHUNK_BYTES", "append_epochs", "open_stm", "save_stm"]
