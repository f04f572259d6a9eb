"""Run expectation suites with Great Expectations on Spark DataFrames and keep what a reader needs.

One ephemeral GX context per audit run: the suites come from the repository (see
:mod:`tidewater.quality.suites`), the data are the run's cached DataFrames, and every validation
goes through a checkpoint whose action renders Data Docs into a local folder that
:mod:`tidewater.quality.reports` then publishes to the lake.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

# GX would otherwise try to send usage analytics (a closed network makes that a slow timeout).
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

DOCS_SITE = "tidewater"
_SAMPLE = 3  # unexpected values quoted in a failure line


def preload_great_expectations() -> threading.Thread:
    """Import GX in a background thread while the caller starts its JVM: GX's import takes ~7 s of
    Python work, the Spark session ~9 s mostly spent waiting on the JVM, so the two overlap. A failed
    background import changes nothing: :class:`SuiteRunner` imports GX again and reports the error."""

    def load() -> None:
        with contextlib.suppress(Exception):  # the synchronous import in SuiteRunner raises it properly
            importlib.import_module("great_expectations")

    thread = threading.Thread(target=load, name="preload-great-expectations", daemon=True)
    thread.start()
    return thread


def share_compiled_templates() -> None:
    """Every GX view of the process keeps its compiled Jinja templates in one in-memory cache.

    GX renders each Data Docs page through a view with a Jinja environment of its own, so each page
    compiled the same templates again: an audit of three suites compiled 153 templates, 1.4-1.9 s of its
    ~26 s. Jinja checks each template's source checksum before it uses the kept code. Installed once
    per process, on GX's view class (GX has no setting for an environment's bytecode cache)."""
    import jinja2
    from great_expectations.render.view.view import DefaultJinjaView

    made = DefaultJinjaView.__init__
    if getattr(made, "compiled_templates", None) is not None:
        return

    class CompiledTemplates(jinja2.BytecodeCache):
        def __init__(self) -> None:
            self.code: dict[str, bytes] = {}

        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            if (code := self.code.get(bucket.key)) is not None:
                bucket.bytecode_from_string(code)

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            self.code[bucket.key] = bucket.bytecode_to_string()

    cache = CompiledTemplates()

    def init(view: Any, *args: Any, **kwargs: Any) -> None:
        made(view, *args, **kwargs)
        view.env.bytecode_cache = cache

    init.compiled_templates = cache  # type: ignore[attr-defined]
    DefaultJinjaView.__init__ = init  # type: ignore[method-assign]


@dataclass(frozen=True)
class SuiteOutcome:
    layer: str
    suite: str
    success: bool
    rows: int
    expectations: int
    failures: list[str] = field(default_factory=list)  # "expectation(column): what was seen"
    unexpected: dict[str, int] = field(default_factory=dict)  # expectation(column) -> unexpected count


class SuiteRunner:
    """Validates frames against suites and renders Data Docs for each into ``docs_dir``.

    A suite is validated first without samples of unexpected values, and again with them only if some
    expectation saw one. GX fetches each expectation's sample with a Spark job of its own, which scans
    the whole frame even when nothing is unexpected (the filter finds no row for the limit to stop at):
    rsvps' arriving records of a 1M-event hour, 13 expectations, took 30 Spark jobs and 9.5-11.9 s with
    samples, 4 jobs and 3.5 s without. A suite that does see one pays those 4 on top (33 jobs where one
    run took 29). Both runs share one run identifier, so the second replaces the first in the results
    and in the Data Docs.
    """

    def __init__(self, docs_dir: Path, *, run_name: str) -> None:
        import great_expectations as gx
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._gx = gx
        self.run_id = RunIdentifier(run_name=run_name)  # its run time fixed: a re-run replaces a result
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.context.add_data_docs_site(
            site_name=DOCS_SITE,
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
        self.source = self.context.data_sources.add_spark("tidewater")
        share_compiled_templates()

    def validate(
        self, suite_json: dict[str, Any], frame: DataFrame, *, layer: str, parameters: dict[str, Any] | None = None
    ) -> SuiteOutcome:
        from great_expectations.checkpoint import UpdateDataDocsAction
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        gx = self._gx
        name = suite_json["name"]
        suite = gx.ExpectationSuite(
            name=name,
            expectations=[ExpectationConfiguration(**e).to_domain_obj() for e in suite_json["expectations"]],
            meta=suite_json.get("meta", {}),
        )
        suite = self.context.suites.add(suite)
        asset = self.source.add_dataframe_asset(layer.replace("/", "."))
        batch = asset.add_batch_definition_whole_dataframe("interval")
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(name=name, data=batch, suite=suite)
        )
        for sample in (0, _SAMPLE):
            checkpoint = self.context.checkpoints.add(
                gx.Checkpoint(
                    name=f"audit {name}" + (" with samples" if sample else ""),
                    validation_definitions=[definition],
                    actions=[UpdateDataDocsAction(name="data_docs", site_names=[DOCS_SITE])],
                    result_format={"result_format": "SUMMARY", "partial_unexpected_count": sample},
                )
            )
            result = checkpoint.run(
                batch_parameters={"dataframe": frame}, expectation_parameters=parameters or {}, run_id=self.run_id
            )
            (validation,) = result.run_results.values()
            if not saw_unexpected(validation):
                break
        return outcome(layer, name, validation)


def saw_unexpected(validation: Any) -> bool:
    """Whether some expectation of a validation result counted unexpected values (whose samples are
    worth a second run)."""
    return any(int((r.result or {}).get("unexpected_count") or 0) > 0 for r in validation.results)


def outcome(layer: str, suite: str, validation: Any) -> SuiteOutcome:
    """Summarise a GX validation result: which expectations failed and what they saw."""
    failures: list[str] = []
    unexpected: dict[str, int] = {}
    rows = 0
    for r in validation.results:
        config = r.expectation_config
        label = describe(config.type, config.kwargs)
        result = r.result or {}
        rows = max(rows, int(result.get("element_count") or 0))
        if result.get("unexpected_count") is not None:
            unexpected[label] = int(result["unexpected_count"])
        if r.success:
            continue
        if r.exception_info and r.exception_info.get("raised_exception"):
            failures.append(f"{label}: could not be evaluated: {r.exception_info.get('exception_message')}")
        elif result.get("unexpected_count") is not None:
            sample = ", ".join(repr(v) for v in (result.get("partial_unexpected_list") or [])[:_SAMPLE])
            failures.append(
                f"{label}: {result['unexpected_count']} of {result.get('element_count')} rows unexpected "
                f"({result.get('unexpected_percent', 0):.2f}%)" + (f", e.g. {sample}" if sample else "")
            )
        else:
            failures.append(f"{label}: observed {result.get('observed_value')!r}")
    return SuiteOutcome(
        layer=layer,
        suite=suite,
        success=bool(validation.success),
        rows=rows,
        expectations=len(validation.results),
        failures=failures,
        unexpected=unexpected,
    )


def describe(kind: str, kwargs: dict[str, Any]) -> str:
    """``expect_column_values_to_be_in_set(response)``: the name a failure is reported under."""
    target = kwargs.get("column") or ",".join(kwargs.get("column_list") or ())
    if not target and kwargs.get("column_A"):
        target = f"{kwargs['column_A']},{kwargs['column_B']}"
    return f"{kind}({target})" if target else kind
