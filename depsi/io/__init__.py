"""Reading and writing STMs and SLC stacks: Zarr stores, CSV, raw binary, DORIS-5, ISCE2, GAMMA,
SNAP (znap and BEAM-DIMAP), GeoTIFF, metadata; the geometry from their orbits is
:mod:`depsi.geometry`."""

from depsi.io.binary import from_binary, open_binary_folder
from depsi.io.bounded import MetadataError
from depsi.io.csv import from_csv
from depsi.io.dimap import from_dimap
from depsi.io.doris import from_doris_stack
from depsi.io.gamma import from_gamma
from depsi.io.geotiff import from_geotiff
from depsi.io.isce2 import from_isce2
from depsi.io.metadata import read_metadata, read_metadata_stack
from depsi.io.prefetch import iter_blocks, iter_processed_blocks, prefetched
from depsi.io.slc_zarr import open_slc_zarr
from depsi.io.stack import from_dataset, multi_look
from depsi.io.store import DEFAULT_CHUNK_BYTES, open_stm, save_stm
from depsi.io.store_append import append_epochs
from depsi.io.znap import from_snap

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MetadataError",
    "append_epochs",
    "from_binary",
    "from_csv",
    "from_dataset",
    "from_dimap",
    "from_doris_stack",
    "from_gamma",
    "from_isce2",
    "from_geotiff",
    "from_snap",
    "iter_blocks",
    "iter_processed_blocks",
    "multi_look",
    "open_binary_folder",
    "open_slc_zarr",
    "open_stm",
    "prefetched",
    "read_metadata",
    "read_metadata_stack",
    "save_stm",
]
