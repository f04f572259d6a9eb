"""Pipeline registry: every module in this package that defines ``PIPELINE`` is a pipeline, and so is
every module named by the ``TIDEWATER_PIPELINE_MODULES`` setting (a module name or a .py path).

Adding a pipeline means adding one module here (or naming one there); nothing else is edited.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from tidewater.config import Settings
from tidewater.errors import ConfigError, PipelineError
from tidewater.pipelines.base import (
    Delivery,
    GoldTable,
    KeyedStateMachine,
    Pipeline,
    Projection,
    Publish,
    SessionAggregate,
    Source,
    StreamJoin,
    WindowAggregate,
)

__all__ = [
    "Delivery",
    "GoldTable",
    "KeyedStateMachine",
    "Pipeline",
    "Projection",
    "Publish",
    "SessionAggregate",
    "Source",
    "StreamJoin",
    "WindowAggregate",
    "all_pipelines",
    "get_pipeline",
    "pipeline_option",
]

_NOT_PIPELINES = {"base", "cli", "contract", "graph", "layout", "samples"}


def all_pipelines(settings: Settings | None = None) -> dict[str, Pipeline]:
    """Every pipeline this deployment runs, by name: this package's modules, then the configured extra
    modules, kept to those ``TIDEWATER_PIPELINES`` names when it is set (``settings``: the environment's)."""
    settings = settings or Settings.from_env()
    return _enabled(_discover(settings.pipeline_modules), settings.pipelines)


def _enabled(found: dict[str, Pipeline], names: str) -> dict[str, Pipeline]:
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    if not wanted:
        return found
    unknown = [name for name in wanted if name not in found]
    if unknown:
        raise ConfigError(
            f"TIDEWATER_PIPELINES={names}: {', '.join(unknown)} not declared; declared: {', '.join(sorted(found))}"
        )
    return {name: found[name] for name in wanted}


@cache
def _discover(extra_modules: str) -> dict[str, Pipeline]:
    modules = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if info.name not in _NOT_PIPELINES
    ]
    modules += [_load(spec.strip()) for spec in extra_modules.split(",") if spec.strip()]
    found: dict[str, Pipeline] = {}
    for module in modules:
        pipeline = getattr(module, "PIPELINE", None)
        if isinstance(pipeline, Pipeline):
            if pipeline.name in found:
                raise PipelineError(f"two modules declare pipeline {pipeline.name!r}")
            found[pipeline.name] = pipeline
        elif module.__name__.split(".")[0] != __name__.split(".")[0]:
            raise ConfigError(f"TIDEWATER_PIPELINE_MODULES: {module.__name__} defines no PIPELINE = Pipeline(...)")
    return found


def _load(spec: str) -> ModuleType:
    """A module by name, or a .py file by path (loaded under its file name, once per process)."""
    try:
        if not spec.endswith(".py"):
            return importlib.import_module(spec)
        path = Path(spec).resolve()
        name = f"tidewater_pipeline_{path.stem}"
        if name in sys.modules:
            return sys.modules[name]
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None or not path.is_file():
            raise FileNotFoundError(spec)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
        return module
    except (ImportError, FileNotFoundError) as exc:
        raise ConfigError(f"TIDEWATER_PIPELINE_MODULES: cannot load {spec!r} ({exc})") from None


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
