"""The pipeline layer: the configuration model, and (with the runner) the chain of steps,
checkpoints and resume. Algorithms never read configuration; this layer wires them."""

from depsi.pipeline.config import (
    ComputeConfig,
    ConfigError,
    PipelineConfig,
    SlurmConfig,
    dump_config,
    example_config_yaml,
    load_config,
    parse_config,
)
from depsi.pipeline.runner import (
    STEPS,
    PipelineError,
    RunSummary,
    StepRecord,
    open_stack,
    run_pipeline,
)

__all__ = [
    "STEPS",
    "ComputeConfig",
    "ConfigError",
    "PipelineConfig",
    "SlurmConfig",
    "dump_config",
    "example_config_yaml",
    "load_config",
    "PipelineError",
    "RunSummary",
    "StepRecord",
    "open_stack",
    "parse_config",
    "run_pipeline",
]
