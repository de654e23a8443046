"""The PS chain's configuration: one section per step (the YAML file's sections), and the
deprecated flat keywords of :func:`~depsi.pipeline.chain.run_ps_chain`."""

from __future__ import annotations

import warnings
from types import FrameType
from typing import Any

from pydantic import Field, ValidationError

from depsi.processing.arcs import ArcsConfig
from depsi.processing.atmosphere import AtmosphereConfig
from depsi.processing.densification import DensificationConfig
from depsi.processing.integration import IntegrationConfig
from depsi.processing.motion_models import ModelConfig
from depsi.processing.network import NetworkConfig
from depsi.sections import Section, describe_errors


class ChainConfig(Section):
    """Every parameter of the PS chain, one section per step (the YAML file's sections)."""

    network: NetworkConfig = Field(
        default_factory=NetworkConfig, description="First-order network of arcs.")
    arcs: ArcsConfig = Field(default_factory=ArcsConfig, description="Per-arc estimation.")
    integration: IntegrationConfig = Field(
        default_factory=IntegrationConfig, description="Spatial integration over the network.")
    atmosphere: AtmosphereConfig = Field(
        default_factory=AtmosphereConfig, description="Atmospheric phase screen.")
    densification: DensificationConfig = Field(
        default_factory=DensificationConfig, description="Densification of the PS set.")
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="Temporal model terms beyond velocity and "
                                                 "height error, per step, and their choice.")


#: Deprecated flat keywords of :func:`~depsi.pipeline.chain.run_ps_chain` and the
#: (section, field) each sets; a section by name (``network={"k": 3}``) replaces them.
KEYWORDS = {
    "first_order": ("network", "first_order"),
    "max_dispersion": ("network", "max_dispersion"),
    "network_method": ("network", "method"),
    "max_arc_length": ("network", "max_length"),
    "height_range": ("arcs", "height_range"),
    "velocity_range": ("arcs", "velocity_range"),
    "min_arc_coherence": ("integration", "min_coherence"),
    "alpha": ("integration", "alpha"),
    "max_iterations": ("integration", "max_iterations"),
    "reference": ("integration", "reference"),
    "reference_radius": ("integration", "reference_radius"),
    "reference_noise": ("integration", "reference_noise"),
    "atmosphere": ("atmosphere", "method"),
    "temporal_window": ("atmosphere", "temporal_window"),
    "correlated_height": ("atmosphere", "correlated_height"),
    "densification_k": ("densification", "k"),
    "densification_max_distance": ("densification", "max_distance"),
    "densification_min_coherence": ("densification", "min_coherence"),
}

#: Earlier flat keywords whose names did not say their section (``k`` is also a network field).
RENAMED_KEYWORDS = {"k": "densification_k", "max_distance": "densification_max_distance",
                    "min_coherence": "densification_min_coherence"}


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside depsi and contextlib (the user's call,
    through run_ps_chain's decorator)."""
    import sys
    from pathlib import Path

    package = str(Path(__file__).resolve().parents[1])
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and (frame.f_code.co_filename.startswith(package)
                                 or frame.f_code.co_filename.endswith("contextlib.py")):
        frame, level = frame.f_back, level + 1
    return level


def _section_form(name: str, value: Any) -> str:
    section, field = KEYWORDS[name]
    return f"{section}={{{field!r}: {value!r}}}"


def chain_config(config: ChainConfig | dict | None = None, **overrides: Any) -> ChainConfig:
    """A validated :class:`ChainConfig`: ``config`` (default: every default) with overrides.

    Overrides are a section name with a mapping of its fields (``network={"k": 3}``). The flat
    keywords of :data:`KEYWORDS` (``first_order=500``) still work but are deprecated: each
    warns with its section form.

    Examples
    --------
    >>> chain_config(network={"first_order": 500, "k": 3}).network.model_dump(
    ...     include={"first_order", "k"})
    {'first_order': 500, 'k': 3}
    >>> chain_config(atmosphere={"method": "none"}).atmosphere.method
    'none'
    """
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, ChainConfig):
        data = config.model_dump()
    elif isinstance(config, dict):
        data = {name: dict(value) for name, value in config.items()}
    else:
        raise TypeError(f"config: expected a ChainConfig or a mapping, found "
                        f"{type(config).__name__}")
    for name, value in overrides.items():
        if name in ChainConfig.model_fields and (name not in KEYWORDS
                                                 or isinstance(value, (dict, Section))):
            if isinstance(value, Section):
                value = value.model_dump()
            if not isinstance(value, dict):
                raise TypeError(f"{name}: expected a mapping of that section's fields, found "
                                f"{type(value).__name__}")
            data.setdefault(name, {}).update(value)
            continue
        if name in RENAMED_KEYWORDS:
            name = RENAMED_KEYWORDS[name]
        if name not in KEYWORDS:
            known = sorted(set(KEYWORDS) | set(ChainConfig.model_fields))
            raise TypeError(f"run_ps_chain: unknown option {name!r}; expected one of "
                            f"{', '.join(known)}")
        if name == "atmosphere" and value is None:
            value = "none"
        warnings.warn(f"run_ps_chain: the flat keyword {name}= is deprecated; use "
                      f"{_section_form(name, value)}", DeprecationWarning,
                      stacklevel=_callers_level())
        section, field = KEYWORDS[name]
        data.setdefault(section, {})[field] = value
    try:
        return ChainConfig.model_validate(data)
    except ValidationError as err:
        raise ValueError("chain configuration: " + "; ".join(describe_errors(err))) from None
