"""Where a pipeline's tables and checkpoints live.

    <lake root>/<namespace>/<pipeline>/bronze | silver | quarantine | conflicts | gold/<name>
    (a pipeline of several sources: <source>/bronze | <source>/silver | ... per source)
    <lake root>/<namespace>/<pipeline>/corrections     (the late-data correction ledger)
    <lake root>/<namespace>/<pipeline>/audits          (data-quality and reconciliation results)
    <lake root>/<namespace>/<pipeline>/reports/<id>/   (Data Docs of one audit run: index.html)
    <checkpoint root>/<namespace>/<pipeline>/<query>
    <checkpoint root>/<namespace>/<pipeline>/_locks/<table>.lock   (see tidewater.lake.locks)
    <checkpoint root>/<namespace>/<pipeline>/stop-request.json     (see tidewater.streaming.stop_request)

The namespace is ``live`` for the tables people query; a sandbox replay uses another one, so it
can never touch live tables or live checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidewater.config import Settings, check_namespace
from tidewater.lake.locks import TableLock, WriterLock
from tidewater.lake.pg_locks import PostgresLock
from tidewater.lake.storage import join
from tidewater.lake.tables import LakeTable
from tidewater.pipelines.base import GoldQuery, Pipeline, Source


@dataclass(frozen=True)
class PipelineLayout:
    settings: Settings
    pipeline: Pipeline
    namespace: str

    @classmethod
    def of(cls, settings: Settings, pipeline: Pipeline, namespace: str | None = None) -> PipelineLayout:
        # Every path below embeds the namespace: check it once here, whoever passed it (CLI, DAG, UI).
        return cls(settings, pipeline, check_namespace(namespace) if namespace else settings.namespace)

    @property
    def table_names(self) -> tuple[str, ...]:
        sources = (name for _, _, name in self.pipeline.source_tables())
        return (*sources, *(f"gold/{g.name}" for g in self.pipeline.gold))

    @property
    def gold_queries(self) -> tuple[GoldQuery, ...]:
        """The gold tier's streaming queries as the settings group them (``TIDEWATER_GOLD_SHARED_QUERIES``)."""
        return self.pipeline.gold_queries(shared=self.settings.gold_shared_queries)

    @property
    def source_queries(self) -> int:
        """How many streaming queries the source tier runs: one per source (bronze and silver in one),
        or two with ``TIDEWATER_SILVER_QUERY`` (see :mod:`tidewater.streaming.runner`)."""
        return len(self.pipeline.sources) * (2 if self.settings.silver_query else 1)

    def gold_query_of(self, gold: str) -> GoldQuery:
        """The streaming query that writes the gold table ``gold`` (its progress, its checkpoint)."""
        return self.pipeline.gold_query_of(gold, shared=self.settings.gold_shared_queries)

    def source_table(self, source: Source, tier: str) -> LakeTable:
        """One source's ``tier`` table (bronze, silver, quarantine, conflicts)."""
        return self.table(self.pipeline.table_of(source, tier))

    def tier_tables(self, tier: str) -> tuple[str, ...]:
        """The ``tier`` table (bronze, silver, quarantine, conflicts) of every source, by name."""
        return tuple(self.pipeline.table_of(source, tier) for source in self.pipeline.sources)

    def table_uri(self, table: str) -> str:
        if table not in self.table_names:
            raise KeyError(f"pipeline {self.pipeline.name} has no table {table!r}; tables: {self.table_names}")
        return join(self.settings.lake_uri, self.namespace, self.pipeline.name, table)

    def checkpoint(self, query: str) -> Path:
        return self.settings.checkpoint_dir / self.namespace / self.pipeline.name / query

    def stop_request(self) -> Path:
        """Where a supervisor asks the pipeline's running driver to stop: beside its checkpoints, so a
        driver on any host that shares the checkpoint storage sees it (see tidewater.streaming.stop_request)."""
        return self.settings.checkpoint_dir / self.namespace / self.pipeline.name / "stop-request.json"

    def progress_dir(self) -> Path:
        return Path(self.settings.state_dir).absolute() / "progress" / self.namespace / self.pipeline.name

    def table(self, table: str) -> LakeTable:
        return LakeTable(self.table_uri(table))

    def ledger_uri(self) -> str:
        """The corrections ledger: every change a correction made to a gold row, with old and new values."""
        return join(self.settings.lake_uri, self.namespace, self.pipeline.name, "corrections")

    def audit_uri(self) -> str:
        """The audit table: one row per suite each audit run validated (see tidewater.quality.audit_log)."""
        return join(self.settings.lake_uri, self.namespace, self.pipeline.name, "audits")

    def reports_uri(self) -> str:
        """The pipeline's reports area: one folder of static Data Docs HTML per audit run."""
        return join(self.settings.lake_uri, self.namespace, self.pipeline.name, "reports")

    def queryable_tables(self) -> dict[str, str]:
        """Every Delta table of the pipeline people may query: data tables, the ledger and the audits."""
        tables = {name: self.table_uri(name) for name in self.table_names}
        return {**tables, "corrections": self.ledger_uri(), "audits": self.audit_uri()}

    def lock(self, table: str) -> WriterLock:
        """The lock every writer of ``table`` holds around its commit (see :mod:`tidewater.lake.locks`)."""
        self.table_uri(table)  # unknown tables fail here
        return self._lock(table.replace("/", "."))

    def ledger_lock(self) -> WriterLock:
        """The corrections ledger's lock (corrections append, maintenance compacts)."""
        return self._lock("corrections")

    def audit_lock(self) -> WriterLock:
        return self._lock("audits")

    def checkpoint_lease(self, query: str) -> PostgresLock | None:
        """The PostgreSQL lease of a query's checkpoint with the ``postgres`` lock backend (named after
        the query, not the path: two mounts of one shared folder name it alike); None: the flock beside it."""
        if self.settings.lock_backend != "postgres":
            return None
        return PostgresLock(self.settings.postgres_dsn, f"checkpoint:{self.namespace}/{self.pipeline.name}/{query}", 0)

    def _lock(self, name: str) -> WriterLock:
        """The ``TIDEWATER_LOCK_BACKEND``'s lock: an flock beside the checkpoints (one host), or a
        PostgreSQL advisory lock (any host)."""
        table = f"{self.namespace}/{self.pipeline.name}/{name}"
        timeout = self.settings.table_lock_timeout_seconds
        if self.settings.lock_backend == "postgres":
            return PostgresLock(self.settings.postgres_dsn, table, timeout)
        return TableLock(
            path=self.settings.checkpoint_dir / self.namespace / self.pipeline.name / "_locks" / f"{name}.lock",
            table=table,
            timeout_s=timeout,
        )
