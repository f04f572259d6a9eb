"""Pipeline registry: every module in this package that defines ``PIPELINE`` is a pipeline.

Adding a pipeline means adding one module here; nothing else is edited.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from tidewater.errors import ConfigError, PipelineError
from tidewater.pipelines.base import GoldTable, Pipeline

__all__ = ["GoldTable", "Pipeline", "all_pipelines", "get_pipeline", "pipeline_option"]


@cache
def all_pipelines() -> dict[str, Pipeline]:
    found: dict[str, Pipeline] = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        pipeline = getattr(module, "PIPELINE", None)
        if isinstance(pipeline, Pipeline):
            if pipeline.name in found:
                raise PipelineError(f"two modules declare pipeline {pipeline.name!r}")
            found[pipeline.name] = pipeline
    return found


def get_pipeline(name: str) -> Pipeline:
    pipelines = all_pipelines()
    if name not in pipelines:
        raise PipelineError(f"unknown pipeline {name!r}; known: {', '.join(sorted(pipelines)) or 'none'}")
    return pipelines[name]


def pipeline_option(name: str, option: str = "--pipeline") -> Pipeline:
    """The pipeline a command-line option names; an unknown name is a usage error (one line)."""
    try:
        return get_pipeline(name)
    except PipelineError as exc:
        raise ConfigError(f"{option}: {exc}") from None
