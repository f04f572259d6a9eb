"""The read-only SQL guard on its own: tokenisation, refusals, table references, time travel, re-emission.

No table is opened here: names resolve against the real catalog of real Settings (pure path
arithmetic), so these run in milliseconds.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tidewater.config import Settings
from tidewater.query.catalog import catalog, resolve
from tidewater.query.guard import QUERY_STARTS, STRING, WORD, GuardedQuery, QueryRefused, guard, tokenize


@pytest.fixture
def lake_settings(tmp_path: Path) -> Settings:
    return Settings.from_env({}, state_dir=str(tmp_path / "state"), lake_root=str(tmp_path / "lake"))


@pytest.fixture
def check(lake_settings: Settings):
    known = sorted(catalog(lake_settings))

    def run(sql: str) -> GuardedQuery:
        return guard(sql, resolve=lambda parts: resolve(lake_settings, parts), known=known)

    return run


def refused(check, sql: str) -> str:
    with pytest.raises(QueryRefused) as caught:
        check(sql)
    message = str(caught.value)
    assert "\n" not in message
    return message


def names(query: GuardedQuery) -> list[str]:
    return [use.ref.name for use in query.uses]


# ---- tokenizer ------------------------------------------------------------------------------------


def test_tokens_keep_strings_identifiers_and_drop_comments():
    tokens = tokenize("SELECT 'it''s -- no comment', \"we\"\"ird\" /* a /* nested */ comment */ FROM t -- bye")
    kinds = [(t.kind, t.value) for t in tokens]
    assert kinds == [
        (WORD, "SELECT"),
        (STRING, "it's -- no comment"),
        ("op", ","),
        ("ident", 'we"ird'),
        (WORD, "FROM"),
        (WORD, "t"),
    ]
    assert tokens[4].space_before  # the comment became a separator
    assert tokens[1].emit() == "'it''s -- no comment'"
    assert tokens[3].emit() == '"we""ird"'


def test_backslash_is_not_an_escape_and_dollar_quotes_are_strings():
    tokens = tokenize(r"SELECT 'a\', $$ x' DROP $$, $t$ $$ $t$")
    assert [t.value for t in tokens if t.kind == STRING] == ["a\\", " x' DROP ", " $$ "]
    # Re-emitted in the one canonical form DataFusion reads the same way.
    assert [t.emit() for t in tokens if t.kind == STRING] == ["'a\\'", "' x'' DROP '", "' $$ '"]


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        ("SELECT 'open", "unterminated string literal"),
        ('SELECT "open', "unterminated quoted identifier"),
        ("SELECT 1 /* open", "unterminated /* comment"),
        ("SELECT $$ open", "unterminated dollar-quoted string"),
        ("SELECT $1", "placeholders are not supported"),
        ("SELECT 1 # comment", "unexpected character '#'"),
        ("SELECT 'a' \\", "unexpected character '\\\\'"),
        ("SELECT E'\\' ' FROM x '", "prefixed string literal"),
        ("SELECT U&'\\0041'", "prefixed string literal"),
        ("SELECT r'x'", "prefixed string literal"),
    ],
)
def test_tokenizer_refusals(check, sql, fragment):
    assert fragment in refused(check, sql)


def test_hex_literal_is_allowed(check):
    assert check("SELECT X'AB' AS b").render([]) == "SELECT X'AB' AS b"


# ---- writes and other statements --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "keyword"),
    [
        ("INSERT INTO rsvps.silver VALUES ('e', 1)", "INSERT"),
        ("insert into rsvps.silver select * from rsvps.silver", "INSERT"),
        ("UPDATE rsvps.silver SET venue_id = 'x'", "UPDATE"),
        ("DELETE FROM rsvps.silver", "DELETE"),
        ("MERGE INTO rsvps.silver t USING rsvps.bronze s ON t.a = s.a WHEN MATCHED THEN DELETE", "MERGE"),
        ("CREATE TABLE x AS SELECT 1", "CREATE"),
        ("CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '/etc/passwd'", "CREATE"),
        ("DROP TABLE rsvps.silver", "DROP"),
        ("ALTER TABLE rsvps.silver ADD COLUMN x INT", "ALTER"),
        ("COPY (SELECT 1) TO '/tmp/out.csv'", "COPY"),
        ("TRUNCATE TABLE rsvps.silver", "TRUNCATE"),
        ("SELECT 1 AS a INTO new_table", "SELECT INTO"),
        ("REPLACE INTO rsvps.silver VALUES (1)", "REPLACE"),
        ("VACUUM rsvps.silver", "VACUUM"),
        ("GRANT SELECT ON rsvps.silver TO bob", "GRANT"),
        # hidden behind comments, CTEs, EXPLAIN, parentheses, case
        ("/* SELECT */ DELETE FROM rsvps.silver", "DELETE"),
        ("-- SELECT * FROM rsvps.silver\nDROP TABLE rsvps.silver", "DROP"),
        ("WITH x AS (SELECT 1 AS a) INSERT INTO rsvps.silver SELECT * FROM x", "INSERT"),
        ("WITH x AS (DELETE FROM rsvps.silver RETURNING *) SELECT * FROM x", "DELETE"),
        ("EXPLAIN DELETE FROM rsvps.silver", "DELETE"),
        ("EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x'", "COPY"),
        ("(SELECT 1) UNION (SELECT 2) INTO t", "SELECT INTO"),
        ("sElEcT 1; dRoP tAbLe x", None),
    ],
)
def test_writes_are_refused(check, sql, keyword):
    message = refused(check, sql)
    if keyword is None:
        assert "one statement at a time (found 2)" in message
    else:
        assert message.startswith("refused: only read statements (SELECT/WITH) run here; this statement writes")
        assert f"({keyword})" in message


def test_session_settings_are_refused(check):
    message = refused(check, "SET datafusion.catalog.information_schema = true")
    assert "changes session settings (SET)" in message


@pytest.mark.parametrize("sql", ["SHOW TABLES", "DESCRIBE rsvps.silver", "USE live", "BEGIN", "TABLE rsvps.silver"])
def test_other_statements_are_refused(check, sql):
    first = sql.split()[0].upper()
    assert f"this statement is {first}" in refused(check, sql)


def test_one_statement_at_a_time(check):
    assert "found 2" in refused(check, "SELECT 1; SELECT 2")
    assert "found 3" in refused(check, "SELECT 1;SELECT 2;SELECT 3;")
    assert check("SELECT 1 ; ; -- trailing\n").render([]) == "SELECT 1"
    assert "empty" in refused(check, " -- nothing\n ; ")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'DROP TABLE rsvps.silver; DELETE FROM x' AS s FROM rsvps.silver",
        'SELECT "delete", "insert" FROM rsvps.silver',
        "SELECT s.update, s.set FROM rsvps.silver s",
        "SELECT 1 AS a FROM rsvps.silver -- ; DROP TABLE rsvps.silver",
        "SELECT /* INSERT INTO x */ 1 FROM rsvps.silver",
        "SELECT replace(event_id, 'a', 'b') FROM rsvps.silver",
        "SELECT `event_id` FROM rsvps.silver",
    ],
)
def test_keywords_in_strings_identifiers_and_comments_do_not_count(check, sql):
    query = check(sql)
    assert names(query) == ["rsvps.silver"]
    rendered = query.render(["t0"])
    assert "/*" not in rendered and "--" not in rendered.replace("'DROP", "")


def test_column_named_like_a_keyword_gets_a_hint(check):
    assert 'quote it: "update"' in refused(check, "SELECT update FROM rsvps.silver")


# ---- table references ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "shown"),
    [
        ("SELECT * FROM '/etc/passwd'", "'/etc/passwd' is not one"),
        ("SELECT * FROM 's3://bucket/lake/live/rsvps/silver'", "'s3://bucket/lake/live/rsvps/silver' is not one"),
        ("SELECT * FROM rsvps.silver s JOIN '/etc/passwd' p ON true", "'/etc/passwd' is not one"),
        ("SELECT * FROM rsvps.silver, '/etc/passwd'", "'/etc/passwd' is not one"),
        ("SELECT * FROM rsvps.silver AS a, rsvps.bronze b, '/etc/passwd'", "'/etc/passwd' is not one"),
        ("SELECT * FROM (rsvps.silver s JOIN '/etc/passwd' p ON true)", "'/etc/passwd' is not one"),
        ("SELECT (SELECT count(*) FROM '/etc/passwd') AS n", "'/etc/passwd' is not one"),
        ("SELECT * FROM rsvps.silver WHERE event_id IN (SELECT * FROM '/etc/passwd')", "'/etc/passwd' is not one"),
        ("WITH p AS (SELECT * FROM '/etc/passwd') SELECT * FROM p", "'/etc/passwd' is not one"),
        ("SELECT * FROM rsvps.silver UNION ALL SELECT * FROM '/etc/passwd'", "'/etc/passwd' is not one"),
        ("SELECT * FROM LATERAL '/etc/passwd'", "'/etc/passwd' is not one"),
        ("SELECT * FROM read_parquet('/tmp/x.parquet')", "read_parquet(...) is a table function"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv(...) is a table function"),
        ("SELECT * FROM rsvps.silver s CROSS JOIN delta_scan('/tmp/t')", "delta_scan(...) is a table function"),
        ("SELECT * FROM generate_series(1, 3)", "generate_series(...) is a table function"),
        ("SELECT * FROM rsvps.silver, LATERAL unnest([1, 2])", "unnest(...) is a table function"),
    ],
)
def test_paths_and_table_functions_are_refused(check, sql, shown):
    message = refused(check, sql)
    assert message.startswith("refused: only lake tables can be read (ads.audits, ads.clicks.bronze, ")
    assert "rsvps.audits, rsvps.bronze, " in message
    assert shown in message


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT * FROM "/etc/passwd"',
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM rsvps.nope",
        'SELECT * FROM "..".rsvps.silver',
        'SELECT * FROM "a/b".rsvps.silver',
        "SELECT * FROM silver",
        "SELECT * FROM rsvps.gold",
    ],
)
def test_unknown_tables_are_refused_with_the_known_names(check, sql):
    message = refused(check, sql)
    assert message.startswith("refused: unknown table ")
    listed = "ads.audits, ads.clicks.bronze, ads.clicks.conflicts, ads.clicks.quarantine, ads.clicks.silver"
    assert f"lake tables: {listed}" in message and "rsvps.silver" in message


def test_catalog_names_resolve_to_lake_paths(check, lake_settings):
    query = check(
        "SELECT * FROM rsvps.silver JOIN rsvps.gold.venue_response_counts g ON true, "
        'rsvps.corrections, rsvps.audits, "rsvps.quarantine", sandbox.rsvps.silver x, Live.RSVPS.Bronze'
    )
    assert names(query) == [
        "rsvps.silver",
        "rsvps.gold.venue_response_counts",
        "rsvps.corrections",
        "rsvps.audits",
        "rsvps.quarantine",
        "sandbox.rsvps.silver",
        "live.rsvps.bronze",
    ]
    lake = lake_settings.lake_uri
    uris = [use.ref.uri for use in query.uses]
    assert uris[0] == f"{lake}/live/rsvps/silver"
    assert uris[1] == f"{lake}/live/rsvps/gold/venue_response_counts"
    assert uris[5] == f"{lake}/sandbox/rsvps/silver"
    assert uris[6] == f"{lake}/live/rsvps/bronze"
    assert {use.ref.namespace for use in query.uses} == {"live", "sandbox"}


def test_the_namespace_argument_moves_every_short_name(lake_settings):
    known = sorted(catalog(lake_settings, namespace="sandbox"))
    query = guard(
        "SELECT * FROM rsvps.silver", resolve=lambda p: resolve(lake_settings, p, namespace="sandbox"), known=known
    )
    assert query.uses[0].ref.uri == f"{lake_settings.lake_uri}/sandbox/rsvps/silver"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT EXTRACT(YEAR FROM event_time) AS y FROM rsvps.silver",
        "SELECT SUBSTRING(event_id FROM 2 FOR 3) FROM rsvps.silver",
        "SELECT TRIM(BOTH 'x' FROM event_id) FROM rsvps.silver",
        "SELECT * FROM rsvps.silver WHERE venue_id IS NOT DISTINCT FROM 'v1'",
        "SELECT * FROM rsvps.silver WHERE venue_id IS DISTINCT FROM event_id",
        "SELECT table, keys FROM rsvps.corrections WHERE (table) = 'g' AND table IS NOT NULL",
        "SELECT * FROM rsvps.silver s WHERE EXISTS (SELECT 1 FROM rsvps.silver t WHERE t.event_id = s.event_id)",
        "WITH a AS (SELECT * FROM rsvps.silver), b (x) AS (SELECT 1) SELECT * FROM a, b JOIN a a2 ON true",
        "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
        "SELECT unnest([1, 2]) AS u, * FROM rsvps.silver",
        "SELECT * FROM (SELECT * FROM rsvps.silver) AS s LEFT JOIN rsvps.silver t USING (event_id)",
        "VALUES (1, 'a'), (2, 'b')",
        "(SELECT event_id FROM rsvps.silver) UNION (SELECT event_id FROM rsvps.silver VERSION AS OF 0)",
        "EXPLAIN ANALYZE VERBOSE SELECT count(*) FROM rsvps.silver",
    ],
)
def test_read_queries_pass(check, sql):
    query = check(sql)
    assert all(use.ref.name.startswith("rsvps.") for use in query.uses)
    rendered = query.render([f"t{i}" for i in range(len(query.uses))])
    assert rendered.lstrip("(").split()[0].upper() in QUERY_STARTS  # a query, whatever else it holds


def test_not_distinct_from_outside_a_comparison_is_still_a_table_from(check):
    assert "'/etc/passwd' is not one" in refused(check, "SELECT NOT DISTINCT FROM '/etc/passwd'")


def test_cte_names_cannot_time_travel(check):
    assert "applies to lake tables only" in refused(
        check, "WITH s AS (SELECT * FROM rsvps.silver) SELECT * FROM s VERSION AS OF 1"
    )


# ---- time travel and re-emission -------------------------------------------------------------------------


def test_time_travel_by_version_and_timestamp(check):
    query = check(
        "SELECT * FROM rsvps.silver VERSION AS OF 3 AS old "
        "JOIN rsvps.silver FOR VERSION AS OF 0 v0 ON true "
        "JOIN rsvps.silver new ON true "
        "JOIN rsvps.silver t TIMESTAMP AS OF '2026-11-21T10:00:00Z' ON true "
        "JOIN rsvps.silver TIMESTAMP AS OF '2026-11-21 11:30' ON true "
        "JOIN rsvps.silver FOR SYSTEM_TIME AS OF TIMESTAMP '2026-11-21T12:00:00+01:00' ON true"
    )
    travel = [use.as_of for use in query.uses]
    assert [t.version if t else None for t in travel] == [3, 0, None, None, None, None]
    stamps = [t.timestamp if t else None for t in travel]
    assert stamps[3] == dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
    assert stamps[4] == dt.datetime(2026, 11, 21, 11, 30, tzinfo=dt.UTC)  # no offset: UTC
    assert stamps[5] == dt.datetime(2026, 11, 21, 11, 0, tzinfo=dt.UTC)
    assert [use.label for use in query.uses][:3] == [
        "rsvps.silver VERSION AS OF 3",
        "rsvps.silver VERSION AS OF 0",
        "rsvps.silver",
    ]
    rendered = query.render([f"t{i}" for i in range(6)])
    assert rendered == (
        'SELECT * FROM "t0" AS old JOIN "t1" v0 ON true JOIN "t2" new ON true JOIN "t3" t ON true '
        'JOIN "t4" AS "silver" ON true JOIN "t5" AS "silver" ON true'
    )


def test_time_travel_after_the_alias(check):
    query = check("SELECT s.* FROM rsvps.silver s VERSION AS OF 2 WHERE s.event_id > 'a'")
    assert query.uses[0].as_of.version == 2
    assert query.render(["snap"]) == "SELECT s.* FROM \"snap\" s WHERE s.event_id > 'a'"


def test_default_alias_is_the_last_name_part(check):
    query = check("SELECT venue_response_counts.n FROM rsvps.gold.venue_response_counts ORDER BY 1")
    assert query.render(["g"]) == 'SELECT venue_response_counts.n FROM "g" AS "venue_response_counts" ORDER BY 1'
    assert not query.top_level_limit


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        ("SELECT * FROM rsvps.silver VERSION AS OF 'x'", "VERSION AS OF takes a version number"),
        ("SELECT * FROM rsvps.silver VERSION AS OF -1", "VERSION AS OF takes a version number"),
        ("SELECT * FROM rsvps.silver VERSION AS OF 1.5", "VERSION AS OF takes a version number"),
        ("SELECT * FROM rsvps.silver TIMESTAMP AS OF now()", "TIMESTAMP AS OF takes a quoted ISO-8601 time"),
        ("SELECT * FROM rsvps.silver TIMESTAMP AS OF 'yesterday'", "'yesterday' is not an ISO-8601 time"),
    ],
)
def test_bad_time_travel_is_refused(check, sql, fragment):
    assert fragment in refused(check, sql)


def test_rendering_is_safe_to_append_a_limit(check):
    query = check("SELECT * FROM rsvps.silver -- the end")
    assert query.render(["t"]) == 'SELECT * FROM "t" AS "silver"'
    assert check("SELECT * FROM rsvps.silver ORDER BY 1 LIMIT 5").top_level_limit
    assert check("SELECT * FROM rsvps.silver OFFSET 5").top_level_limit
    assert not check("SELECT * FROM (SELECT * FROM rsvps.silver LIMIT 5) x").top_level_limit


def test_unbalanced_parentheses_are_refused(check):
    # A stray ')' could otherwise close the engine's paging wrapper early.
    assert "unbalanced ')'" in refused(check, "SELECT 1) AS x UNION SELECT * FROM (SELECT 2")
    assert "unbalanced '('" in refused(check, "SELECT (1")
