"""What the chain's steps share: the record a product carries for the steps after it, the
network's points without their arcs, and the model's terms at a product's epochs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr

from depsi.kernels.backend import Device
from depsi.pipeline.steps import EDGE, ConfigView
from depsi.processing.motion_models import TemporalModel, temporal_model

#: The devices a step spreads its chunks over (None: those configured).
Devices = Sequence[Device | str | int] | None

#: The attribute of a chain step's product that holds its :class:`ChainRecord`.
RECORD_ATTR = "depsi_chain"


@dataclass(frozen=True)
class ChainRecord:
    """What a chain step's product tells the steps after it besides its variables: the size
    and kind of the first-order network and, once integrated, its datum. The one channel
    between steps outside the variables, stored as one attribute so that a product on disk
    carries it too.

    Attributes
    ----------
    n_first_order
        First-order points chosen by the network step.
    network_method
        How their arcs were formed (``network.method``).
    reference
        The reference point, an index into the product's own space (after integration).
    reference_radius, n_reference_area
        The reference area: its radius in metres and its number of points (after the
        atmosphere step, which fixes the datum).
    """

    n_first_order: int
    network_method: str
    reference: int | None = None
    reference_radius: float | None = None
    n_reference_area: int | None = None

    @classmethod
    def of(cls, product: xr.Dataset, step: str) -> ChainRecord:
        """The record of a chain product, read by ``step``."""
        data = product.attrs.get(RECORD_ATTR)
        if not isinstance(data, dict) or set(data) != {f for f in cls.__dataclass_fields__}:
            raise ValueError(f"{step}: expected the product of the step before it, with its "
                             f"record attrs[{RECORD_ATTR!r}], found {data!r}")
        return cls(**data)

    def on(self, product: xr.Dataset) -> xr.Dataset:
        """``product`` carrying this record (its attributes are a new dict)."""
        product.attrs = {**product.attrs, RECORD_ATTR: asdict(self)}
        return product


#: Fancy indexing of points read from a store keeps each variable's chunks (split by itemsize,
#: the variables of one block would disagree, and the steps' map_blocks need them equal).
UNSPLIT_CHUNKS = {"array.slicing.split_large_chunks": False}


def network_points(network: xr.Dataset) -> xr.Dataset:
    """The network product's points, without its arcs."""
    return network.drop_dims(EDGE) if EDGE in network.dims else network


def model_terms(config: ConfigView, product: xr.Dataset) -> TemporalModel:
    """The regressors of ``model.terms`` at the epochs of ``product``."""
    return temporal_model(config.model, product["time"].values)


def searched_terms(config: ConfigView, product: xr.Dataset, step: str) -> dict[str, tuple]:
    """The terms ``step``'s periodogram searches (``model.arcs`` or ``model.densification``;
    null: every term), as the kernel's ``extra_regressors``."""
    return model_terms(config, product).search(getattr(config.model, step),
                                         float(product.attrs["wavelength"]))


def kept_points(first: xr.Dataset, names: tuple[str, ...]) -> xr.Dataset:
    """The points kept by the network, with only the variables ``names`` (those present):
    a step copies what it reads, not the whole first pass; nothing where every point is kept
    (after the atmosphere's second pass, as a rule: 1.3 GB of series at 10^7 points)."""
    kept = first[[name for name in names if name in first.data_vars]]
    in_network = first["in_network"].values
    return kept if in_network.all() else kept.isel(space=np.flatnonzero(in_network))
