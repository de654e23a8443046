"""A local web explorer of a result: a map of the points coloured by any per-point variable,
each point's displacement series on a click, the mean series of a box, filters by temporal
coherence, scatterer kind and model; served on localhost or written as one HTML file.

``depsi view WORKSPACE`` on the command line; :func:`view` from a notebook.
"""

from __future__ import annotations

import logging
import os

import xarray as xr

from depsi.viewer.data import ViewData, ViewInputError, result_store
from depsi.viewer.server import DEFAULT_HTML_POINTS, DEFAULT_TILES, ViewServer, write_html

logger = logging.getLogger(__name__)


def view(result: xr.Dataset | str | os.PathLike, *, port: int = 0,
         tiles: str = DEFAULT_TILES) -> ViewServer:
    """Serve the viewer of ``result`` on localhost from a background thread.

    Parameters
    ----------
    result
        A result STM, a ``depsi run`` workspace folder or a result Zarr store.
    port
        TCP port on 127.0.0.1; 0 picks a free one.
    tiles
        URL template of the basemap's tiles (default OpenStreetMap's).

    Returns
    -------
    ViewServer
        Its ``url``; Jupyter shows the page in an IFrame. ``close()`` stops it.

    Examples
    --------
    >>> from depsi.simulate import result_like
    >>> viewer = view(result_like(100, n_epochs=5))
    >>> viewer.url.startswith("http://127.0.0.1:")
    True
    >>> viewer.close()
    """
    data = (ViewData(result, source="Dataset") if isinstance(result, xr.Dataset)
            else ViewData.open(result))
    server = ViewServer(data, port=port, tiles=tiles).start()
    logger.info("depsi viewer of %s at %s", data.source, server.url)
    return server


__all__ = ["DEFAULT_HTML_POINTS", "DEFAULT_TILES", "ViewData", "ViewInputError", "ViewServer",
           "result_store", "view", "write_html"]
