"""Side by side with another processor on a real stack: depsi and dolphin 0.42.9 on the 93-epoch
Sentinel-1 interferogram stack over Houston (``psps_houston_crop``: the repository's 64 x 64
pixels of 100 m, or the 200 x 200 crop under ``$DEPSI_REALDATA``).

1. dolphin, in a venv of its own with real GDAL bindings (``_dolphin_workflow.py``): its whole
   displacement workflow (EMI phase linking in ministacks, nearest-3 interferograms, snaphu,
   network inversion, velocity) on the pseudo-SLCs ``amplitude * exp(i angle(s_t conj(s_r)))``
   that both programs read. Its PS step is off (``amp_dispersion_threshold: 0``): on this
   multilooked stack its amplitude dispersion passes 97 % of the pixels, which then keep their
   raw phase and a temporal coherence of exactly 1, so that every pixel looks coherent and is
   unwrapped as such. Its other defaults stay (``--dolphin-half-window`` sets the phase
   linking's half window; dolphin's 7 x 14 is made for 5 x 10 m CSLCs).
2. depsi, ``depsi run`` from a YAML alone (``input.format: interferograms``, no baselines), in a
   subprocess, timed with its peak RSS.
3. The comparison: each one's measurement points and their overlap; on the pixels both find
   coherent (dolphin's temporal coherence >= 0.8 and a depsi point), the correlation of the
   velocities and the RMS of their difference after a common reference (the median
   difference); time and peak memory. Evidence that rests on neither program: the wrapped
   phase's own consistency with each velocity, ``|mean_t exp(i (phi_t - m2ph v t))|`` over the
   reference-date interferograms, of neighbouring pixels' phase differences (the atmosphere and
   the reference's noise cancel), so a velocity of the wrong sign or size scores lower.
4. Maps of both velocity fields side by side (``--figure``).

Usage: ``python benchmarks/bench_real_stack.py [--crop DIR] [--work DIR]
[--dolphin-npz FILE] [--dolphin-half-window Y X] [--figure docs/figures/real_stack.png]``.
Not part of the test suite (dolphin's run takes about ten minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from _dolphin_workflow import DEFAULT_CROP, run_dolphin_workflow  # noqa: E402
from _dolphin_workflow_driver import crop_shape  # noqa: E402

logger = logging.getLogger("bench_real_stack")

WAVELENGTH = 0.05546576
PIXEL = 100.0
COHERENT = 0.8


def run_depsi(crop: Path, work: Path) -> dict:
    """``depsi run`` on the crop from a YAML alone, in a subprocess; its result and costs."""
    from depsi.io import open_stm

    config = {"input": {"format": "interferograms", "path": str(crop),
                        "wavelength": WAVELENGTH, "shape": list(crop_shape(crop)),
                        "pixel_spacing": [PIXEL, PIXEL]},
              "output": {"workspace": str(work / "ws"), "exports": ["csv"]}}
    path = work / "depsi.yaml"
    path.write_text(yaml.safe_dump(config))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "depsi.cli", "run", str(path), "--no-progress"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    (work / "depsi.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"depsi run failed:\n{done.stderr[-3000:]}")
    result = open_stm(work / "ws" / "stm.zarr").compute()
    return {"result": result, "wall_s": wall,
            "peak_rss_gb": max(peak, before) / 2**20}  # ru_maxrss is in KiB on Linux


def phase_consistency(crop: Path, velocity_a: np.ndarray, velocity_b: np.ndarray,
                      mask: np.ndarray, *,
                      radius: float = 8.0, min_difference: float = 1e-3) -> dict:
    """How well each velocity field explains the wrapped phase, pair of pixels by pair.

    For the pixels of ``mask``, every pair within ``radius`` pixels whose velocities (of the
    field judged) differ by ``min_difference`` m/yr or more: the phase difference of their
    reference-date interferograms, ``I_p conj(I_q)`` (the atmosphere, the orbits and the
    reference's noise nearly cancel over a few hundred metres), against the field's velocity
    difference, ``|mean_t exp(i (dphi_t - m2ph (v_p - v_q) t))|``, averaged over the pairs;
    and the same with the velocity difference's sign turned and with none. Neither program's
    processing enters: only the files and the two velocity fields (m/yr).
    """
    from scipy.spatial import cKDTree

    from depsi.conventions import phase_per_metre, years_since
    from depsi.io.interferograms import from_interferograms

    stack = from_interferograms(crop, wavelength=WAVELENGTH, shape=crop_shape(crop))
    years = years_since(stack["time"].values, np.datetime64(stack.attrs["mother_time"]))
    # the interferograms s_r conj(s_t) of depsi's convention: conjugates of the pseudo-SLCs
    rows, cols = np.nonzero(mask)
    phasor = np.conj(np.exp(1j * np.angle(stack["complex"].values[rows, cols])))
    pairs = cKDTree(np.c_[rows, cols]).query_pairs(radius, output_type="ndarray")
    difference = phasor[pairs[:, 0]] * np.conj(phasor[pairs[:, 1]])
    m2ph = phase_per_metre(WAVELENGTH)
    out: dict = {"radius_pixels": radius, "min_difference_mm_yr": min_difference * 1000}
    for name, field in (("depsi", velocity_a), ("dolphin", velocity_b)):
        values = field[rows, cols]
        dv = values[pairs[:, 0]] - values[pairs[:, 1]]
        chosen = np.abs(dv) >= min_difference
        scores = {"pairs": int(chosen.sum())}
        for label, sign in (("as_estimated", 1.0), ("sign_turned", -1.0), ("no_motion", 0.0)):
            model = np.exp(-1j * m2ph * sign * dv[chosen, None] * years[None, :])
            scores[label] = round(float(np.mean(np.abs(np.mean(
                difference[chosen] * model, axis=1)))), 4)
        out[name] = scores
    return out


def compare(depsi: dict, dolphin: dict, crop: Path) -> dict:
    result = depsi["result"]
    az, rg = result["azimuth"].values, result["range"].values
    ours = np.full(crop_shape(crop), np.nan)
    ours[az, rg] = result["velocity"].values * 1000.0
    theirs = np.asarray(dolphin["velocity"], np.float64) * 1000.0
    coherent = np.nan_to_num(np.asarray(dolphin["temporal_coherence"], np.float64)) >= COHERENT
    both = coherent & np.isfinite(ours) & np.isfinite(theirs)
    difference = ours[both] - theirs[both]
    offset = float(np.median(difference))
    rms = float(np.sqrt(np.mean((difference - offset) ** 2)))
    kinds = result["scatterer"].values if "scatterer" in result else np.zeros(len(az))
    figures = {
        "depsi_points": int(np.isfinite(ours).sum()),
        "depsi_ps": int((kinds == 0).sum()), "depsi_ds": int((kinds == 1).sum()),
        "dolphin_coherent": int(coherent.sum()),
        "dolphin_coherent_with_depsi_point": int(both.sum()),
        "coverage_of_dolphin_coherent": float(both.sum() / max(coherent.sum(), 1)),
        "correlation": float(np.corrcoef(ours[both], theirs[both])[0, 1]),
        "rms_after_common_reference_mm_yr": rms,
        "common_reference_offset_mm_yr": offset,
        "depsi_velocity_p5_p95_mm_yr": np.percentile(ours[both], [5, 95]).round(2).tolist(),
        "dolphin_velocity_p5_p95_mm_yr": np.percentile(theirs[both], [5, 95]).round(2).tolist(),
        "depsi_wall_s": round(depsi["wall_s"], 1), "depsi_peak_rss_gb": round(
            depsi["peak_rss_gb"], 2),
        "dolphin_wall_s": round(float(dolphin["wall_s"]), 1),
        "dolphin_peak_rss_gb": round(float(dolphin.get("process_peak_rss_gb",
                                                       dolphin["peak_rss_gb"])), 2),
    }
    figures["phase_consistency"] = phase_consistency(
        crop, np.nan_to_num(ours / 1000.0), np.nan_to_num(theirs / 1000.0), both)
    return figures, ours, theirs, coherent


def draw(ours: np.ndarray, theirs: np.ndarray, coherent: np.ndarray, figure: Path,
         offset: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limit = float(np.nanpercentile(np.abs(ours), 98))
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), constrained_layout=True)
    for ax, field, title in ((axes[0], ours, "depsi (its points)"),
                             (axes[1], np.where(coherent, theirs + offset, np.nan),
                              "dolphin 0.42.9 (temporal coherence >= 0.8),\n"
                              "shifted to depsi's reference")):
        image = ax.imshow(field, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="none")
        ax.set_title(title)
        ax.set_xlabel("range pixel (100 m)")
        ax.set_ylabel("azimuth pixel (100 m)")
    fig.colorbar(image, ax=axes, label="LOS velocity (mm/yr), positive towards the satellite")
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crop", type=Path, default=DEFAULT_CROP)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--dolphin-npz", type=Path, default=None,
                        help="a finished dolphin run's .npz (skips running dolphin)")
    parser.add_argument("--dolphin-half-window", type=int, nargs=2, default=None,
                        help="phase linking's half window (rows, columns); default dolphin's")
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-real-stack-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.dolphin_npz is not None:
        with np.load(args.dolphin_npz) as data:
            dolphin = {key: data[key] for key in data.files}
    else:
        options = {"ps_options": {"amp_dispersion_threshold": 0.0}}
        if args.dolphin_half_window is not None:
            y, x = args.dolphin_half_window
            options["phase_linking"] = {"half_window": {"y": y, "x": x}}
        dolphin = run_dolphin_workflow(work / "dolphin", work / "dolphin.npz",
                                       crop_dir=args.crop, options=options)
    depsi = run_depsi(args.crop, work)
    figures, ours, theirs, coherent = compare(depsi, dolphin, args.crop)
    print(json.dumps(figures, indent=1))
    if args.figure is not None:
        draw(ours, theirs, coherent, args.figure, figures["common_reference_offset_mm_yr"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
