"""The export step: the files of ``output.exports`` (CSV, GeoPackage, GeoTIFF grids, plots, the
EGMS and QGIS tables) from the result STM, into one folder moved into place whole."""

from __future__ import annotations

import shutil
from pathlib import Path

from depsi.io.lock import write_lock
from depsi.io.paths import temporary_sibling
from depsi.io.store import move_into_place, recover_interrupted
from depsi.pipeline.steps import ConfigView, Inputs, StepContext


def run(inputs: Inputs, config: ConfigView, context: StepContext) -> Path:
    """The files of ``output.exports`` from the result STM, into the folder ``context.target``
    (written beside it and moved into place whole); the files written go to
    ``context.counts``."""
    from depsi.io.export import EXPORTERS

    product = context.written_product()
    result = inputs["model"].compute()
    files = []
    with write_lock(product):
        recover_interrupted(product)
        tmp = temporary_sibling(product)
        tmp.mkdir(parents=True)
        try:
            for name in config.output.exports:
                for file_name, writer in EXPORTERS[name]:
                    writer(result, tmp / file_name)
                    files.append(file_name)
            move_into_place(tmp, product)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    context.counts["files"] = len(files)
    return product
