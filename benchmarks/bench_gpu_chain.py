"""The PS chain on the CPU and on a GPU for the same scene, and how far the two results agree
(part of ``scripts/gpu-check.sh``).

Three subcommands, each run in its own process by the script (so each can be given a time limit
and its peak memory is its own):

* ``scene N FOLDER``: the scale benchmark's scene of ``N`` PS (``_scale_scene.py``, independent
  of ``depsi.simulate``); an existing complete scene of the same generator version is reused.
* ``run FOLDER DEVICE SAVE.npz``: the chain's steps on ``FOLDER/ps.zarr`` as ``run_ps_chain``
  runs them with ``devices=[DEVICE]`` (``cpu`` or ``cuda:0``), each step timed as
  ``bench_scale.py`` times them (its ``run_chain``; on a GPU each step waits for the device's
  queued work before it ends); the per-point results go to ``SAVE.npz`` and the figures
  (wall and CPU time of the chain and of each step, peak RSS, accuracy against the truth as
  ``bench_scale.py`` scores it) to ``SAVE.json``.
* ``compare CPU.npz GPU.npz --json OUT``: points in both results, and per variable the largest
  absolute difference on the common points (velocity in mm/yr, height error in m, displacement
  in mm), the fraction of ambiguities that differ and the points only one run kept.

Run: ``python benchmarks/bench_gpu_chain.py scene 1e6 /tmp/scene`` then ``run`` twice and
``compare``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scale_scene as scene_module  # noqa: E402

#: Per-point variables of the result kept for the comparison, with the factor to their unit.
COMPARED = {"velocity": ("mm/yr", 1e3), "height_error": ("m", 1.0),
            "temporal_coherence": ("", 1.0), "displacement": ("mm", 1e3)}
SAVED = (*COMPARED, "point_index", "order", "ambiguity")


def make_scene(n_points: int, folder: Path) -> dict:
    summary = scene_module.scene_summary(folder)
    if summary is not None and int(summary["n_points"]) == n_points:
        return {**summary, "reused": True}
    if folder.exists():
        raise FileExistsError(f"scene: {str(folder)!r} exists but is not a scene of "
                              f"{n_points:,} points of this generator version")
    return {**scene_module.write_scene(n_points, folder), "reused": False}


def _synchronised(record, device: str):
    """``record`` (bench_scale's step timer) that waits for ``device``'s queued work before a
    step ends, so each step's time holds its own GPU work."""
    if not device.startswith("cuda"):
        return record
    import cupy

    def timed(name, func):
        def run_and_wait():
            out = func()
            cupy.cuda.Device().synchronize()
            return out
        return record(name, run_and_wait)

    return timed


def run(folder: Path, device: str, save: Path) -> dict:
    from bench_scale import _Recorder, accuracy, run_chain

    from depsi.io.store import open_stm

    ps_stm = open_stm(folder / scene_module.PS_STORE)
    # the chain's steps as run_ps_chain runs them, each timed as bench_scale times them
    progress = save.with_suffix(".progress.jsonl")
    progress.unlink(missing_ok=True)
    record = _Recorder(progress)
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_chain(ps_stm, {}, _synchronised(record, device), devices=[device])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    figures = {"device": device, "n_points": int(ps_stm.sizes["space"]), "wall_s": wall,
               "cpu_s": cpu, "points_per_s": ps_stm.sizes["space"] / wall,
               "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
               "run_ps_chain": "bench_scale.run_chain (run_ps_chain's steps, each timed)",
               "steps": [{"step": step["step"], "wall_s": step["wall_s"],
                          "cpu_s": step["cpu_s"],
                          "peak_rss_gib": step["peak_rss_bytes"] / 2**30}
                         for step in record.steps]}
    if device.startswith("cuda"):
        import cupy

        figures["gpu_pool_gib"] = cupy.get_default_memory_pool().total_bytes() / 2**30
    figures |= {key: int(result.attrs[key]) for key in ("n_first_order", "n_first_order_kept",
                                                         "n_densified", "n_rejected")
                if key in result.attrs}
    figures["accuracy"] = accuracy(result, folder / scene_module.TRUTH_STORE)
    np.savez(save, **{name: np.asarray(result[name].values) for name in SAVED
                      if name in result})
    return figures


def compare(cpu_path: Path, gpu_path: Path) -> dict:
    cpu, gpu = np.load(cpu_path), np.load(gpu_path)
    common, in_cpu, in_gpu = np.intersect1d(cpu["point_index"], gpu["point_index"],
                                            assume_unique=True, return_indices=True)
    out = {"n_cpu": int(cpu["point_index"].size), "n_gpu": int(gpu["point_index"].size),
           "n_common": int(common.size),
           "only_cpu": int(cpu["point_index"].size - common.size),
           "only_gpu": int(gpu["point_index"].size - common.size)}
    if "order" in cpu.files and "order" in gpu.files:
        out["order_differing"] = int((cpu["order"][in_cpu] != gpu["order"][in_gpu]).sum())
    if "ambiguity" in cpu.files and "ambiguity" in gpu.files:
        out["ambiguity_fraction_differing"] = float(
            np.mean(cpu["ambiguity"][in_cpu] != gpu["ambiguity"][in_gpu]))
    for name, (unit, factor) in COMPARED.items():
        if name not in cpu.files or name not in gpu.files:
            continue
        c = cpu[name][in_cpu].astype(np.float64) * factor
        g = gpu[name][in_gpu].astype(np.float64) * factor
        both = np.isfinite(c) & np.isfinite(g)
        diff = np.abs(c[both] - g[both])
        out[name] = {"unit": unit, "max_abs_diff": float(diff.max()) if diff.size else 0.0,
                     "rms_diff": float(np.sqrt(np.mean(diff ** 2))) if diff.size else 0.0,
                     "finite_mismatch": int((np.isfinite(c) != np.isfinite(g)).sum())}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("scene")
    p.add_argument("n_points", type=float)
    p.add_argument("folder", type=Path)
    p.add_argument("--json", type=Path)
    p = sub.add_parser("run")
    p.add_argument("folder", type=Path)
    p.add_argument("device")
    p.add_argument("save", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("cpu", type=Path)
    p.add_argument("gpu", type=Path)
    p.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    if args.command == "scene":
        figures, out = make_scene(int(args.n_points), args.folder), args.json
    elif args.command == "run":
        figures, out = run(args.folder, args.device, args.save), args.save.with_suffix(".json")
    else:
        figures, out = compare(args.cpu, args.gpu), args.json
    text = json.dumps(figures, indent=1, default=float)
    print(text)
    if out is not None:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
