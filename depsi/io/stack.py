"""sarxarray's names for raster SLC stacks: ``from_dataset``, ``multi_look`` and the
``.slcstack`` accessor (``mrm``, ``multi_look``, ``point_selection``), with sarxarray's meaning.

They let sarxarray users keep their calls; depsi's own path is :func:`~depsi.io.from_binary`
and :func:`~depsi.processing.ps_selection`. Differences on purpose: nothing here changes its
input (sarxarray's ``from_dataset`` and ``multi_look`` write into the Dataset they are given).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import xarray as xr

from depsi.stm.accessor import UnknownMethodError

#: Statistics ``multi_look`` offers, as in sarxarray.
MULTI_LOOK_STATISTICS = ("mean", "median")


def _amplitude(ds: xr.Dataset) -> xr.DataArray:
    if "amplitude" in ds.variables:
        return ds["amplitude"]
    if "complex" in ds.variables:
        # a NumPy ufunc on a DataArray returns a DataArray
        return cast(xr.DataArray, np.abs(ds["complex"])).rename("amplitude")
    raise KeyError(f"amplitude: expected 'amplitude' or 'complex' in the stack, found "
                   f"{sorted(map(str, ds.variables))}")


def from_dataset(ds: xr.Dataset) -> xr.Dataset:
    """An SLC stack (``complex``, ``amplitude``, ``phase``) from ``real`` and ``imag`` parts.

    As sarxarray's ``from_dataset``: ``ds`` has dims ``(azimuth, range, time)`` and variables
    ``real`` and ``imag`` (e.g. a Zarr store opened with ``xr.open_zarr``); the result has
    ``complex`` (complex64 when the parts are float32), ``amplitude`` and ``phase`` instead of
    them. Lazy parts stay lazy; ``ds`` itself is not changed.

    Raises
    ------
    ValueError
        A missing dimension or a missing ``real``/``imag`` variable.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"real": (("azimuth", "range", "time"), np.ones((2, 3, 1), "f4")),
    ...                  "imag": (("azimuth", "range", "time"), np.ones((2, 3, 1), "f4"))})
    >>> sorted(from_dataset(ds).data_vars), from_dataset(ds).complex.dtype.name
    (['amplitude', 'complex', 'phase'], 'complex64')
    """
    missing_dims = [d for d in ("azimuth", "range", "time") if d not in ds.sizes]
    if missing_dims:
        raise ValueError(f"dataset: expected dims (azimuth, range, time), found "
                         f"{tuple(ds.sizes)} (missing {missing_dims})")
    missing = [v for v in ("real", "imag") if v not in ds.variables]
    if missing:
        raise ValueError(f"dataset: expected variables ('real', 'imag'), found "
                         f"{sorted(map(str, ds.data_vars))} (missing {missing})")
    complex_ = ds["real"] + 1j * ds["imag"]
    if ds["real"].dtype == np.float32 and ds["imag"].dtype == np.float32:
        complex_ = complex_.astype(np.complex64)
    out = ds.drop_vars(["real", "imag"]).assign(complex=complex_)
    return out.assign(amplitude=np.abs(out["complex"]),
                      phase=xr.apply_ufunc(np.angle, out["complex"], dask="allowed"))


def _check_multi_look(data, window_size: Sequence[int], method: str, statistics: str) -> None:
    if not isinstance(data, (xr.Dataset, xr.DataArray)):
        raise TypeError(f"data: expected an xarray.Dataset or DataArray, found "
                        f"{type(data).__name__}")
    if not {"azimuth", "range"} <= set(data.dims):
        raise ValueError(f"data: expected dims azimuth and range, found {tuple(data.dims)}")
    if window_size[0] > data.sizes["azimuth"] or window_size[1] > data.sizes["range"]:
        raise ValueError(f"window_size: expected at most the data size "
                         f"({data.sizes['azimuth']}, {data.sizes['range']}), found "
                         f"{tuple(window_size)}")
    if method != "coarsen":
        raise ValueError(f"method: expected 'coarsen', found {method!r}")
    if statistics not in MULTI_LOOK_STATISTICS:
        raise ValueError(f"statistics: expected one of {MULTI_LOOK_STATISTICS}, found "
                         f"{statistics!r}")


def multi_look(data: xr.Dataset | xr.DataArray, window_size: Sequence[int],
               method: str = "coarsen", statistics: str = "mean", compute: bool = True):
    """Average (or take the median of) ``window_size = (azimuth, range)`` pixel windows.

    As sarxarray's ``multi_look``: incomplete windows at the far edges are dropped, the new
    ``azimuth``/``range`` coordinates count windows from 0, other coordinates are averaged,
    and ``attrs["multi-look"]`` records ``"coarsen-<statistics>"``. ``compute=False`` returns
    a ``dask.delayed`` object. The input keeps its attributes (sarxarray writes into them).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"amplitude": (("azimuth", "range"), np.arange(16.0).reshape(4, 4))},
    ...                 coords={"azimuth": np.arange(4), "range": np.arange(4)})
    >>> multi_look(ds, (2, 2)).amplitude.values.tolist()
    [[2.5, 4.5], [10.5, 12.5]]
    """
    _check_multi_look(data, window_size, method, statistics)
    data = data.copy()
    data.attrs["multi-look"] = f"{method}-{statistics}"

    def window_coordinate(reshaped, axis):
        # azimuth/range (1-D, reshaped to (n, window)) count windows from 0; others: the mean
        if reshaped.ndim == 2 and axis == (1,) and np.issubdtype(reshaped.dtype, np.integer):
            return np.arange(reshaped.shape[0], dtype=int)
        return reshaped.mean(axis=axis)

    coarse = data.coarsen({"azimuth": window_size[0], "range": window_size[1]},
                          boundary="trim", side="left",
                          coord_func={"azimuth": window_coordinate, "range": window_coordinate})
    reduce = getattr(coarse, statistics)
    if compute:
        return reduce(keep_attrs=True)
    from dask import delayed

    return delayed(reduce)(keep_attrs=True)


def _amplitude_dispersion(ds: xr.Dataset) -> xr.DataArray:
    amplitude = _amplitude(ds)
    return amplitude.std("time", skipna=False) / (
        amplitude.mean("time", skipna=False) + np.finfo(np.float32).eps)


@xr.register_dataset_accessor("slcstack")
class SLCStack:
    """sarxarray's ``.slcstack`` accessor on a raster stack ``(azimuth, range, time)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"amplitude": (("azimuth", "range", "time"), np.ones((2, 2, 3)))})
    >>> ds.slcstack.mrm().values.tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    """

    def __init__(self, xarray_obj: xr.Dataset) -> None:
        self._obj = xarray_obj

    def mrm(self) -> xr.DataArray:
        """Mean reflection map: the mean amplitude over time (``|complex|`` if no amplitude)."""
        return _amplitude(self._obj).mean("time")

    def multi_look(self, window_size: Sequence[int], method: str = "coarsen",
                   statistics: str = "mean", compute: bool = True):
        """:func:`multi_look` of the stack."""
        return multi_look(self._obj, window_size, method, statistics, compute)

    def point_selection(self, threshold: float, method: str = "amplitude_dispersion",
                        chunks: int = 1000) -> xr.Dataset:
        """Pixels whose amplitude dispersion (std/mean over time) is below ``threshold``.

        As sarxarray's ``point_selection``: a pixel with a NaN epoch is never selected, points
        come in row-major (azimuth, then range) order with ``azimuth``/``range`` coordinates,
        dims ``(space, time)``, ``chunks`` points per chunk. depsi's own
        :func:`~depsi.processing.ps_selection` stores points in Morton order and also offers
        NMAD; this keeps sarxarray's result for its users (without its DeprecationWarning).
        """
        if method != "amplitude_dispersion":
            raise UnknownMethodError(f"method: expected 'amplitude_dispersion', found {method!r}")
        ds = self._obj
        mask = (_amplitude_dispersion(ds) < threshold).transpose("azimuth", "range")
        azimuth, range_ = np.nonzero(np.asarray(mask.values))
        stm = ds.isel(azimuth=xr.DataArray(azimuth, dims="space"),
                      range=xr.DataArray(range_, dims="space"))
        stm = stm.assign_coords(azimuth=("space", ds["azimuth"].values[azimuth]),
                                range=("space", ds["range"].values[range_]))
        return stm.transpose("space", "time", ...).chunk({"space": chunks, "time": -1})
