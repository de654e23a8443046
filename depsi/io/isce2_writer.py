"""Writing a depsi raster stack and its :class:`~depsi.geometry.StackGeometry` as a
topsStack-shaped ISCE2 folder (merged SLCs with ISCE headers, ``geom_reference`` rasters, TOPS
swath products, baselines), read back by :func:`depsi.io.isce2.from_isce2`; the layout is the one
:mod:`depsi.io.isce2` describes."""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from depsi.geometry import (
    Orbit,
    StackGeometry,
    baselines,
    geodetic_to_ecef,
    look_geometry,
    radar_to_geo,
    zero_doppler_time,
)
from depsi.io.isce2 import ISCE_DTYPES, VRT_DTYPES
from depsi.io.raster import RASTER_DIMS

logger = logging.getLogger(__name__)

#: Seconds between the orbit state vectors :func:`write_isce2` writes (Sentinel-1's own rate).
ORBIT_SAMPLE_INTERVAL = 10.0
#: Lines geocoded at once by :func:`write_isce2` (bounds its memory on large rasters).
WRITE_BLOCK_LINES = 512


def _isce_time(moment: np.datetime64) -> str:
    """A UTC time as ISCE writes one, ``str(datetime)`` (microseconds)."""
    # numpy's stubs lack datetime64(datetime64, unit)
    micro = np.datetime64(moment, "us").astype(np.int64)  # type: ignore[call-overload]
    return str(datetime(1970, 1, 1) + timedelta(microseconds=int(micro)))


def _element(parent: ET.Element, tag: str, name: str) -> ET.Element:
    return ET.SubElement(parent, tag, name=name)


def _render(parent: ET.Element, content: dict[str, Any]) -> None:
    """Properties and components of ``content`` under ``parent``, keys sorted as ISCE's
    ``XmlDumper.addComponent`` sorts them; a component is ``(factorymodule, factoryname,
    dict)``."""
    for key in sorted(content):
        value = content[key]
        if isinstance(value, tuple):
            module, factory, children = value
            child = _element(parent, "component", key)
            ET.SubElement(child, "factorymodule").text = module
            ET.SubElement(child, "factoryname").text = factory
            _render(child, children)
        else:
            ET.SubElement(_element(parent, "property", key), "value").text = str(value)


def _xml_bytes(root: ET.Element) -> bytes:
    ET.indent(root, space="    ")
    return ET.tostring(root, encoding="utf-8", xml_declaration=False) + b"\n"


def _atomic_write(path: Path, content: bytes | None = None, *, array_blocks: Any = None
                  ) -> Path:
    """Write ``content`` (or the arrays ``array_blocks`` yields) to ``path.part``, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    try:
        with open(part, "wb") as out:
            if content is not None:
                out.write(content)
            else:
                for block in array_blocks:
                    np.ascontiguousarray(block).tofile(out)
        os.replace(part, path)
    finally:
        if part.exists():
            part.unlink()
    return path


def write_image_header(file: str | os.PathLike, *, width: int, length: int, data_type: str,
                       bands: int = 1, scheme: str = "BIP", image_type: str | None = None
                       ) -> None:
    """Write ``file.xml`` and ``file.vrt`` as ISCE's ``Image.renderHdr``/``renderVRT`` do."""
    file = Path(file)
    data_type = data_type.upper()
    itemsize = np.dtype(ISCE_DTYPES[data_type]).itemsize
    coordinate = {"delta": 1.0, "family": "imagecoordinate", "name": "imagecoordinate_name",
                  "startingvalue": 0.0}
    content = {
        "access_mode": "read", "byte_order": "l", "data_type": data_type,
        "extra_file_name": file.name + ".vrt", "family": "image", "file_name": file.name,
        "image_type": image_type or ("slc" if data_type.startswith("C") else scheme.lower()),
        "length": length, "name": "image_name", "number_bands": bands, "scheme": scheme,
        "width": width, "xmax": float(width), "xmin": 0.0,
        "coordinate1": ("isceobj.Image", "createCoordinate",
                        {**coordinate, "endingvalue": float(width), "size": width}),
        "coordinate2": ("isceobj.Image", "createCoordinate",
                        {**coordinate, "endingvalue": float(length), "size": length}),
    }
    root = ET.Element("imageFile")
    _render(root, content)
    ET.SubElement(_element(root, "property", "ISCE_VERSION"), "value").text = \
        "written by depsi.io.isce2 in ISCE's layout"
    _atomic_write(Path(f"{file}.xml"), _xml_bytes(root))

    vrt = ET.Element("VRTDataset", rasterXSize=str(width), rasterYSize=str(length))
    for band in range(bands):
        node = ET.SubElement(vrt, "VRTRasterBand", dataType=VRT_DTYPES[data_type],
                             band=str(band + 1), subClass="VRTRawRasterBand")
        ET.SubElement(node, "SourceFilename", relativeToVRT="1").text = file.name
        ET.SubElement(node, "ByteOrder").text = "LSB"
        offsets = {"BIL": (band * width * itemsize, itemsize, bands * width * itemsize),
                   "BIP": (band * itemsize, bands * itemsize, bands * width * itemsize),
                   "BSQ": (band * width * length * itemsize, itemsize, width * itemsize)}
        for tag, value in zip(("ImageOffset", "PixelOffset", "LineOffset"), offsets[scheme]):
            ET.SubElement(node, tag).text = str(value)
    _atomic_write(Path(f"{file}.vrt"), _xml_bytes(vrt))


def _orbit_samples(orbit: Orbit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The orbit every ORBIT_SAMPLE_INTERVAL s across its span (and at its end)."""
    t = np.arange(orbit.time[0], orbit.time[-1], ORBIT_SAMPLE_INTERVAL)
    t = np.append(t, orbit.time[-1])
    if t.size < 4:
        t = np.linspace(orbit.time[0], orbit.time[-1], 4)
    micro = np.round(t * 1e6)  # ISCE times hold microseconds
    position, velocity, _ = orbit.state(micro * 1e-6)
    return orbit.reference + micro.astype(np.int64).astype("timedelta64[us]"), position, velocity


def _swath_product_xml(geometry: StackGeometry, epoch: int, shape: tuple[int, int],
                       wavelength: float) -> bytes:
    """An ISCE TOPS swath product with one burst spanning the raster, in ProductManager's
    layout. The mother's timing is the stack's grid; a secondary's is that grid moved to where
    the secondary's own orbit sees pixel (0, 0) at zero Doppler (line 0 time, near range), with
    the mother's spacings: depsi holds no secondary grid of its own."""
    grid, orbit = geometry.grid, geometry.orbits[epoch]
    length, width = shape
    start, near = grid.first_line_time, grid.near_range
    if epoch != geometry.mother:
        lat, lon = radar_to_geo(geometry, 0.0, 0.0)
        target = geodetic_to_ecef(lat, lon, geometry.height)
        t = zero_doppler_time(orbit, target)
        start = orbit.reference + np.timedelta64(int(round(float(t) * 1e9)), "ns")
        near = float(np.linalg.norm(target - orbit.state(t)[0]))
    stop = start + np.timedelta64(int(round((length - 1) * grid.line_interval * 1e9)), "ns")
    times, positions, velocities = _orbit_samples(orbit)
    mother = geometry.mother_orbit
    velocity_z = mother.state(np.array([mother.seconds(grid.first_line_time)]))[1][0, 2]
    vectors = {f"statevector{k + 1}": ("isceobj.Orbit.Orbit", "StateVector", {
        "time": _isce_time(time), "position": [float(v) for v in position],
        "velocity": [float(v) for v in velocity]})
        for k, (time, position, velocity) in enumerate(zip(times, positions, velocities))}
    burst = {
        "azimuthtimeinterval": grid.line_interval, "burstnumber": 1,
        "burststartutc": _isce_time(start), "burststoputc": _isce_time(stop),
        "firstvalidline": 0, "firstvalidsample": 0, "numberofvalidlines": length,
        "numberofvalidsamples": width, "numberoflines": length, "numberofsamples": width,
        "passdirection": "ASCENDING" if velocity_z > 0 else "DESCENDING",
        "pulserepetitionfrequency": 1.0 / grid.line_interval,
        "radarwavelength": wavelength, "rangepixelsize": grid.range_spacing,
        "sensingstart": _isce_time(start), "sensingstop": _isce_time(stop),
        "startingrange": near, "swathnumber": 1,
        "terrainheight": geometry.height,
        "orbit": ("isceobj.Orbit.Orbit", "createOrbit", {
            "max_time": _isce_time(times[-1]), "min_time": _isce_time(times[0]),
            "orbit_quality": "", "orbit_reference_frame": "ECR",
            "orbit_source": orbit.source,
            "state_vectors": ("iscesys.Component", "createTraitSeq", vectors)}),
    }
    instance = {"family": "topsswathslc", "imagingmode": "TOPS", "numberofbursts": 1,
                "spacecraftname": "", "mission": "",
                "bursts": ("iscesys.Component", "createTraitSeq", {
                    "burst1": ("isceobj.Sensor.TOPS.BurstSLC", "BurstSLC", burst)})}
    root = ET.Element("productmanager_name")
    _render(root, {"instance": ("isceobj.Sensor.TOPS.TOPSSwathSLCProduct",
                                "TOPSSwathSLCProduct", instance)})
    return _xml_bytes(root)


def _geometry_blocks(geometry: StackGeometry, shape: tuple[int, int], height: Any):
    """``look_geometry`` of every pixel, WRITE_BLOCK_LINES lines at a time."""
    n_az, n_rg = shape
    rg = np.arange(n_rg, dtype=np.float64)[None, :]
    for a0 in range(0, n_az, WRITE_BLOCK_LINES):
        a1 = min(n_az, a0 + WRITE_BLOCK_LINES)
        az = np.arange(a0, a1, dtype=np.float64)[:, None] + 0 * rg
        h = (np.full(az.shape, geometry.height) if height is None
             else np.asarray(height[a0:a1], dtype=np.float64))
        look = look_geometry(geometry, az, rg + 0 * az, h)
        look["hgt"] = h
        # ISCE's azimuth of the target-to-satellite vector, from north anticlockwise
        look["los_azimuth"] = np.rad2deg(np.arctan2(-look["los_east"], look["los_north"]))
        yield look


def _ymd(moment: Any) -> str:
    return str(np.datetime64(moment, "D")).replace("-", "")


def write_isce2(folder: str | os.PathLike, stack: xr.Dataset, geometry: StackGeometry
                ) -> dict[str, Any]:
    """Write a raster stack and its geometry as a topsStack-shaped ISCE2 folder.

    Writes ``merged/SLC/DATE/DATE.slc.full`` (little-endian CFLOAT) with ``.xml``/``.vrt``
    headers per epoch; ``merged/geom_reference/{lat,lon,hgt}.rdr.full`` (DOUBLE) and
    ``los.rdr.full`` (FLOAT, 2 bands BIL: incidence, azimuth of the LOS from north
    anticlockwise) geocoded on the mother's orbit at the stack's ``height`` coordinate (else
    ``geometry.height``); ``reference/IW1.xml`` and ``secondarys/DATE/IW1.xml``: one-burst TOPS
    products with each epoch's orbit sampled every ORBIT_SAMPLE_INTERVAL s and the stack's grid
    as timing; ``baselines/REF_SEC/REF_SEC.txt`` (ISCE's Bperp sign, at the scene centre) and
    ``merged/baselines/DATE/DATE`` (a float32 Bperp grid as ``baselineGrid.py`` writes,
    2 x 2 nodes at least). Every file is written to ``*.part`` and renamed.

    Parameters
    ----------
    folder
        The stack root to write (created if needed; files already there are replaced).
    stack
        A raster ``(azimuth, range, time)`` with ``complex``, ``time`` as dates and attrs
        ``wavelength``.
    geometry
        Its geometry, one orbit per epoch in the stack's time order.

    Returns
    -------
    dict
        ``folder``, ``slc`` (one path per epoch), ``geometry`` (name -> path), ``reference``,
        ``secondarys`` (date -> path), ``baselines`` (paths).

    Raises
    ------
    ValueError
        No ``complex`` variable, a number of orbits different from the epochs, a wavelength
        differing from the geometry's.

    Examples
    --------
    See :func:`~depsi.io.isce2.from_isce2`.
    """
    folder = Path(folder)
    if "complex" not in stack.data_vars:
        raise ValueError(f"stack: expected a 'complex' variable, found "
                         f"{sorted(stack.data_vars, key=str)}")
    data = stack["complex"].transpose(*RASTER_DIMS)
    n_az, n_rg, n_time = data.shape
    if len(geometry.orbits) != n_time:
        raise ValueError(f"geometry: expected one orbit per epoch ({n_time}), found "
                         f"{len(geometry.orbits)}")
    wavelength = float(stack.attrs.get("wavelength", geometry.wavelength))
    if abs(wavelength - geometry.wavelength) > 1e-6 * wavelength:
        raise ValueError(f"stack: attribute 'wavelength': expected the geometry's "
                         f"{geometry.wavelength!r} m, found {wavelength!r} m")
    days = [_ymd(t) for t in stack["time"].values]
    mother = days[geometry.mother]
    written: dict[str, Any] = {"folder": folder, "slc": [], "geometry": {}, "secondarys": {},
                               "baselines": []}

    for k, day in enumerate(days):
        path = folder / "merged" / "SLC" / day / f"{day}.slc.full"
        plane = data.isel(time=k)
        blocks = (np.asarray(plane[a0:a0 + WRITE_BLOCK_LINES].values, dtype="<c8")
                  for a0 in range(0, n_az, WRITE_BLOCK_LINES))
        _atomic_write(path, array_blocks=blocks)
        write_image_header(path, width=n_rg, length=n_az, data_type="CFLOAT")
        written["slc"].append(path)

    height = stack["height"].values if "height" in stack.coords else None
    looks = list(_geometry_blocks(geometry, (n_az, n_rg), height))
    geom = folder / "merged" / "geom_reference"
    for name in ("lat", "lon", "hgt"):
        path = geom / f"{name}.rdr.full"
        _atomic_write(path, array_blocks=(np.asarray(b[name], "<f8") for b in looks))
        write_image_header(path, width=n_rg, length=n_az, data_type="DOUBLE")
        written["geometry"][name] = path
    path = geom / "los.rdr.full"
    _atomic_write(path, array_blocks=(np.stack([b["incidence"], b["los_azimuth"]], axis=1)
                                      .astype("<f4") for b in looks))
    write_image_header(path, width=n_rg, length=n_az, data_type="FLOAT", bands=2,
                       scheme="BIL")
    written["geometry"]["los"] = path

    for k, day in enumerate(days):
        xml = _swath_product_xml(geometry, k, (n_az, n_rg), wavelength)
        if k == geometry.mother:
            written["reference"] = _atomic_write(folder / "reference" / "IW1.xml", xml)
        else:
            written["secondarys"][day] = _atomic_write(
                folder / "secondarys" / day / "IW1.xml", xml)

    written["baselines"] = _write_baselines(folder, geometry, (n_az, n_rg), days, mother)
    logger.info("wrote ISCE2 stack %s: %d epochs of %d x %d", folder, n_time, n_az, n_rg)
    return written


def _write_baselines(folder: Path, geometry: StackGeometry, shape: tuple[int, int],
                     days: Sequence[str], mother: str) -> list[Path]:
    n_az, n_rg = shape
    sign = -1.0 if geometry.grid.look_side == "right" else 1.0  # ISCE's Bperp orientation
    centre = baselines(geometry, (n_az - 1) / 2.0, (n_rg - 1) / 2.0)
    # baselineGrid.py: about one node per second of azimuth and per 7 km of range
    n_nodes_az = max(2, int(np.ceil((n_az - 1) * geometry.grid.line_interval)))
    n_nodes_rg = max(2, int(np.ceil((n_rg - 1) * geometry.grid.range_spacing / 7000.0)))
    az = np.linspace(0.0, n_az - 1, n_nodes_az)[:, None]
    rg = np.linspace(0.0, n_rg - 1, n_nodes_rg)[None, :]
    nodes = baselines(geometry, az + 0 * rg, rg + 0 * az)
    paths = []
    for k, day in enumerate(days):
        grid_path = folder / "merged" / "baselines" / day / day
        _atomic_write(grid_path, (sign * nodes["bperp"][..., k]).astype("<f4").tobytes())
        write_image_header(grid_path, width=n_nodes_rg, length=n_nodes_az, data_type="FLOAT")
        paths.append(grid_path)
        if day == mother:
            continue
        pair = f"{mother}_{day}"
        text = (f"swath: IW1\nBperp (average): {sign * float(centre['bperp'][k])!r}\n"
                f"Bpar (average): {float(centre['bpar'][k])!r}\n")
        paths.append(_atomic_write(folder / "baselines" / pair / f"{pair}.txt",
                                   text.encode()))
    return paths


__all__ = ["ORBIT_SAMPLE_INTERVAL", "WRITE_BLOCK_LINES", "write_image_header", "write_isce2"]
