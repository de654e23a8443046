"""depsi view in a real headless Chromium: the page draws every point, a click shows the
store's series, the filters and a box change what is counted, the one-file export draws with
the network off. Chromium comes from scripts/browser-up.sh; where it is absent these tests skip
and say why.

``DEPSI_VIEW_SCREENSHOTS=DIR`` keeps the pages' screenshots in DIR.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from depsi.cli import main
from depsi.io import save_stm
from depsi.simulate.results import result_like
from depsi.viewer import ViewData, ViewInputError, ViewServer
from depsi.viewer.data import Filters, mercator
from depsi.viewer.server import DEFAULT_TILES

N_POINTS = 1500
N_EPOCHS = 20
#: Seconds a page has to draw (a few on 2 busy cores; far less usually).
PAGE_WAIT_S = 30
WINDOW = (1400, 960)


def _browser_missing() -> str | None:
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        why = Path(os.environ.get("DEPSI_BROWSER_DIR", "/tmp/depsi-browser"), "unavailable")
        reason = why.read_text().strip() if why.exists() else "run scripts/browser-up.sh"
        return f"chromium or chromedriver not on PATH ({reason})"
    return None


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace folder holding a result-shaped stm.zarr, as depsi run leaves one."""
    folder = tmp_path_factory.mktemp("view") / "workspace"
    folder.mkdir()
    save_stm(result_like(N_POINTS, n_epochs=N_EPOCHS, seed=3), folder / "stm.zarr")
    return folder


@pytest.fixture(scope="module")
def data(workspace) -> ViewData:
    return ViewData.open(workspace)


@pytest.fixture(scope="module")
def stored(data):
    return data.result.compute()


def _driver(*arguments: str):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    missing = _browser_missing()
    if missing:
        pytest.skip(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--window-size={WINDOW[0]},{WINDOW[1]}", *arguments):
        options.add_argument(argument)
    # the Debian driver by its path: selenium-manager never goes to the network for one
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")),
                            options=options)


@pytest.fixture(scope="module")
def browser():
    driver = _driver()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(data):
    running = ViewServer(data).start()
    yield running
    running.close()


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("DEPSI_VIEW_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def _load(driver, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, PAGE_WAIT_S).until(
        lambda d: d.execute_script("return document.body.dataset.ready || "
                                   "document.body.dataset.error"))
    error = driver.execute_script("return document.body.dataset.error")
    assert error is None, f"the page failed: {error}"


def _drawn(driver) -> int:
    return int(driver.find_element("id", "drawn-count").text)


def _click_lon_lat(driver, lon: float, lat: float, *, shift_to: tuple | None = None) -> None:
    """Click (or shift-drag to ``shift_to``) at a lon/lat on the map, as a user does."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    overlay = driver.find_element("id", "overlay")
    rect = driver.execute_script("return arguments[0].getBoundingClientRect().toJSON()", overlay)

    def offset(lon_, lat_):  # selenium's offsets are from the element's centre
        x, y = driver.execute_script("return window.depsiView.project(arguments[0], arguments[1])",
                                     lon_, lat_)
        return round(x - rect["left"] - rect["width"] / 2), round(y - rect["top"]
                                                                    - rect["height"] / 2)

    actions = ActionChains(driver)
    if shift_to is None:
        actions.move_to_element_with_offset(overlay, *offset(lon, lat)).click().perform()
        return
    (actions.key_down(Keys.SHIFT).move_to_element_with_offset(overlay, *offset(lon, lat))
     .click_and_hold().move_to_element_with_offset(overlay, *offset(*shift_to))
     .release().key_up(Keys.SHIFT).perform())


def _series(driver, kind: str) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    def shown(d):
        text = d.find_element("id", "series-values").get_attribute("textContent")
        return json.loads(text) if text and json.loads(text)["kind"] == kind else None

    return WebDriverWait(driver, PAGE_WAIT_S).until(shown)


# ------------------------------------------------------------------------- without a browser
def test_a_path_that_is_no_result_is_refused_naming_it(tmp_path):
    with pytest.raises(ViewInputError, match="does not exist"):
        ViewData.open(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ViewInputError, match="neither a workspace with stm.zarr"):
        ViewData.open(tmp_path / "empty")


def test_the_html_options_without_html_are_refused(workspace):
    assert main(["view", str(workspace), "--max-points", "10", "--no-browser"]) != 0


def test_the_nearest_point_is_the_kd_trees_and_passes_the_filters(data):
    x, y = data.columns["x"].astype(np.float64), data.columns["y"].astype(np.float64)
    coherence = data.columns["temporal_coherence"]
    target = int(np.argmax(coherence < 0.5))
    assert data.nearest(x[target], y[target], 1.0, Filters()) == target
    kept = data.nearest(x[target], y[target], 1e6, Filters(min_coherence=0.5))
    distance = np.hypot(x - x[target], y - y[target])
    passing = np.flatnonzero(coherence >= 0.5)
    # on the grid two neighbours can be equally near: the nearest distance is what must match
    assert coherence[kept] >= 0.5
    assert distance[kept] == pytest.approx(distance[passing].min(), abs=0.01)


def test_points_without_a_position_are_kept_off_the_map_and_the_picks(stored):
    result = stored.copy(deep=True)
    result["lon"].values[:10] = np.nan
    data = ViewData(result)
    assert not data.mask(Filters())[:10].any() and data.mask(Filters())[10:].all()
    x, y = data.columns["x"][10], data.columns["y"][10]
    assert data.nearest(float(x), float(y), 1.0, Filters()) == 10


def test_the_model_line_follows_the_series_within_its_noise(data, stored):
    seasonal = np.flatnonzero(stored["model_choice"].values == 1)[:200]
    displacement = stored["displacement"].values[seasonal]
    lines = data.model_lines(seasonal, displacement)
    rms = np.sqrt(np.mean((lines - displacement)[:, 1:] ** 2, axis=1))
    noise = stored["displacement_std"].values[seasonal, 0]
    assert np.median(rms / noise) < 1.3  # white noise: 1; a missing seasonal term: far more


def test_depsi_view_serves_a_dataset_from_a_notebook(stored):
    import urllib.request

    import depsi

    viewer = depsi.view(stored)
    try:
        with urllib.request.urlopen(viewer.url + "api/meta") as response:
            meta = json.loads(response.read())
        assert meta["n_points"] == N_POINTS and meta["default_column"] == "velocity"
        assert f'<iframe src="{viewer.url}"' in viewer._repr_html_()
    finally:
        viewer.close()


def test_the_command_serves_a_workspace_and_prints_its_address(workspace):
    import subprocess
    import sys
    import urllib.request

    process = subprocess.Popen([sys.executable, "-m", "depsi.cli", "view", str(workspace),
                                "--no-browser"], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[1])
    try:
        line = process.stdout.readline()
        url = line[line.index("http://"):].split()[0]
        with urllib.request.urlopen(url + "api/column/velocity") as response:
            velocity = np.frombuffer(response.read(), dtype="<f4")
        np.testing.assert_array_equal(velocity, ViewData.open(workspace).columns["velocity"])
    finally:
        process.terminate()
        process.wait(timeout=30)


# -------------------------------------------------------------------------------- in Chromium
def test_the_page_draws_every_point(browser, server, tmp_path):
    _load(browser, server.url)
    assert _drawn(browser) == N_POINTS
    assert browser.execute_script("return document.body.dataset.basemap") in ("tiles",
                                                                              "graticule")
    assert float(browser.execute_script("return document.body.dataset.firstDrawMs")) > 0
    _screenshot(browser, tmp_path, "view-map")


def test_a_click_shows_the_stores_series_of_that_point(browser, server, stored, tmp_path):
    _load(browser, server.url)
    # a point in the bowl that kept the seasonal model: its line shows the season
    velocity = np.where(stored["model_choice"].values == 1, stored["velocity"].values, np.inf)
    index = int(np.argmin(velocity))
    _click_lon_lat(browser, float(stored["lon"][index]), float(stored["lat"][index]))
    tooltip = browser.find_element("id", "tooltip")  # the cursor rests on the point
    assert tooltip.get_attribute("data-index") == str(index)
    assert tooltip.text.startswith("velocity -") and "mm/yr" in tooltip.text
    shown = _series(browser, "point")
    assert shown["index"] == index
    np.testing.assert_array_equal(np.float32(shown["displacement"]),
                                  stored["displacement"].values[index])
    np.testing.assert_array_equal(np.float32(shown["displacement_std"]),
                                  stored["displacement_std"].values[index])
    info = browser.find_element("id", "info").text
    assert "velocity" in info and "mm/yr" in info
    kind = ("ps", "ds")[int(stored["scatterer"].values[index])]
    model = ("linear", "seasonal")[int(stored["model_choice"].values[index])]
    assert kind in info and model in info
    _screenshot(browser, tmp_path, "view-point")


def test_points_without_a_position_are_not_drawn(browser, stored):
    result = stored.copy(deep=True)
    result["lat"].values[:10] = np.nan
    running = ViewServer(ViewData(result)).start()
    try:
        _load(browser, running.url)
        assert _drawn(browser) == N_POINTS - 10
    finally:
        running.close()


def test_the_filters_change_the_count_drawn(browser, server, stored):
    _load(browser, server.url)
    browser.execute_script("const e = document.getElementById('min-coherence'); e.value = '0.8';"
                           "e.dispatchEvent(new Event('input'));")
    expected = int((stored["temporal_coherence"].values >= np.float32(0.8)).sum())
    browser.execute_script("return new Promise(r => requestAnimationFrame(() => r()))")
    assert _drawn(browser) == expected < N_POINTS
    ds = browser.find_element("css selector", "#kinds input[data-code='1']")
    ds.click()
    browser.execute_script("return new Promise(r => requestAnimationFrame(() => r()))")
    ps = (stored["scatterer"].values == 0) & (stored["temporal_coherence"].values
                                              >= np.float32(0.8))
    assert _drawn(browser) == int(ps.sum())


def test_a_box_gives_the_count_and_mean_series_of_its_points(browser, server, stored, tmp_path):
    _load(browser, server.url)
    lon, lat = stored["lon"].values, stored["lat"].values
    west, east = np.percentile(lon, [20, 60])
    south, north = np.percentile(lat, [30, 70])
    _click_lon_lat(browser, west, north, shift_to=(east, south))
    shown = _series(browser, "box")
    # the box's corners are where the mouse went, to a pixel: count against the page's corners
    box = browser.execute_script("return window.depsiView.state.box")
    expected = ViewData.box(server.data, *box, Filters())
    assert shown["count"] == expected["count"] > 0.1 * N_POINTS
    np.testing.assert_allclose(shown["mean"], expected["mean"], rtol=0, atol=1e-9)
    x, y = server.data.columns["x"], server.data.columns["y"]
    inside = ((x >= min(box[0], box[2])) & (x <= max(box[0], box[2]))
              & (y >= min(box[1], box[3])) & (y <= max(box[1], box[3])))
    np.testing.assert_allclose(shown["mean"], stored["displacement"].values[inside].mean(axis=0),
                               rtol=0, atol=1e-7)
    _screenshot(browser, tmp_path, "view-box")


@pytest.fixture
def tile_server():
    """A local XYZ tile server: one pale green PNG for every tile, the paths asked recorded."""
    import io
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    plt.imsave(buffer, np.full((256, 256, 3), [0.8, 0.93, 0.8]), format="png")
    png, asked = buffer.getvalue(), []

    class Tiles(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Tiles)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/{{z}}/{{x}}/{{y}}.png", asked
    httpd.shutdown()
    httpd.server_close()


def test_the_basemap_draws_the_tiles_over_the_scene_when_online(browser, data, stored,
                                                                tile_server, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    template, asked = tile_server
    running = ViewServer(data, tiles=template).start()
    try:
        _load(browser, running.url)
        WebDriverWait(browser, PAGE_WAIT_S).until(
            lambda d: d.execute_script("return document.body.dataset.basemap") == "tiles")
        assert "tiles: 127.0.0.1" in browser.find_element("id", "attribution").text
        _screenshot(browser, tmp_path, "view-tiles")
    finally:
        running.close()
    z, x, y = (int(v) for v in asked[0].removesuffix(".png").strip("/").split("/"))
    # the tile under the scene's centre (XYZ numbering of Web Mercator) was among those asked
    cx, cy = mercator(stored["lon"].values.mean(), stored["lat"].values.mean())
    world = 2 * np.pi * 6378137.0
    centre = f"/{z}/{int((cx + world / 2) / world * 2**z)}/{int((world / 2 - cy) / world * 2**z)}"
    assert f"{centre}.png" in asked


def test_a_tile_url_without_its_placeholders_is_refused(data):
    with pytest.raises(ValueError, match=r"expected a URL template with \{z\}"):
        ViewServer(data, tiles="https://tiles.example/{z}/{x}.png")
    assert "{z}" in DEFAULT_TILES


@pytest.mark.slow
def test_a_chain_result_shows_its_quantities_and_says_which_are_absent():
    """On the chain's own result (no DS, no model terms): the point names what is absent."""
    from depsi import run_ps_chain
    from scenes import simulated_points

    points, _ = simulated_points(shape=(50, 50), n_epochs=12, aps_std=0.0)
    result = run_ps_chain(points).compute()
    data = ViewData(result)
    point = data.point(0)
    assert {"scatterer", "model_choice"} <= set(point["absent"])
    np.testing.assert_array_equal(np.float32(point["displacement"]),
                                  result["displacement"].transpose("space", "time").values[0])
    assert data.meta()["reference"]["point"] is not None


def test_the_one_file_export_draws_with_the_network_off(workspace, stored, tmp_path):
    out = tmp_path / "result.html"
    assert main(["view", str(workspace), "--html", str(out), "--max-points", "400"]) == 0
    offline = _driver("--host-resolver-rules=MAP * ~NOTFOUND")
    try:
        _load(offline, out.as_uri())
        assert _drawn(offline) == 400
        assert offline.execute_script("return document.body.dataset.basemap") == "graticule"
        index = int(offline.execute_script("return 0"))
        lon, lat = offline.execute_script("const d = window.DEPSI_DATA; "
                                          "return [d.lon[arguments[0]], d.lat[arguments[0]]]",
                                          index)
        _click_lon_lat(offline, lon, lat)
        shown = _series(offline, "point")
        where = int(np.flatnonzero((np.round(stored["lon"].values, 7) == lon)
                                   & (np.round(stored["lat"].values, 7) == lat))[0])
        np.testing.assert_array_equal(np.float32(shown["displacement"]),
                                      stored["displacement"].values[where])
        _screenshot(offline, tmp_path, "view-html-offline")
    finally:
        offline.quit()
