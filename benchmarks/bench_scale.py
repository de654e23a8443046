"""Scale benchmark of the PS chain: 10^5, 10^6 and 10^7 persistent scatterers.

For each size:

1. Scene: ``_scale_scene.py`` (independent of ``depsi.simulate``) writes a point STM of that
   many PS (3 % of 10 m pixels, 60 epochs, atmosphere of 1 rad and 400 m, bowls and a ramp of
   velocity) and its truth, tile by tile, into ``--cache`` (default
   ``$TMPDIR/depsi-bench-scale``), in a child process whose time and peak memory are reported;
   a cached scene of the same generator version is reused.
   ``--layouts raster morton`` (the default: both) runs each size on the generator's raster
   order and on a copy of the same points in Morton order (written once beside it, with each
   point's ``scene_index`` into the truth), each layout a row of its own.
2. Chain: a fresh child process opens the store with :func:`depsi.io.open_stm` and runs the
   chain's steps of :data:`depsi.pipeline.steps.STEPS` as
   :func:`~depsi.pipeline.chain.run_ps_chain` runs them, timing each. Options:
   ``--chain-option section.key=value`` (a field of a chain section, the value as JSON, e.g.
   ``network.first_order=20000``, ``atmosphere.method=none``).
   ``--local-cluster``: the same inside a ``distributed.LocalCluster`` of 2 workers of 1 thread
   and ``memory_limit="2GB"`` (``depsi.cluster.scheduler``), reporting the workers' peak memory.
3. Figures: wall and CPU time of the chain (process time, all threads of the child; in
   ``--local-cluster`` mode the workers' CPU is not included), points per second, the child's
   peak RSS (``ru_maxrss`` from ``wait4``, so also for a child that was killed), velocity and
   height RMSE on true points with temporal coherence >= 0.8 after removing the median
   difference (the datum), beside the noise and no-correction floors of the oracle fits on the
   same points, the fractions of the PS in the result and coherent there, and the growth
   exponent of the wall time between consecutive sizes (``log(t2/t1) / log(n2/n1)``, 1 =
   linear), and the chain's wall time over that of one decoded read of its input in the same
   child (``x read``, the baseline). Per step: wall, CPU and peak RSS after the step, and a
   sampling profile (every thread's stack every ``--stack-sample-s``): the depsi lines where
   each step spends its time.

A size that fails (an exception: its traceback is kept), runs past ``--timeout`` or grows past
``--max-rss-gb`` (the child's process tree, sampled) is reported as such, with the step it was
in and the Python stacks at that moment (``faulthandler``), and the next size runs. Results go
to stdout as markdown and to ``CACHE/results-<time>.json``; each child's log to
``CACHE/n<N>-seed<S>.<chain|local>.log``.

Run: ``python benchmarks/bench_scale.py [--sizes 1e5 1e6 1e7] [--timeout 1200]
[--chain-option network.first_order=20000] [--local-cluster]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import _scale_scene as scene_module
import numpy as np

#: Temporal coherence from which a result point counts as coherent.
MIN_COHERENCE = 0.8
#: The LocalCluster of ``--local-cluster``.
LOCAL_CLUSTER = {"scheduler": "local", "workers": 2, "threads": 1, "memory_limit": "2GB"}
#: Seconds between samples of the child's memory (and the workers', with a cluster).
SAMPLE_S = 0.5
#: The timed step each function outside the steps belongs to (its outermost frame in a stack);
#: a step's own function is ``run`` (or ``run_in_memory``) of its module in depsi.pipeline.steps.
STEP_OF = {"open_stm": "open", "prepare_points": "prepare", "run_ps_chain": "run_ps_chain",
           "accuracy": "accuracy"}


def _step_of(frame: str) -> str | None:
    """The timed step a stack frame's function belongs to (None: none)."""
    import re

    step = re.search(r'/pipeline/steps/(\w+)\.py", line \d+ in run(?:_in_memory)?$', frame)
    if step:
        return step.group(1)
    names = re.findall(r" in (\w+)$", frame)
    return STEP_OF.get(names[0]) if names else None
GB = 2**30


# ---------------------------------------------------------------------------- in the child
class _Recorder:
    """Times steps, and appends each start and end to a JSON-lines progress file."""

    def __init__(self, progress: Path):
        self.progress, self.steps, self.running = progress, [], None

    def _write(self, entry: dict) -> None:
        with open(self.progress, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def __call__(self, name: str, func):
        self._write({"event": "start", "step": name, "time": time.time()})
        self.running = name
        wall, cpu = time.perf_counter(), time.process_time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out = func()
        after = resource.getrusage(resource.RUSAGE_SELF)
        entry = {"step": name, "wall_s": time.perf_counter() - wall,
                 "cpu_s": time.process_time() - cpu, "peak_rss_bytes": _peak_rss(),
                 "sys_s": after.ru_stime - usage.ru_stime,
                 "minor_faults": after.ru_minflt - usage.ru_minflt,
                 "lazy_variables": _lazy_variables(out)}
        self.steps.append(entry)
        self.running = None
        self._write({"event": "end", **entry})
        return out


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _lazy_variables(out) -> list[str]:
    """Names of the Dask-backed variables of a step's product (their work is still to come)."""
    variables = getattr(out, "variables", {})
    return sorted(str(name) for name, var in variables.items() if var.chunks is not None)


def run_chain(ps_stm, options: dict, record: _Recorder, devices: list[str] | None = None):
    """The chain on ``ps_stm``: the chain's steps of the table, each timed, executed exactly
    as :func:`~depsi.pipeline.chain.run_ps_chain` executes them (each product handed to its
    last reader as the only reference), on ``devices`` as ``run_ps_chain(devices=...)``."""
    from depsi.pipeline.chain_config import chain_config
    from depsi.pipeline.steps import BY_NAME, CHAIN_STEPS, StepContext, call_step, last_consumers
    from depsi.pipeline.steps.selection import prepare_points
    from depsi.stm.runtime import tune_memory

    tune_memory()  # the process's memory settings, as run_ps_chain's
    config = chain_config(None, **options)
    context = StepContext(devices=devices)
    products = {"selection": record("prepare", lambda: prepare_points(ps_stm))}
    last = last_consumers(CHAIN_STEPS)
    for step in CHAIN_STEPS:
        spec = BY_NAME[step]

        def take(name: str, step: str = step):
            return products.pop(name) if last[name] == step else products[name]

        products[step] = record(step, lambda spec=spec, step=step, take=take: call_step(
            spec.run_in_memory, step, take, config, context))
    return products.pop(CHAIN_STEPS[-1])


def read_baseline(path: Path) -> float:
    """Seconds to read and decode the chain's input once (``phase`` and ``h2ph``, chunk by
    chunk, bounded memory): the floor of any pass over the points."""
    import dask

    from depsi.io.store import open_stm

    start = time.perf_counter()
    ps_stm = open_stm(path)
    dask.compute(ps_stm["phase"].data.sum(), ps_stm["h2ph"].data.sum())
    return time.perf_counter() - start


def _rms_about_median(values: np.ndarray) -> float:
    if not values.size:
        return float("nan")
    values = values.astype(np.float64)
    return float(np.sqrt(np.mean((values - np.median(values)) ** 2)))


#: The result's variables :func:`accuracy` reads (a LocalCluster run brings only these back).
SCORED = ("point_index", "azimuth", "range", "temporal_coherence", "velocity", "height_error",
          "order")


def accuracy(result, truth_path: Path, store: Path | None = None) -> dict:
    """The result against the truth: RMSEs on coherent points and the floors on the same.
    ``store``: the chain's input, whose ``scene_index`` (a reordered copy's) maps its points to
    the truth's."""
    import xarray as xr

    truth = xr.open_zarr(truth_path, consolidated=False)
    n = truth.sizes["space"]
    index = np.asarray(result["point_index"].values)
    if store is not None:
        points = xr.open_zarr(store, consolidated=False)
        if "scene_index" in points:
            index = np.asarray(points["scene_index"].values)[index]
    same = (np.array_equal(truth["azimuth"].values[index], result["azimuth"].values)
            and np.array_equal(truth["range"].values[index], result["range"].values))
    if not same:
        raise ValueError("accuracy: expected the result's point_index to index the truth "
                         "(same azimuth and range), found other positions")
    coherence = np.asarray(result["temporal_coherence"].values)
    coherent = coherence >= MIN_COHERENCE
    which = index[coherent]
    figures = {
        "n_points": n, "n_result": int(index.size), "n_coherent": int(coherent.sum()),
        "n_nan_velocity": int(np.isnan(result["velocity"].values).sum()),
        "result_fraction": index.size / n, "coherent_fraction": float(coherent.sum()) / n,
    }
    for name in ("velocity", "height_error"):
        error = result[name].values[coherent] - truth[name].values[which]
        figures[f"{name}_rmse"] = _rms_about_median(error)
    for name in scene_module.FLOOR_NAMES:
        figures[f"floor_{name.removesuffix('_error')}"] = _rms_about_median(
            truth[name].values[which])
    if "order" in result:
        order = np.asarray(result["order"].values)
        figures["n_first_order"] = int((order == 1).sum())
        figures["n_densified"] = int((order == 2).sum())
    return figures


class _WorkerMemory:
    """Samples the cluster workers' memory in a background thread; peak per worker."""

    def __init__(self, client):
        import threading

        self.client, self.peak, self.addresses = client, {}, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                workers = self.client.scheduler_info()["workers"]
            except Exception:  # the scheduler going down ends the sampling, not the run
                return
            for address, info in workers.items():
                self.addresses.add(address)
                memory = info.get("metrics", {}).get("memory", 0)
                self.peak[address] = max(self.peak.get(address, 0), memory)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            maxrss = self.client.run(lambda: resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss * 1024)
        except Exception as err:  # reported, not raised
            maxrss = {"error": repr(err)}
        return {"sampled_peak_bytes": self.peak, "worker_maxrss_bytes": maxrss,
                "workers_seen": len(self.addresses)}


class _StackSampler:
    """Every other thread's stack written every ``every`` s, in faulthandler's format (what
    :func:`hotspots` reads), by a Python thread holding the GIL.

    ``faulthandler.dump_traceback_later`` reads the other threads' frames from its watchdog
    thread without the GIL, which can crash a busy process (CPython issues 116008, 131580): a
    10^6 child died with SIGSEGV in it once, while Dask threads were starting tasks.
    """

    def __init__(self, path: Path, every: float):
        import threading

        self._stop = threading.Event()
        self._file = open(path, "w")  # noqa: SIM115 - closed by stop()
        self._thread = threading.Thread(target=self._run, args=(float(every),), daemon=True,
                                        name="stack-sampler")
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self._file.write(f"Timeout ({every:g} s)!\n" + self._sample())
            self._file.flush()

    @staticmethod
    def _sample() -> str:
        """The other threads' stacks as text. The frame objects die when this returns: one
        held would keep its function's locals (arrays) alive after the function returned,
        which raised the 10^6 chain's peak RSS from 3.6 GB to 4.35 GB."""
        import threading

        lines = []
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            lines.append(f"Thread 0x{ident:016x} (most recent call first):")
            lines.extend(f'  File "{f.filename}", line {f.lineno} in {f.name}'
                         for f in reversed(traceback.extract_stack(frame)))
            lines.append("")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._file.close()


def child_main(scene_folder: Path, out_path: Path, options: dict, local_cluster: bool,
               stack_sample_s: float = 0.0, layout: str = "raster") -> int:
    """Run in the chain's child process: open, run, score; write the figures to ``out_path``.

    With ``stack_sample_s`` every thread's stack is written to ``<out>.stacks`` that often
    (:class:`_StackSampler`), a sampling profile :func:`hotspots` reads afterwards.
    """
    import faulthandler
    import logging
    from contextlib import ExitStack

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sampler = None
    if stack_sample_s > 0:
        sampler = _StackSampler(out_path.with_suffix(".stacks"), stack_sample_s)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    record = _Recorder(out_path.with_suffix(".progress"))
    out = {"status": "running", "options": options, "local_cluster": local_cluster}
    workers = None
    try:
        with ExitStack() as stack:
            if local_cluster:
                from depsi.cluster import scheduler

                running = stack.enter_context(scheduler(LOCAL_CLUSTER))
                out["scheduler"] = running.description
                workers = _WorkerMemory(running.client)
            from depsi.io.store import open_stm

            wall, cpu = time.perf_counter(), time.process_time()
            store = scene_folder / LAYOUT_STORES[layout]
            ps_stm = record("open", lambda: open_stm(store))
            result = run_chain(ps_stm, options, record)
            out["chain_wall_s"] = time.perf_counter() - wall
            out["chain_cpu_s"] = time.process_time() - cpu
            out["chain_peak_rss_bytes"] = _peak_rss()
            if workers is not None:
                out["workers"] = workers.stop()
                workers = None
                # the result's series stay on the workers (persisted): the per-point figures
                # the scoring reads come here before the cluster closes
                result = result[[n for n in SCORED if n in result.variables]].compute()
        out["steps"] = record.steps
        out["accuracy"] = accuracy(result, scene_folder / scene_module.TRUTH_STORE, store)
        del result
        # the first read pays for imports and cold caches
        out["read_s"] = min(read_baseline(store) for _ in range(2))
        out["status"] = "ok"
    except BaseException as err:  # reported to the parent, which carries on with the next size
        out.update(status="failed", error=f"{type(err).__name__}: {err}",
                   traceback=traceback.format_exc(), steps=record.steps,
                   running_step=record.running or _failed_step(traceback.format_exc()))
        if workers is not None:
            out["workers"] = workers.stop()
    if sampler is not None:
        sampler.stop()
    out_path.write_text(json.dumps(out, default=str))
    return 0 if out["status"] == "ok" else 1


# --------------------------------------------------------------------------- in the parent
def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (Linux ``/proc``)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


def run_child(command: list[str], log: Path, *, timeout: float | None,
              max_rss: float | None) -> dict:
    """Run ``command`` in its own session, watching time and memory; its resource usage."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        start, peak, killed, dump_from = time.perf_counter(), 0, None, None
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss(process.pid))
            if timeout and time.perf_counter() - start > timeout:
                killed = f"timeout after {timeout:.0f} s"
            elif max_rss and peak > max_rss:
                killed = f"memory: process tree at {peak / GB:.1f} GB > {max_rss / GB:.1f} GB"
            if killed:
                out.flush()
                dump_from = log.stat().st_size
                os.kill(process.pid, signal.SIGUSR1)  # faulthandler: every thread's stack
                time.sleep(3)
                os.killpg(process.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(SAMPLE_S)
        process.returncode = os.waitstatus_to_exitcode(status)
    stacks = None
    if dump_from is not None:
        with open(log, errors="replace") as f:
            f.seek(dump_from)
            stacks = f.read().strip()
    return {"returncode": process.returncode, "killed": killed, "stacks": stacks,
            "wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_bytes": usage.ru_maxrss * 1024, "sampled_tree_peak_bytes": peak}


def scene_folder(cache: Path, n_points: int, seed: int) -> Path:
    return cache / f"n{n_points}-seed{seed}"


def ensure_scene(cache: Path, n_points: int, seed: int, max_rss: float | None) -> dict:
    """The scene of ``n_points`` in the cache, generated (in a child) when missing."""
    folder = scene_folder(cache, n_points, seed)
    summary = scene_module.scene_summary(folder)
    if summary is not None:
        return {**summary, "cached": True}
    if folder.exists():
        shutil.rmtree(folder)  # another generator version
    report = cache / f"{folder.name}.scene.json"
    log = cache / f"{folder.name}.scene.log"
    usage = run_child([sys.executable, scene_module.__file__, str(n_points), str(folder),
                       "--seed", str(seed), "--json", str(report)], log, timeout=None,
                      max_rss=max_rss)
    if usage["returncode"] != 0:
        raise RuntimeError(f"scene of {n_points} points: generator failed ({usage}); see {log}")
    summary = json.loads(report.read_text())
    return {**summary, "cached": False, "generation_wall_s": usage["wall_s"],
            "generation_cpu_s": usage["cpu_s"], "generation_peak_rss_bytes":
            usage["peak_rss_bytes"]}


#: The point store of each layout: the generator's raster order (row by row of tiles, as other
#: tools write their STMs), and the same points in Morton order (as ``depsi run`` stores them).
LAYOUT_STORES = {"raster": scene_module.PS_STORE, "morton": "ps_morton.zarr"}


def ensure_layout(folder: Path, layout: str) -> Path:
    """The scene's point store in ``layout``: the Morton copy written once (atomically)."""
    store = folder / LAYOUT_STORES[layout]
    if layout == "raster" or (store / "zarr.json").exists():
        return store
    from depsi.io.store import open_stm, save_stm

    points = open_stm(folder / scene_module.PS_STORE)
    # each point's position in the generator's store, which indexes the truth
    points = points.assign(scene_index=("space", np.arange(points.sizes["space"])))
    save_stm(points, store, overwrite=True, reorder=True)
    return store


def busy_stacks(dump: str) -> str:
    """The threads of a faulthandler dump that are somewhere outside the standard library
    (idle pool and event-loop threads left out; the full dump stays in the log)."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    frames = [line for line in dump.splitlines() if not line.strip() or line.startswith(
        ("Thread 0x", "Current thread 0x", "  File"))]  # not the log lines written meanwhile
    blocks = [b for b in "\n".join(frames).split("\n\n") if b.strip()]
    busy = [b for b in blocks if any(
        line.strip().startswith("File") and stdlib not in line for line in b.splitlines())]
    return "\n\n".join(busy or blocks)


def hotspots(stacks: Path, top: int = 4) -> dict:
    """A sampling profile from the stack dumps of a child: per step (found from the outermost
    chain function on any thread), its samples and the innermost depsi frames most often on
    some thread, each with its share of the step's samples."""
    import collections
    import re

    text = stacks.read_text(errors="replace") if stacks.exists() else ""
    samples: collections.Counter = collections.Counter()
    frames: dict = collections.defaultdict(collections.Counter)
    for dump in text.split("Timeout (")[1:]:
        threads = [[line.strip() for line in block.splitlines()
                    if line.strip().startswith("File ")] for block in dump.split("\n\n")]
        step = "other"
        for found in (_step_of(f) for t in threads for f in reversed(t)):
            if found is not None:
                step = found
                break
        samples[step] += 1
        seen = set()
        for thread in threads:
            at = next((i for i, f in enumerate(thread)
                       if "/depsi/" in f and "/benchmarks/" not in f), None)
            if at is None or any("/dask/" in f for f in thread[:at]):
                continue  # no depsi code, or waiting for Dask's threads (sampled themselves)
            match = re.search(r'/depsi/(.+)", line (\d+) in (\w+)', thread[at])
            if match:
                seen.add(f"{match.group(1)}:{match.group(2)} {match.group(3)}")
        frames[step].update(seen)
    return {step: {"samples": count,
                   "frames": [(frame, n / count) for frame, n in frames[step].most_common(top)]}
            for step, count in samples.items()}


def _log_tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def _progress(path: Path) -> tuple[list[dict], str | None]:
    """Finished steps and the step running when the progress file ends."""
    steps, running = [], None
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("event") == "start":
                running = entry["step"]
            else:
                steps.append(entry)
                running = None
    return steps, running


def bench_size(n_points: int, args, layout: str = "raster") -> dict:
    """Scene, chain in a child, figures: one size, never raising."""
    row = {"n_points": n_points, "layout": layout}
    try:
        row["scene"] = ensure_scene(args.cache, n_points, args.seed, args.max_rss)
        ensure_layout(scene_folder(args.cache, n_points, args.seed), layout)
    except Exception as err:  # reported per size
        return {**row, "status": "scene failed", "error": repr(err)}
    folder = scene_folder(args.cache, n_points, args.seed)
    mode = "local" if args.local_cluster else "chain"
    out = args.cache / f"{folder.name}.{layout}.{mode}.json"
    log = out.with_suffix(".log")
    for stale in (out, out.with_suffix(".progress"), out.with_suffix(".stacks")):
        stale.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--child", str(folder), str(out),
               "--options", json.dumps(args.options),
               "--stack-sample-s", str(args.stack_sample_s), "--layout", layout] + (
        ["--local-cluster"] * args.local_cluster)
    row["child"] = run_child(command, log, timeout=args.timeout, max_rss=args.max_rss)
    row["log"] = str(log)
    if args.stack_sample_s > 0:
        row["hotspots"] = hotspots(out.with_suffix(".stacks"))
        row["stack_sample_s"] = args.stack_sample_s
    if out.exists():
        row.update(json.loads(out.read_text()))
    else:
        steps, running = _progress(out.with_suffix(".progress"))
        row.update(status="killed" if row["child"]["killed"] else "died", steps=steps,
                   running_step=running,
                   error=row["child"]["killed"] or f"exit status {row['child']['returncode']}",
                   stacks=row["child"]["stacks"] or _log_tail(log))
    return row


# ------------------------------------------------------------------------------ the report
def _count(count: int | None, n: int) -> str:
    """A count of points and its share of ``n``, with three significant digits."""
    if count is None:
        return "-"
    share = 100.0 * count / n
    return f"{count:,} ({share:.3g} %)"


def _fmt(value, spec: str, missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, spec)


def markdown(rows: list[dict]) -> str:
    head = ("| points | order | scene | generate s (peak GB) | status | wall s | CPU s | "
            "points/s | x read | peak RSS GB | velocity RMSE mm/yr (floors noise / no corr.) | "
            "height RMSE m (floors) | first order kept | in result | coherent | growth |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    previous = {}  # the last size of each layout
    for row in rows:
        n, scene = row["n_points"], row.get("scene", {})
        generate = ("cached" if scene.get("cached") else
                    f"{_fmt(scene.get('generation_wall_s'), '.1f')} "
                    f"({_fmt((scene.get('generation_peak_rss_bytes') or 0) / GB, '.2f')})")
        acc = row.get("accuracy", {})
        wall = row.get("chain_wall_s")
        growth = "-"
        layout = row.get("layout", "raster")
        last = previous.get(layout)
        if wall and last and n != last[0]:  # rows of one size (options) have none
            growth = f"{math.log(wall / last[1]) / math.log(n / last[0]):.2f}"
        peak = row.get("child", {}).get("peak_rss_bytes")
        velocity = (f"{_fmt(acc.get('velocity_rmse', float('nan')) * 1e3, '.2f')} "
                    f"({_fmt(acc.get('floor_velocity_noise', float('nan')) * 1e3, '.2f')} / "
                    f"{_fmt(acc.get('floor_velocity_nocorr', float('nan')) * 1e3, '.2f')})")
        height = (f"{_fmt(acc.get('height_error_rmse'), '.2f')} "
                  f"({_fmt(acc.get('floor_height_noise'), '.2f')} / "
                  f"{_fmt(acc.get('floor_height_nocorr'), '.2f')})")
        status = row.get("status", "?")
        if status != "ok":
            status += f" in {row.get('running_step') or '?'}"
        lines.append(
            f"| {n:,} | {row.get('layout', 'raster')} | {_fmt(scene.get('extent_km'), '.0f')} km "
            f"| {generate} | {status} | "
            f"{_fmt(wall, '.1f')} | {_fmt(row.get('chain_cpu_s'), '.1f')} | "
            f"{_fmt(n / wall if wall else None, ',.0f')} | "
            f"{_fmt(wall / row['read_s'] if wall and row.get('read_s') else None, ',.0f')} | "
            f"{_fmt(peak and peak / GB, '.2f')} | "
            f"{velocity if acc else '-'} | {height if acc else '-'} | "
            f"{_fmt(acc.get('n_first_order'), ',')} | {_count(acc.get('n_result'), n)} | "
            f"{_count(acc.get('n_coherent'), n)} | "
            f"{growth} |")
        if wall:
            previous[layout] = (n, wall)
    return "\n".join(lines)


def _failed_step(text: str) -> str:
    """Where a traceback outside the timed steps failed: its innermost known function."""
    for line in reversed(text.splitlines()):
        for name in ("chain_config", "accuracy", "scheduler"):
            if f"in {name}" in line:
                return name
    return "?"


def steps_markdown(rows: list[dict]) -> str:
    names = []
    for row in rows:
        names += [s["step"] for s in row.get("steps", []) if s["step"] not in names]
    if not names:
        return ""
    head = "| step | " + " | ".join(
        f"{r['n_points']:,} {r.get('layout', 'raster')}: wall s / CPU s (of it system) / "
        "peak GB / minor faults"
        for r in rows) + " |"
    lines = [head, "|---|" + "---|" * len(rows)]
    for name in names:
        cells = []
        for row in rows:
            step = next((s for s in row.get("steps", []) if s["step"] == name), None)
            cells.append(f"{step['wall_s']:.1f} / {step['cpu_s']:.1f} "
                         f"({_fmt(step.get('sys_s'), '.1f')}) / "
                         f"{step['peak_rss_bytes'] / GB:.2f} / "
                         f"{_fmt(step.get('minor_faults'), ',')}" if step else
                         ("running" if row.get("running_step") == name else "-"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def workers_line(row: dict) -> str:
    """The cluster workers' peak memory, in one line."""
    workers = row["workers"]
    maxrss = workers.get("worker_maxrss_bytes", {})
    sampled = workers.get("sampled_peak_bytes", {})
    peaks = ", ".join(
        f"{sampled.get(address, 0) / GB:.2f} GB sampled / "
        + (f"{maxrss[address] / GB:.2f} GB ru_maxrss" if address in maxrss else "gone")
        for address in sorted(set(sampled) | set(maxrss) - {"error"}))
    tree = row.get("child", {}).get("sampled_tree_peak_bytes", 0) / GB
    return (f"workers' peak memory: {peaks or 'not sampled'}; {workers.get('workers_seen', 0)} "
            f"worker(s) seen (more than 2: restarts); whole process tree {tree:.2f} GB")


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--chain-option: expected key=value, found {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6])
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "depsi-bench-scale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chain-option", action="append", type=_option, default=[],
                        metavar="KEY=VALUE", help="keyword of run_ps_chain (JSON value)")
    parser.add_argument("--local-cluster", action="store_true",
                        help="run the chain in a LocalCluster of 2 workers x 2 GB")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds the chain's child may run per size (default: no limit)")
    parser.add_argument("--max-rss-gb", type=float,
                        default=0.6 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
                        / GB, help="kill a child whose process tree grows past this")
    parser.add_argument("--stack-sample-s", type=float, default=2.0,
                        help="seconds between stack samples of the chain's child (a sampling "
                             "profile per step; 0: none)")
    parser.add_argument("--report", nargs="+", type=Path, metavar="RESULTS_JSON",
                        help="print the tables of saved results-*.json files (rows in the "
                             "order given) instead of running")
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUT_STORES),
                        default=["raster", "morton"],
                        help="orders of the points in the store: the generator's raster order "
                             "and a Morton-ordered copy (default: both)")
    parser.add_argument("--layout", default="raster", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, metavar=("SCENE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.exit(child_main(Path(args.child[0]), Path(args.child[1]), json.loads(args.options),
                            args.local_cluster, args.stack_sample_s, args.layout))
    if args.report:
        rows = [row for path in args.report for row in json.loads(path.read_text())]
        print_report(rows, "from " + ", ".join(p.name for p in args.report))
        return
    args.options = {}
    for key, value in args.chain_option:  # section.field=value -> {section: {field: value}}
        section, _, name = key.partition(".")
        args.options.setdefault(section, {})[name] = value
    args.max_rss = args.max_rss_gb * GB if args.max_rss_gb else None
    args.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        for layout in args.layouts:
            row = bench_size(int(size), args, layout)
            rows.append(row)
            print(f"{int(size):,} points, {layout} order: {row.get('status')}"
                  + (f" ({row.get('error')})" if row.get("status") != "ok" else ""), flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.cache / f"results-{stamp}.json").write_text(json.dumps(rows, indent=1, default=str))
    mode = "LocalCluster 2 x 2 GB" if args.local_cluster else "threads"
    print_report(rows, f"{mode}; options {args.options or 'default'}; cache {args.cache}")


def print_report(rows: list[dict], what: str) -> None:
    """The tables, failures and workers' memory of ``rows``, as markdown."""
    print(f"\nPS chain at scale ({what})\n")
    print(markdown(rows))
    print("\nPer step (wall s / CPU s, of it system / peak RSS GB after the step / minor page "
          "faults):\n")
    print(steps_markdown(rows))
    for row in rows:
        if row.get("hotspots"):
            print(f"\n{row['n_points']:,} points, where the time went (stacks every "
                  f"{row['stack_sample_s']:g} s; innermost depsi frame on any thread, share of "
                  f"the step's samples):\n")
            for step, spot in row["hotspots"].items():
                frames = ", ".join(f"{frame} {share:.0%}" for frame, share in spot["frames"])
                print(f"- {step} ({spot['samples']} samples): {frames or '-'}")
    for row in rows:
        if row.get("status") != "ok":
            print(f"\n{row['n_points']:,} points: {row.get('status')}: {row.get('error')}")
            print(row.get("traceback") or busy_stacks(row.get("stacks") or ""))
        if row.get("workers"):
            print(f"\n{row['n_points']:,} points: {workers_line(row)}")


if __name__ == "__main__":
    main()
