"""Time to first picture and server memory of ``depsi view`` against a bokeh WebGL scatter of
the same result, at 10^5 and 10^6 points, in headless Chromium.

A result-shaped store (:func:`depsi.simulate.results.result_like`) is written once per size in
``--work``. For each size and each viewer a server is started as its own process; Chromium
(network off) opens its page. Time to first picture: from the browser's navigation start to the
first draw finished, measured in the page (``performance.now()``: depsi's page records it when
its canvas is drawn; bokeh's is polled every 20 ms until its document is idle). Also the wall
time from the server's start to that picture, two picks' round trips (depsi: the first right
after the first picture, which may wait for the server's warm-up, then another), and the server
process's peak resident memory (``VmHWM``). Prints a markdown table and writes JSON.

The bokeh side is a prototype of what a bokeh viewer would be: the points' lon/lat and velocity
in one ``ColumnDataSource``, ``scatter(output_backend="webgl")``, a diverging colour map, the
page from ``file_html`` with inline resources served by ``http.server``.

Run: ``python benchmarks/bench_view.py [--points 100000 1000000] [--epochs 30] [--work DIR]
[--out FILE.json] [--no-bokeh]`` (needs chromium and chromedriver: scripts/browser-up.sh).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: Seconds a page may take to its first picture before the run gives up on it.
PAGE_LIMIT_S = 300
#: Polling interval of bokeh's idle state, s (the resolution of its time to first picture).
POLL_S = 0.02


def make_store(work: Path, n_points: int, n_epochs: int) -> tuple[Path, float]:
    from depsi.io import save_stm
    from depsi.simulate.results import result_like

    path = work / f"result-{n_points}x{n_epochs}.zarr"
    if path.exists():
        return path, 0.0
    start = time.perf_counter()
    save_stm(result_like(n_points, n_epochs=n_epochs), path)
    return path, time.perf_counter() - start


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def start_server(command: list[str]) -> tuple[subprocess.Popen, str, float]:
    """A server process and the URL it prints (first line with http://)."""
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    for line in process.stdout:
        if "http://" in line:
            url = line[line.index("http://"):].split()[0]
            return process, url, began
    raise RuntimeError(f"{command} printed no URL (exit {process.wait()})")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,820",
                     "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")),
                            options=options)


def wait_for(driver, script: str) -> float:
    """Poll ``script`` until it returns a number (ms since navigation start)."""
    deadline = time.perf_counter() + PAGE_LIMIT_S
    while time.perf_counter() < deadline:
        value = driver.execute_script(script)
        if value is not None:
            return float(value)
        time.sleep(POLL_S)
    raise TimeoutError(f"no first picture in {PAGE_LIMIT_S} s")


def measure_depsi(store: Path) -> dict:
    driver = browser()
    process, url, began = start_server([sys.executable, "-m", "depsi.cli", "view", str(store),
                                        "--no-browser"])
    started = time.perf_counter() - began
    try:
        driver.get(url)
        first = wait_for(driver, "return document.body.dataset.error ? -1 : "
                                 "(document.body.dataset.firstDrawMs || null)")
        wall = time.perf_counter() - began
        drawn = int(driver.find_element("id", "drawn-count").text)
        picks = []
        for x in (0, 500):  # the first may wait for the server's warm-up (KD-tree, imports)
            pick_began = time.perf_counter()
            with urllib.request.urlopen(f"{url}api/pick?x={x}&y=0&r=1000") as response:
                json.loads(response.read())
            picks.append(time.perf_counter() - pick_began)
        return {"first_picture_s": first / 1e3, "server_start_s": started,
                "start_to_picture_s": wall, "drawn": drawn, "first_pick_s": picks[0],
                "pick_s": picks[1], "server_peak_mb": peak_rss_mb(process.pid)}
    finally:
        driver.quit()
        process.terminate()
        process.wait()


def measure_bokeh(store: Path) -> dict:
    driver = browser()
    process, url, began = start_server([sys.executable, __file__, "--bokeh-server", str(store)])
    started = time.perf_counter() - began
    try:
        driver.get(url)
        first = wait_for(driver, "return (window.Bokeh && Bokeh.documents.length && "
                                 "Bokeh.documents[0].is_idle) ? performance.now() : null")
        wall = time.perf_counter() - began
        return {"first_picture_s": first / 1e3, "server_start_s": started,
                "start_to_picture_s": wall, "server_peak_mb": peak_rss_mb(process.pid)}
    finally:
        driver.quit()
        process.terminate()
        process.wait()


def bokeh_server(store: Path) -> None:
    """The bokeh prototype's server: one standalone page of a WebGL scatter."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import numpy as np
    from bokeh.embed import file_html
    from bokeh.models import ColumnDataSource
    from bokeh.palettes import RdBu11
    from bokeh.plotting import figure
    from bokeh.resources import INLINE
    from bokeh.transform import linear_cmap

    from depsi.io import open_stm

    result = open_stm(store)
    velocity = np.asarray(result["velocity"].values, dtype=np.float32)
    limit = float(np.percentile(np.abs(velocity), 98))
    source = ColumnDataSource({"lon": np.asarray(result["lon"].values),
                               "lat": np.asarray(result["lat"].values), "velocity": velocity})
    plot = figure(width=1000, height=780, output_backend="webgl",
                  tools="pan,wheel_zoom,box_select,tap,reset")
    plot.scatter("lon", "lat", source=source, size=3, line_color=None,
                 fill_color=linear_cmap("velocity", RdBu11, -limit, limit))
    page = file_html(plot, INLINE, "bokeh prototype").encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            try:
                self.wfile.write(page)
            except ConnectionResetError:  # the browser closed once the picture was measured
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sys.stdout.write(f"bokeh prototype at http://127.0.0.1:{server.server_address[1]}/\n")
    sys.stdout.flush()
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--work", type=Path, default=Path("/tmp/depsi-bench-view"))
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON file (default WORK/results.json)")
    parser.add_argument("--no-bokeh", action="store_true")
    parser.add_argument("--bokeh-server", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bokeh_server:
        bokeh_server(args.bokeh_server)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in args.points:
        store, written = make_store(args.work, n, args.epochs)
        run = {"points": n, "epochs": args.epochs, "store_written_s": written,
               "depsi": measure_depsi(store)}
        if not args.no_bokeh:
            run["bokeh"] = measure_bokeh(store)
        runs.append(run)
        print(json.dumps(run), flush=True)
    import bokeh

    out = args.out or args.work / "results.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "host": platform.node(),
                               "python": platform.python_version(), "bokeh": bokeh.__version__,
                               "runs": runs}, indent=1))
    print("| points | viewer | server start (s) | first picture (s) | start to picture (s) | "
          "first pick, next (s) | server peak (MB) |\n|---|---|---|---|---|---|---|")
    for run in runs:
        for name in ("depsi", "bokeh"):
            if name in run:
                r = run[name]
                pick = f"{r['first_pick_s']:.2f}, {r['pick_s']:.2f}" if "pick_s" in r else "-"
                print(f"| {run['points']:,} | {name} | {r['server_start_s']:.2f} | "
                      f"{r['first_picture_s']:.2f} | "
                      f"{r['start_to_picture_s']:.2f} | {pick} | {r['server_peak_mb']:.0f} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
