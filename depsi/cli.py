"""The ``depsi`` command line: simulate stacks, inspect stores, run the demo.

Run ``depsi --help`` for the commands and ``depsi COMMAND --help`` for their options.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger("depsi.cli")

DESCRIPTION = """\
depsi: Persistent Scatterer InSAR time series on space-time matrices (STM).

An STM is an xarray Dataset with dims (space, time), stored as chunked Zarr and
processed lazily with Dask. Commands:

  depsi demo                 simulate a small stack, run the PS chain, write results and plots
  depsi simulate OUT.zarr    write a simulated SLC stack (with its truth) to Zarr or raw binary
  depsi info PATH            dims, variables, chunking, attributes and size on disk of a store
"""


def _size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def describe_store(path: Path) -> str:
    """A text summary of a Zarr store: dims, variables with dtype and chunks, attrs, size."""
    import xarray as xr

    if not path.exists():
        raise FileNotFoundError(f"store {str(path)!r} does not exist")
    consolidated = (path / ".zmetadata").exists() and not (path / "zarr.json").exists()
    ds = xr.open_zarr(path, consolidated=consolidated, chunks={})
    fmt = "v3" if (path / "zarr.json").exists() else "v2"
    lines = [f"{path}  (Zarr {fmt}, {_human_bytes(_size_on_disk(path))} on disk)",
             "dims: " + ", ".join(f"{k}={v}" for k, v in ds.sizes.items())]
    for title, variables in (("coordinates", ds.coords), ("variables", ds.data_vars)):
        lines.append(f"{title}:")
        for name, var in variables.items():
            chunks = var.chunks
            chunk_text = ("chunks " + "x".join(str(max(c)) for c in chunks)) if chunks else ""
            lines.append(f"  {name:<28} {str(var.dtype):<12} ({', '.join(var.dims)})  "
                         f"{chunk_text}")
    if ds.attrs:
        lines.append("attributes:")
        lines.extend(f"  {k}: {v}" for k, v in ds.attrs.items())
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    sys.stdout.write(describe_store(Path(args.path)) + "\n")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from depsi import simulate

    kwargs = dict(shape=(args.azimuth, args.range), n_epochs=args.epochs, seed=args.seed,
                  ps_fraction=args.ps_fraction)
    if args.format == "zarr":
        out = simulate.write_stack_zarr(args.out, overwrite=args.overwrite, **kwargs)
    else:
        out = simulate.write_stack_binary(args.out, **kwargs)
        out = args.out
    logger.info("simulated stack written to %s", out)
    sys.stdout.write(f"{out}\n")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from depsi.demo import run_demo

    out = run_demo(Path(args.out), shape=(args.size, args.size), n_epochs=args.epochs,
                   seed=args.seed, overwrite=args.overwrite)
    sys.stdout.write(f"demo outputs written to {out.resolve()}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="depsi", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    info = sub.add_parser("info", help="describe a Zarr store (STM or SLC stack)")
    info.add_argument("path", help="path of the Zarr store")
    info.set_defaults(func=_cmd_info)

    sim = sub.add_parser("simulate", help="write a simulated SLC stack with known truth")
    sim.add_argument("out", help="output Zarr store (or folder with --format binary)")
    sim.add_argument("--azimuth", type=int, default=400, help="azimuth lines (default 400)")
    sim.add_argument("--range", type=int, default=400, help="range pixels (default 400)")
    sim.add_argument("--epochs", type=int, default=30, help="number of epochs (default 30)")
    sim.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    sim.add_argument("--ps-fraction", type=float, default=0.02,
                     help="fraction of pixels that are persistent scatterers (default 0.02)")
    sim.add_argument("--format", choices=("zarr", "binary"), default="zarr",
                     help="Zarr store with truth group, or raw per-epoch files with DORIS-like "
                          "metadata (default zarr)")
    sim.add_argument("--overwrite", action="store_true", help="replace an existing store")
    sim.set_defaults(func=_cmd_simulate)

    demo = sub.add_parser("demo", help="simulate a small stack and run the PS chain on it")
    demo.add_argument("--out", default="depsi-demo", help="output folder (default depsi-demo)")
    demo.add_argument("--size", type=int, default=300, help="scene size in pixels (default 300)")
    demo.add_argument("--epochs", type=int, default=30, help="number of epochs (default 30)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--overwrite", action="store_true", default=True,
                      help="replace outputs of an earlier demo (default)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``depsi`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    if args.command == "demo":
        level = min(level, logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        logger.error("%s", err)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
