"""The viewer's local web server (the standard library's ``http.server``, one thread a request)
and its one-file export: the same page with a sample of the data embedded.

Routes: ``/`` the page, ``/static/<file>`` its script and style, ``/api/meta`` (JSON),
``/api/column/<name>`` (a per-point column, raw little-endian float32), ``/api/pick`` (the
nearest point to a map position), ``/api/point`` (one point by index), ``/api/box`` (count and
mean series of a map box).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np

from depsi.io.export import point_ids
from depsi.viewer.data import Filters, ViewData

logger = logging.getLogger(__name__)

#: Host the server binds: the local machine only (the data are the user's).
HOST = "127.0.0.1"
#: Static files of the page, by URL name, with their content types.
STATIC = {"viewer.js": "text/javascript; charset=utf-8", "viewer.css": "text/css; charset=utf-8"}
#: The basemap's tiles (XYZ, Web Mercator): OpenStreetMap's, as its tile policy allows for
#: light interactive use with attribution (the page shows it).
DEFAULT_TILES = "https://tile.openstreetmap.org/{z}/{x}/{y}.png"
#: Points of a one-file export by default: 11 MB of HTML at 30 epochs (three float32 series a
#: point, base64: displacement, its std, the model line).
DEFAULT_HTML_POINTS = 20_000


def _static(name: str) -> str:
    return resources.files("depsi.viewer").joinpath("static", name).read_text(encoding="utf-8")


def _page(data_script: str = "", *, inline: bool = False) -> str:
    """The page: linked script and style (served), or everything inline (one file)."""
    page = _static("index.html")
    if inline:
        page = page.replace('<link rel="stylesheet" href="static/viewer.css">',
                            f"<style>\n{_static('viewer.css')}\n</style>")
        page = page.replace('<script src="static/viewer.js"></script>',
                            f"{data_script}\n<script>\n{_static('viewer.js')}\n</script>")
    return page


def _check_tiles(tiles: str) -> str:
    if not all(key in tiles for key in ("{z}", "{x}", "{y}")):
        raise ValueError(f"view: --tiles expected a URL template with {{z}}, {{x}} and {{y}}, "
                         f"found {tiles!r}")
    return tiles


class _Handler(BaseHTTPRequestHandler):
    data: ViewData  # set on the subclass made per server
    tiles: str

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, body: bytes, content_type: str, status: HTTPStatus = HTTPStatus.OK) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(json.dumps(value, allow_nan=False).encode(), "application/json", status)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        query = parse_qs(url.query)
        try:
            if url.path in ("/", "/index.html"):
                self._send(_page().encode(), "text/html; charset=utf-8")
            elif url.path.startswith("/static/") and url.path[8:] in STATIC:
                self._send(_static(url.path[8:]).encode(), STATIC[url.path[8:]])
            elif url.path == "/api/meta":
                self._json({**self.data.meta(), "tiles": self.tiles})
            elif url.path.startswith("/api/column/"):
                self._send(self.data.column_bytes(url.path[12:]), "application/octet-stream")
            elif url.path == "/api/pick":
                index = self.data.nearest(float(query["x"][0]), float(query["y"][0]),
                                          float(query["r"][0]), Filters.from_query(query))
                self._json({"point": None if index is None else self.data.point(index)})
            elif url.path == "/api/point":
                self._json({"point": self.data.point(int(query["index"][0]))})
            elif url.path == "/api/box":
                x0, y0, x1, y1 = (float(query[k][0]) for k in ("x0", "y0", "x1", "y1"))
                self._json(self.data.box(x0, y0, x1, y1, Filters.from_query(query)))
            else:
                self._json({"error": f"no such page {url.path!r}"}, HTTPStatus.NOT_FOUND)
        except (KeyError, ValueError) as err:
            self._json({"error": str(err)}, HTTPStatus.BAD_REQUEST)
        except (BrokenPipeError, ConnectionResetError):  # the browser left: nothing to answer
            pass


class ViewServer:
    """A running viewer: its ``url``, ``close()``; shown in Jupyter as the page in an IFrame.

    Parameters
    ----------
    data
        The result to serve.
    port
        TCP port on 127.0.0.1; 0 picks a free one.
    tiles
        URL template of the basemap's tiles (``{z}``, ``{x}``, ``{y}``).
    """

    def __init__(self, data: ViewData, *, port: int = 0, tiles: str = DEFAULT_TILES):
        handler = type("Handler", (_Handler,), {"data": data, "tiles": _check_tiles(tiles)})
        self.data = data
        self.httpd = ThreadingHTTPServer((HOST, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{HOST}:{self.httpd.server_address[1]}/"
        self._thread: threading.Thread | None = None
        # what the first pick needs is made beside the first picture, not before it
        threading.Thread(target=data.warm_up, name="depsi-view-warm-up", daemon=True).start()

    def serve_forever(self) -> None:
        """Serve until interrupted (the command line's way)."""
        try:
            self.httpd.serve_forever()
        finally:
            self.httpd.server_close()

    def start(self) -> ViewServer:
        """Serve from a background thread (the notebook's way)."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="depsi-view",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __repr__(self) -> str:
        return f"<depsi viewer of {self.data.source} at {self.url}>"

    def _repr_html_(self) -> str:
        return (f'<iframe src="{self.url}" width="100%" height="640" style="border:0"></iframe>'
                f'<p>depsi viewer: <a href="{self.url}" target="_blank">{self.url}</a></p>')


def _base64(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode()


def embedded_data(data: ViewData, index: np.ndarray, *, tiles: str = DEFAULT_TILES) -> dict:
    """The page's data for the points ``index``: their columns, series, stds and model lines
    (float32, base64), so that the page needs no server."""
    sub = ViewData(data.result.isel(space=index), source=data.source)
    sub.origin = data.origin
    displacement = np.asarray(sub.result["displacement"].values, dtype=np.float32)
    offset = (np.asarray(sub.result["offset"].values) if "offset" in sub.result.variables
              else None)
    sub_columns = dict(sub.columns)
    sub_columns["x"] = data.columns["x"][index]
    sub_columns["y"] = data.columns["y"][index]
    meta = data.meta()
    meta.update(n_points=int(index.size), sampled_from=data.n_points,
                columns=sub.meta()["columns"], model_says=data.model_says(),
                tiles=_check_tiles(tiles))
    out = {
        "meta": meta,
        "columns": {name: _base64(values) for name, values in sub_columns.items()},
        "displacement": _base64(displacement),
        "model_line": _base64(sub.model_lines(np.arange(index.size), displacement, offset)),
        "ids": (None if sub.point_id(0) is None
                else [str(i) for i in point_ids(sub.result)]),
        "lon": np.asarray(sub.result["lon"].values, dtype=np.float64).round(7).tolist(),
        "lat": np.asarray(sub.result["lat"].values, dtype=np.float64).round(7).tolist(),
    }
    if "displacement_std" in sub.result.variables:
        out["displacement_std"] = _base64(sub.result["displacement_std"].values)
    return out


def write_html(data: ViewData, path: str | os.PathLike, *, max_points: int = DEFAULT_HTML_POINTS,
               bbox: tuple[float, float, float, float] | None = None,
               tiles: str = DEFAULT_TILES) -> Path:
    """Write the page with a sample of at most ``max_points`` points (within ``bbox``: west,
    south, east, north in degrees) embedded: one file that opens with no server and no
    network (the basemap's ``tiles`` load when the browser is online)."""
    if max_points < 1:
        raise ValueError(f"view: --max-points expected a positive count, found {max_points}")
    index = data.sample(max_points=max_points, bbox=bbox)
    embedded = json.dumps(embedded_data(data, index, tiles=tiles), allow_nan=False)
    # "</script>" inside the data would end the script element early
    embedded = embedded.replace("</", "<\\/")
    script = f"<script>window.DEPSI_DATA = {embedded};</script>"
    path = Path(path)
    path.write_text(_page(script, inline=True), encoding="utf-8")
    logger.info("wrote %s: %d of %d points, %.1f MB", path, index.size, data.n_points,
                path.stat().st_size / 1e6)
    return path
