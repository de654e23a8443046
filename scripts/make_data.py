"""Make the bundled example data in ``data/`` from the simulator, deterministically.

Two stores, both Zarr v3 written by :func:`depsi.io.save_stm` (LZ4-compressed, atomic):

* ``data/slc_stack.zarr``: a simulated SLC stack ``(azimuth, range, time)`` of
  ``SLC_SHAPE`` pixels and ``SLC_EPOCHS`` epochs (``complex``, ``h2ph``, ``lat``/``lon``).
  Its truth is not stored: ``simulate_stack(**SLC_ARGS)`` gives it again, exactly.
* ``data/ps_stm.zarr``: a point STM ``(space, time)`` of the PS candidates selected by
  amplitude dispersion (:func:`~depsi.processing.selection.ps_selection`) on a larger simulated
  stack (``STM_ARGS``): ``complex``, ``amplitude``, ``phase``, ``h2ph``, coordinates ``lat``,
  ``lon``, ``azimuth``, ``range``, ``time``; attrs ``wavelength``, ``mother_time``.

Run from the repository root (about 20 s on two cores)::

    python scripts/make_data.py            # writes data/slc_stack.zarr and data/ps_stm.zarr
    python scripts/make_data.py --out DIR  # elsewhere (the tests compare the two)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from depsi.io import open_stm, save_stm
from depsi.processing.selection import ps_selection
from depsi.simulate import simulate_stack

#: Arguments of the small SLC stack (128 x 128 pixels, 12 epochs).
SLC_ARGS = dict(shape=(128, 128), n_epochs=12, seed=7, ps_fraction=0.03)

#: Arguments of the stack the point STM is selected from (about 20,000 points x 12 epochs).
STM_ARGS = dict(shape=(900, 900), n_epochs=12, seed=11, ps_fraction=0.02)

#: NAD threshold of the point STM's selection.
STM_NAD_THRESHOLD = 0.25

#: The variables kept in the point STM.
STM_VARIABLES = ("complex", "amplitude", "phase", "h2ph")


def make_slc_stack(out: Path) -> Path:
    """Write the small simulated SLC stack to ``out / "slc_stack.zarr"``."""
    stack, _truth = simulate_stack(**SLC_ARGS)
    stack = stack.drop_vars("bperp")  # per-epoch coordinate; h2ph carries the baselines
    stack.attrs.update(description="depsi example SLC stack: simulate_stack(**SLC_ARGS) in "
                                   "scripts/make_data.py", simulate_args=_as_attrs(SLC_ARGS))
    return save_stm(stack, out / "slc_stack.zarr", overwrite=True)


def make_ps_stm(out: Path) -> Path:
    """Select PS candidates on a larger simulated stack; write the point STM."""
    stack, _truth = simulate_stack(**STM_ARGS)
    ps = ps_selection(stack, method="nad", threshold=STM_NAD_THRESHOLD)
    keep = [name for name in STM_VARIABLES if name in ps]
    ps = ps[keep + ["amplitude_dispersion"]]
    ps = ps.drop_vars([c for c in ps.coords
                       if c not in ("time", "azimuth", "range", "lat", "lon")])
    ps.attrs = {key: ps.attrs[key] for key in ("wavelength", "mother_time") if key in ps.attrs}
    ps.attrs.update(description="depsi example point STM: ps_selection(simulate_stack("
                                "**STM_ARGS), threshold=STM_NAD_THRESHOLD) in "
                                "scripts/make_data.py", simulate_args=_as_attrs(STM_ARGS),
                    selection_threshold=STM_NAD_THRESHOLD)
    return save_stm(ps, out / "ps_stm.zarr", overwrite=True)


def _as_attrs(args: dict) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in args.items()}


def make_all(out: str | Path = "data") -> list[Path]:
    """Write both example stores to ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return [make_slc_stack(out), make_ps_stm(out)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data"),
                        help="output folder (default: data/ of the repository)")
    args = parser.parse_args(argv)
    for path in make_all(args.out):
        ds = open_stm(path)
        print(f"{path}: {dict(ds.sizes)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
