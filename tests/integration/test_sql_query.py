"""Read-only SQL over real Delta tables (written with delta-rs into a temporary lake), and ``tidewater sql``.

The lake is built once per module: silver with three commits (two appends and a delete, so
versions 0, 1 and 2 hold different rows), a 25-row gold table for paging, an audit table, and a
Delta table outside the lake that nothing may read. No test writes to it; the refused-write test
checks that nothing did.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties

from tidewater.batch.ledger import LEDGER_SCHEMA
from tidewater.config import Settings
from tidewater.quality.audit_log import AuditRow, to_arrow
from tidewater.query.catalog import catalog, latest_audits, table_history, table_info, table_listing
from tidewater.query.sql import QueryRefused, new_session, run_sql

TS = pa.timestamp("us", tz="UTC")
SILVER = pa.schema(
    [
        ("event_id", pa.string()),
        ("venue_id", pa.string()),
        ("response", pa.string()),
        ("event_time", TS),
        ("event_date", pa.date32()),
    ]
)
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
TIDEWATER = Path(sys.executable).parent / "tidewater"


def silver_rows(ids: list[str], venue: str, response: str = "yes") -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "event_id": i,
                "venue_id": venue,
                "response": response,
                "event_time": T0 + dt.timedelta(minutes=n),
                "event_date": T0.date(),
            }
            for n, i in enumerate(ids)
        ],
        schema=SILVER,
    )


@dataclass(frozen=True)
class Lake:
    settings: Settings
    root: Path
    outside: Path  # a Delta table that is not under the lake root
    before_v1: dt.datetime  # between the commits of versions 0 and 1
    before_v2: dt.datetime  # between the commits of versions 1 and 2

    def env(self) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEWATER_", "AWS_"))}
        root, state = str(self.root), str(self.root.parent / "state")
        return {**clean, "TIDEWATER_LAKE_ROOT": root, "TIDEWATER_STATE_DIR": state, "TIDEWATER_PIPELINES": "rsvps"}


def pause() -> dt.datetime:
    """A moment strictly between two commits (time travel resolves by commit file modification time)."""
    time.sleep(0.02)
    middle = dt.datetime.now(dt.UTC)
    time.sleep(0.02)
    return middle


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    base = tmp_path_factory.mktemp("sql")
    # The deployment runs rsvps only: the catalog lists the pipelines a deployment runs.
    settings = Settings.from_env({}, state_dir=str(base / "state"), lake_root=str(base / "lake"), pipelines="rsvps")
    tables = catalog(settings)
    silver = tables["rsvps.silver"].uri
    write_deltalake(silver, silver_rows(["e1", "e2", "e3"], "v1"))  # version 0
    before_v1 = pause()
    write_deltalake(silver, silver_rows(["e4", "e5"], "v2", "no"), mode="append")  # version 1
    before_v2 = pause()
    DeltaTable(silver).delete(  # version 2
        "event_id = 'e1'", commit_properties=CommitProperties(custom_metadata={"tidewater.run_id": "fix-1"})
    )

    gold = pa.Table.from_pylist(
        [
            {"window_start": T0 + dt.timedelta(minutes=i % 5), "venue_id": f"v{i:02d}", "response": "yes", "n": i}
            for i in range(25)
        ],
        schema=pa.schema(
            [("window_start", TS), ("venue_id", pa.string()), ("response", pa.string()), ("n", pa.int64())]
        ),
    )
    write_deltalake(tables["rsvps.gold.venue_response_counts"].uri, gold)

    def audit(table: str, success: bool, minutes: int, audit_id: str) -> AuditRow:
        return AuditRow(
            audit_id=audit_id,
            pipeline="rsvps",
            namespace="live",
            suite=f"rsvps.{table}",
            table_name=table,
            interval_start=T0,
            interval_end=T0 + dt.timedelta(hours=1),
            success=success,
            rows=10,
            expectations=4,
            failed_expectations=0 if success else 1,
            failures=() if success else ("expect_column_values_to_not_be_null(event_id): 1 null",),
            audited_at=T0 + dt.timedelta(minutes=minutes),
        )

    audits = [
        audit("silver", False, 10, "a1"),
        audit("silver", True, 20, "a2"),  # the newest silver audit
        audit("gold/venue_response_counts", True, 15, "a1"),
        audit("records", True, 30, "a2"),  # a suite about no queryable table
    ]
    write_deltalake(tables["rsvps.audits"].uri, to_arrow(audits))

    ledger = [
        {
            "table": "gold/venue_response_counts",
            "window_start": T0,
            "window_end": T0 + dt.timedelta(minutes=1),
            "keys": json.dumps({"venue_id": "v01", "response": "yes"}),
            "old_value": json.dumps({"n": 1}),
            "new_value": json.dumps({"n": 2}),
            "late_events": 1,
            "reason": "late data",
            "dag_run_id": "correct-1",
            "corrected_at": T0 + dt.timedelta(hours=1),
        }
    ]
    write_deltalake(tables["rsvps.corrections"].uri, pa.Table.from_pylist(ledger, schema=LEDGER_SCHEMA))

    sandbox = catalog(settings, namespace="sandbox")["rsvps.silver"].uri
    write_deltalake(sandbox, silver_rows(["s1"], "sandbox-venue"))

    outside = base / "outside" / "secret"
    write_deltalake(str(outside), pa.table({"secret": ["do not read"]}))
    return Lake(settings, base / "lake", outside, before_v1, before_v2)


def ids(result) -> list[str]:
    return [row[result.columns.index("event_id")] for row in result.rows]


def refused(lake: Lake, sql: str, **kwargs) -> str:
    with pytest.raises(QueryRefused) as caught:
        run_sql(lake.settings, sql, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---- queries --------------------------------------------------------------------------------------


def test_select_returns_typed_rows_and_the_snapshot_read(lake):
    result = run_sql(lake.settings, "SELECT * FROM rsvps.silver WHERE venue_id = 'v1' ORDER BY event_id")
    assert result.columns == ["event_id", "venue_id", "response", "event_time", "event_date"]
    assert ids(result) == ["e2", "e3"]  # e1 was deleted in version 2
    assert result.rows[0][3] == T0 + dt.timedelta(minutes=1)
    assert result.rows[0][4] == T0.date()
    assert (result.page, result.page_size, result.has_more) == (1, 100, False)
    assert result.types[3] == "timestamp[us, tz=UTC]"
    (key,) = result.tables
    assert key == "rsvps.silver@v2"
    assert result.tables[key]["version"] == result.tables[key]["latest_version"] == 2
    assert result.tables[key]["as_of"] == ["latest"]
    assert result.tables[key]["uri"] == f"{lake.settings.lake_uri}/live/rsvps/silver"
    assert 0 < result.elapsed_s < 10
    as_json = json.loads(result.to_json())
    assert as_json["rows"][0][3] == "2026-11-21T10:01:00+00:00"
    assert as_json["rows"][0][4] == "2026-11-21"


def test_join_and_aggregate(lake):
    result = run_sql(
        lake.settings,
        "SELECT s.venue_id, count(*) AS rsvps, sum(g.n) AS gold_n "
        "FROM rsvps.silver s LEFT JOIN rsvps.gold.venue_response_counts g "
        "ON g.venue_id = 'v0' || substr(s.venue_id, 2) "
        "GROUP BY s.venue_id ORDER BY s.venue_id",
    )
    assert result.columns == ["venue_id", "rsvps", "gold_n"]
    assert result.rows == [["v1", 2, 2], ["v2", 2, 4]]


def test_default_alias_and_ctes(lake):
    result = run_sql(
        lake.settings,
        "WITH yes AS (SELECT * FROM rsvps.silver WHERE response = 'yes') "
        "SELECT silver.event_id FROM rsvps.silver WHERE silver.event_id IN (SELECT event_id FROM yes) ORDER BY 1",
    )
    assert result.rows == [["e2"], ["e3"]]


def test_time_travel_by_version(lake):
    v0 = run_sql(lake.settings, "SELECT event_id FROM rsvps.silver VERSION AS OF 0 ORDER BY 1")
    v1 = run_sql(lake.settings, "SELECT event_id FROM rsvps.silver FOR VERSION AS OF 1 ORDER BY 1")
    assert ids(v0) == ["e1", "e2", "e3"]
    assert ids(v1) == ["e1", "e2", "e3", "e4", "e5"]
    assert v0.tables["rsvps.silver@v0"]["as_of"] == ["VERSION AS OF 0"]
    assert v0.tables["rsvps.silver@v0"]["latest_version"] == 2


def test_time_travel_by_timestamp(lake):
    at = lake.before_v1.isoformat()
    result = run_sql(lake.settings, f"SELECT event_id FROM rsvps.silver TIMESTAMP AS OF '{at}' ORDER BY 1")
    assert ids(result) == ["e1", "e2", "e3"]
    assert list(result.tables) == ["rsvps.silver@v0"]
    between = lake.before_v2.astimezone(dt.timezone(dt.timedelta(hours=5))).isoformat()  # any offset
    result = run_sql(lake.settings, f"SELECT count(*) AS n FROM rsvps.silver TIMESTAMP AS OF '{between}'")
    assert result.rows == [[5]]


def test_one_table_at_two_versions_in_one_query(lake):
    result = run_sql(
        lake.settings,
        "SELECT old.event_id FROM rsvps.silver VERSION AS OF 1 old "
        "LEFT JOIN rsvps.silver new ON new.event_id = old.event_id WHERE new.event_id IS NULL",
    )
    assert result.rows == [["e1"]]  # what version 2 deleted
    assert set(result.tables) == {"rsvps.silver@v1", "rsvps.silver@v2"}


def test_another_namespace(lake):
    qualified = run_sql(lake.settings, "SELECT venue_id FROM sandbox.rsvps.silver")
    assert qualified.rows == [["sandbox-venue"]]
    assert list(qualified.tables) == ["sandbox.rsvps.silver@v0"]
    browsed = run_sql(lake.settings, "SELECT venue_id FROM rsvps.silver", namespace="sandbox")
    assert browsed.rows == [["sandbox-venue"]]


def test_the_corrections_ledger_and_its_table_column(lake):
    result = run_sql(
        lake.settings,
        "SELECT table, late_events, new_value FROM rsvps.corrections WHERE table LIKE 'gold/%' AND (table) IS NOT NULL",
    )
    assert result.rows == [["gold/venue_response_counts", 1, '{"n": 2}']]


def test_explain(lake):
    result = run_sql(lake.settings, "EXPLAIN SELECT count(*) FROM rsvps.silver")
    assert result.columns == ["plan_type", "plan"]
    plans = "\n".join(row[1] for row in result.rows)
    assert "rsvps.silver@v2" in plans and "__tw_" not in plans


# ---- paging ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["ASC", "DESC"])
def test_pages_concatenate_to_the_whole_result(lake, order):
    sql = f"SELECT venue_id, n FROM rsvps.gold.venue_response_counts ORDER BY n {order}"
    whole = run_sql(lake.settings, sql, page_size=1000)
    assert len(whole.rows) == 25 and not whole.has_more
    pages = [run_sql(lake.settings, sql, page=p, page_size=10) for p in (1, 2, 3, 4)]
    assert [len(p.rows) for p in pages] == [10, 10, 5, 0]
    assert [p.has_more for p in pages] == [True, True, False, False]
    assert [row for p in pages for row in p.rows] == whole.rows
    assert pages[1].first_row == 11


def test_paging_a_query_with_its_own_limit(lake):
    sql = "SELECT n FROM rsvps.gold.venue_response_counts ORDER BY n DESC LIMIT 12 OFFSET 1"
    pages = [run_sql(lake.settings, sql, page=p, page_size=5) for p in (1, 2, 3)]
    assert [row[0] for p in pages for row in p.rows] == list(range(23, 11, -1))
    assert [p.has_more for p in pages] == [True, True, False]


def test_exactly_one_full_page_has_no_more(lake):
    result = run_sql(lake.settings, "SELECT n FROM rsvps.gold.venue_response_counts ORDER BY n", page_size=25)
    assert len(result.rows) == 25 and not result.has_more


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"page": 0}, "page must be a whole number from 1"),
        ({"page_size": 0}, "page size must be between 1 and 1000"),
        ({"page_size": 1001}, "page size must be between 1 and 1000"),
        ({"page_size": 50, "max_page_size": 20}, "page size must be between 1 and 20"),
    ],
)
def test_bad_paging_is_refused(lake, kwargs, fragment):
    assert fragment in refused(lake, "SELECT 1", **kwargs)


# ---- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM rsvps.silver",
        "INSERT INTO rsvps.silver SELECT * FROM rsvps.silver",
        "UPDATE rsvps.silver SET response = 'no'",
        "DROP TABLE rsvps.silver",
        "WITH x AS (SELECT 1) INSERT INTO rsvps.silver SELECT * FROM rsvps.silver",
        "COPY (SELECT * FROM rsvps.silver) TO '/tmp/tidewater-sql-copy.csv'",
    ],
)
def test_writes_are_refused_and_change_nothing(lake, sql):
    silver = DeltaTable(catalog(lake.settings)["rsvps.silver"].uri)
    before = (silver.version(), len(silver.file_uris()))
    message = refused(lake, sql)
    assert message.startswith("refused: only read statements (SELECT/WITH) run here; this statement writes (")
    silver = DeltaTable(catalog(lake.settings)["rsvps.silver"].uri)
    assert (silver.version(), len(silver.file_uris())) == before
    assert not Path("/tmp/tidewater-sql-copy.csv").exists()


def test_files_outside_the_lake_are_refused(lake):
    message = refused(lake, "SELECT * FROM '/etc/passwd'")
    assert message.startswith("refused: only lake tables can be read (rsvps.audits, ")
    assert message.endswith("'/etc/passwd' is not one")
    assert f"'{lake.outside}' is not one" in refused(lake, f"SELECT * FROM '{lake.outside}'")
    assert "is not one" in refused(lake, f"SELECT * FROM '{lake.outside.as_uri()}'")
    assert "unknown table" in refused(lake, f'SELECT * FROM "{lake.outside}"')
    assert "read_parquet(...) is a table function" in refused(lake, "SELECT * FROM read_parquet('/etc/passwd')")
    # A namespace is one plain folder name: no way up and out of the lake.
    assert "unknown table" in refused(lake, 'SELECT * FROM "..".rsvps.silver')


def test_datafusion_itself_reads_no_url_tables(lake):
    """Even if the guard let a path through, the engine's session has nothing to read it with."""
    for target in (str(lake.outside), lake.outside.as_uri(), "/etc/passwd"):
        with pytest.raises(Exception, match="not found"):
            session = new_session()
            session.execute(f"SELECT * FROM '{target}'").read_all()
    with pytest.raises(Exception, match="not found"):
        new_session().execute("SELECT * FROM read_parquet('/etc/passwd')").read_all()


def test_unknown_and_missing_tables(lake):
    message = refused(lake, "SELECT * FROM rsvps.gold.nope")
    assert message.startswith("refused: unknown table rsvps.gold.nope; lake tables: rsvps.audits, rsvps.bronze")
    bronze = catalog(lake.settings)["rsvps.bronze"].uri
    assert (
        refused(lake, "SELECT * FROM rsvps.bronze") == f"table rsvps.bronze has no data yet (no Delta log at {bronze})"
    )


def test_versions_that_do_not_exist_are_refused_with_the_range(lake):
    assert refused(lake, "SELECT * FROM rsvps.silver VERSION AS OF 7") == (
        "refused: rsvps.silver has versions 0..2; VERSION AS OF 7 is not one"
    )
    message = refused(lake, "SELECT * FROM rsvps.silver TIMESTAMP AS OF '2020-01-01T00:00:00Z'")
    assert message.startswith("refused: rsvps.silver has no version at 2020-01-01T00:00:00+00:00: its versions 0..2")


def test_sql_errors_are_one_line(lake):
    message = refused(lake, "SELECT nope FROM rsvps.silver")
    assert message.startswith("SQL error: Schema error: No field named nope.")
    assert "silver.event_id" in message and "__tw_" not in message
    assert refused(lake, "SELECT * FROM rsvps.silver WHERE").startswith("SQL error: ")
    assert "Line:" not in refused(lake, "SELECT 1 +")


# ---- catalog ----------------------------------------------------------------------------------------


def test_catalog_lists_every_queryable_table_under_the_lake(lake):
    tables = catalog(lake.settings)
    assert set(tables) == {
        "rsvps.bronze",
        "rsvps.silver",
        "rsvps.quarantine",
        "rsvps.conflicts",
        "rsvps.gold.venue_response_counts",
        "rsvps.gold.trending_venues",
        "rsvps.corrections",
        "rsvps.audits",
    }
    gold = tables["rsvps.gold.venue_response_counts"]
    assert (gold.namespace, gold.pipeline, gold.table) == ("live", "rsvps", "gold/venue_response_counts")
    assert all(ref.uri.startswith(lake.settings.lake_uri + "/live/rsvps/") for ref in tables.values())
    assert catalog(lake.settings, namespace="sandbox")["rsvps.silver"].uri.endswith("/sandbox/rsvps/silver")


def test_table_info(lake):
    tables = catalog(lake.settings)
    info = table_info(tables["rsvps.silver"])
    assert info.exists and info.error is None
    assert (info.version, info.rows) == (2, 4)
    assert info.files == len(DeltaTable(tables["rsvps.silver"].uri).file_uris())
    assert info.size_bytes > 0
    assert info.last_operation == "DELETE"
    assert info.last_commit_metadata == {"tidewater.run_id": "fix-1"}
    assert abs(info.last_commit_time - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=5)
    assert ("event_time", "timestamp[us, tz=UTC]") in info.columns
    assert json.loads(json.dumps(info.as_dict()))["last_commit_time"] == info.last_commit_time.isoformat()
    missing = table_info(tables["rsvps.bronze"])
    assert not missing.exists and missing.version is None and missing.error is None


def test_table_history(lake):
    history = table_history(catalog(lake.settings)["rsvps.silver"])
    assert [h["version"] for h in history] == [2, 1, 0]
    assert [h["operation"] for h in history] == ["DELETE", "WRITE", "WRITE"]
    assert history[0]["metadata"] == {"tidewater.run_id": "fix-1"}
    assert history[1]["operationParameters"] == {"mode": "Append"}
    assert history[0]["timestamp"] > history[2]["timestamp"]
    assert [h["version"] for h in table_history(catalog(lake.settings)["rsvps.silver"], limit=1)] == [2]
    assert table_history(catalog(lake.settings)["rsvps.bronze"]) == []


def test_table_listing_is_json_ready(lake):
    listing = json.loads(json.dumps(table_listing(lake.settings)))
    assert [t["name"] for t in listing] == list(catalog(lake.settings))
    silver = next(t for t in listing if t["name"] == "rsvps.silver")
    assert (silver["version"], silver["rows"], silver["last_operation"]) == (2, 4, "DELETE")
    assert silver["latest_audit"]["audited_at"] == "2026-11-21T10:20:00+00:00"
    assert next(t for t in listing if t["name"] == "rsvps.bronze")["latest_audit"] is None


def test_latest_audits(lake):
    audits = latest_audits(lake.settings)
    assert set(audits) == {"rsvps.silver", "rsvps.gold.venue_response_counts"}
    silver = audits["rsvps.silver"]
    assert (silver["audit_id"], silver["success"]) == ("a2", True)
    assert silver["audited_at"] == T0 + dt.timedelta(minutes=20)
    assert audits["rsvps.gold.venue_response_counts"]["table_name"] == "gold/venue_response_counts"
    assert latest_audits(lake.settings, namespace="sandbox") == {}  # no audit table there


# ---- the command ----------------------------------------------------------------------------------


def tidewater(lake: Lake, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TIDEWATER), *args], env=lake.env(), capture_output=True, text=True, timeout=60)


def test_cli_pages_a_query(lake):
    result = tidewater(
        lake, "sql", "SELECT venue_id, n FROM rsvps.gold.venue_response_counts ORDER BY n", "--page-size", "10"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["venue_id", "n"]
    assert lines[2].split() == ["v00", "0"]
    assert len(lines) == 2 + 10 + 1
    assert lines[-1].startswith("page 1, 10 rows, more: yes — use --page 2; read rsvps.gold.venue_response_counts@v0")

    last = tidewater(
        lake, "sql", "SELECT n FROM rsvps.gold.venue_response_counts ORDER BY n", "--page", "3", "--page-size", "10"
    )
    assert last.stdout.splitlines()[-1].startswith("page 3, 5 rows, more: no")


def test_cli_json_and_csv(lake):
    sql = "SELECT event_id, event_time FROM rsvps.silver VERSION AS OF 0 ORDER BY event_id"
    out = tidewater(lake, "sql", sql, "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["columns"] == ["event_id", "event_time"]
    assert data["rows"][0] == ["e1", "2026-11-21T10:00:00+00:00"]
    assert data["has_more"] is False and list(data["tables"]) == ["rsvps.silver@v0"]
    csv_out = tidewater(lake, "sql", sql, "--format", "csv")
    assert csv_out.stdout.splitlines() == [
        "event_id,event_time",
        "e1,2026-11-21T10:00:00+00:00",
        "e2,2026-11-21T10:01:00+00:00",
        "e3,2026-11-21T10:02:00+00:00",
    ]


def test_cli_refuses_a_write_in_one_line(lake):
    before = DeltaTable(catalog(lake.settings)["rsvps.silver"].uri).version()
    result = tidewater(lake, "sql", "DELETE FROM rsvps.silver")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "tidewater: QueryRefused: refused: only read statements (SELECT/WITH) run here; this statement writes (DELETE)"
        ' - if DELETE is a column name, quote it: "DELETE"'
    ]
    assert DeltaTable(catalog(lake.settings)["rsvps.silver"].uri).version() == before
    bad_page = tidewater(lake, "sql", "SELECT 1", "--page-size", "0")
    assert bad_page.returncode == 2 and len(bad_page.stderr.splitlines()) == 1
    usage = tidewater(lake, "sql", "SELECT 1", "--page", "x")
    assert usage.returncode == 2 and usage.stderr.startswith("tidewater: ConfigError: tidewater sql: argument --page")
    assert len(usage.stderr.splitlines()) == 1


def test_cli_lists_tables(lake):
    result = tidewater(lake, "sql", "--tables")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[2:]}
    assert set(rows) == set(catalog(lake.settings))
    assert rows["rsvps.silver"].split()[1:3] == ["2", "4"]
    assert "DELETE" in rows["rsvps.silver"] and "passed 2026-11-21 10:20" in rows["rsvps.silver"]
    assert "no data yet" in rows["rsvps.bronze"]
    listed = json.loads(tidewater(lake, "sql", "--tables", "--format", "json").stdout)
    silver = next(t for t in listed if t["name"] == "rsvps.silver")
    assert silver["version"] == 2 and silver["latest_audit"]["audit_id"] == "a2"


# ---- S3 (moto) ------------------------------------------------------------------------------------


def test_s3_lake(s3_lake_uri, s3_env, tmp_path):
    """The same engine over an s3:// lake: storage options, commit times and the version range from S3."""
    from tidewater.lake.storage import storage_options

    settings = Settings.from_env(None, state_dir=str(tmp_path / "state"), lake_root=s3_lake_uri)
    silver = catalog(settings)["rsvps.silver"].uri
    assert silver.startswith("s3://")
    options = storage_options(silver)
    write_deltalake(silver, silver_rows(["e1", "e2"], "v1"), storage_options=options)
    write_deltalake(silver, silver_rows(["e3"], "v2"), mode="append", storage_options=options)

    latest = run_sql(settings, "SELECT event_id FROM rsvps.silver ORDER BY 1", page_size=2)
    assert (ids(latest), latest.has_more) == (["e1", "e2"], True)
    assert latest.tables["rsvps.silver@v1"]["commit_time"] is not None
    old = run_sql(settings, "SELECT count(*) AS n FROM rsvps.silver VERSION AS OF 0")
    assert old.rows == [[2]]
    with pytest.raises(QueryRefused, match=r"rsvps.silver has versions 0\.\.1; VERSION AS OF 3 is not one"):
        run_sql(settings, "SELECT * FROM rsvps.silver VERSION AS OF 3")
    with pytest.raises(QueryRefused, match="has no version at 2020-01-01"):
        run_sql(settings, "SELECT * FROM rsvps.silver TIMESTAMP AS OF '2020-01-01'")
    info = table_info(catalog(settings)["rsvps.silver"])
    assert (info.exists, info.version, info.rows, info.files) == (True, 1, 3, 2)
    with pytest.raises(QueryRefused, match=r"table rsvps\.bronze has no data yet"):
        run_sql(settings, "SELECT * FROM rsvps.bronze")
