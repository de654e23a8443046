"""The result STM's points: the variables every point of a result carries, and the merge of
first-order and densified points back into the input's order."""

from __future__ import annotations

import numpy as np
import xarray as xr

#: Variables of the result STM.
RESULT_VARIABLES = ("velocity", "height_error", "displacement", "temporal_coherence",
                    "ambiguity", "aps", "unwrapped_phase")

#: Coordinates along space a result keeps (the rest are the inputs' own).
RESULT_COORDS = ("time", "azimuth", "range", "lat", "lon", "x", "y", "point_index")


def result_view(ds: xr.Dataset, *, order: int, keep: tuple[str, ...] = ()) -> xr.Dataset:
    """The result variables of one set of points (and ``keep``), with their ``order``
    (1 first-order, 2 densified)."""
    out = ds[list(RESULT_VARIABLES) + list(keep)]
    out = out.assign(order=("space", np.full(ds.sizes["space"], order, dtype=np.int8)))
    drop = [c for c in out.coords if c not in RESULT_COORDS and "space" in out[c].dims]
    return out.drop_vars(drop)


def merged_in_input_order(a: xr.Dataset, b: xr.Dataset) -> xr.Dataset:
    """The points of ``a`` and ``b`` (their common variables) in the order of ``point_index``,
    each variable written once into its place (no concatenated copy sorted again).

    ``b``'s variables are dropped from this frame's ``b`` as they are copied: given the only
    reference to ``b``, memory holds its rest and the merged variables so far, not both whole.
    """
    index = np.concatenate([a["point_index"].values, b["point_index"].values])
    place = np.empty(index.size, np.int64)
    place[np.argsort(index, kind="stable")] = np.arange(index.size)
    n_a = a.sizes["space"]
    merged = {}
    for name, var in a.variables.items():
        if "space" not in var.dims or name not in b.variables:
            continue
        var = var.transpose("space", ...)
        other = b[name].transpose(*var.dims)
        values = np.empty((index.size,) + var.shape[1:],
                          np.result_type(var.dtype, other.dtype))
        values[place[:n_a]] = var.values
        values[place[n_a:]] = other.values
        merged[name] = (var.dims, values)
        del other
        b = b.drop_vars(name)
    return xr.Dataset({name: merged[name] for name in a.data_vars if name in merged},
                      coords={name: merged.get(name, a[name].variable) for name in a.coords
                              if name in merged or "space" not in a[name].dims})
