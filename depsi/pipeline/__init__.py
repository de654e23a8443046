"""The pipeline layer: the configuration model, the one table of steps
(:data:`~depsi.pipeline.steps.STEPS`) and its two executors: :func:`run_ps_chain` in memory and
:func:`run_pipeline` with checkpoints and resume. Algorithms never read configuration; this
layer wires them.

Names are imported when first used, so ``depsi --help`` (which reads the step table) stays
quick.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module of this package it lives in.
_HOMES = {
    "ComputeConfig": "config", "ConfigError": "config", "PipelineConfig": "config",
    "SlurmConfig": "config", "dump_config": "config", "example_config_yaml": "config",
    "load_config": "config", "parse_config": "config",
    "ChainConfig": "chain_config", "chain_config": "chain_config",
    "run_ps_chain": "chain",
    "STEPS": "steps", "STEP_NAMES": "steps", "Step": "steps",
    "PipelineError": "workspace", "WorkspaceBusyError": "workspace",
    "RunSummary": "runner", "StepRecord": "runner", "run_pipeline": "runner",
    "open_stack": "input_stack",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'depsi.pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"depsi.pipeline.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
