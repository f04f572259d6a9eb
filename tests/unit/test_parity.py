"""The parity check's comparison: closed published rows against the batch recompute, key by key (no Spark)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from tidewater.quality.parity import SHOWN, compare

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
KEYS = ("window_start", "visitor_id")
SCHEMA = pa.schema(
    [
        ("window_start", pa.timestamp("us", tz="UTC")),
        ("window_end", pa.timestamp("us", tz="UTC")),
        ("visitor_id", pa.string()),
        ("views", pa.int64()),
        ("status", pa.string()),
        ("revision", pa.int32()),
    ]
)


def rows(*specs: tuple[int, str, int], status: str = "final", revision: int = 0) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "window_start": T0 + dt.timedelta(minutes=m),
                "window_end": T0 + dt.timedelta(minutes=m + 30),
                "visitor_id": v,
                "views": n,
                "status": status,
                "revision": revision,
            }
            for m, v, n in specs
        ],
        schema=SCHEMA,
    )


def test_equal_measures_pass_whatever_status_and_revision_say():
    parity = compare("gold/s", rows((0, "a", 2), status="provisional", revision=3), rows((0, "a", 2)), KEYS)
    assert parity.success and parity.compared == 1 and parity.counts["differing_rows"] == 0


def test_a_changed_and_an_unsupported_final_row_are_named_and_pending_rows_are_not():
    published = rows((0, "a", 2), (5, "b", 1), (9, "x", 4))
    batch = rows((0, "a", 3), (5, "b", 1), (7, "c", 1))  # "c": not published final yet (the stream's, or late)
    parity = compare("gold/s", published, batch, KEYS)
    assert not parity.success and parity.counts == {
        "closed_before": None,
        "final_rows": 3,
        "batch_rows": 3,
        "differing_rows": 2,
    }
    (failure,) = parity.failures
    assert failure.startswith("gold/s: 2 final rows differ from the batch recompute: ")
    assert "visitor_id='a') views published 2 vs batch 3" in failure
    assert "visitor_id='x') published {views=4}, the batch has no such row" in failure
    assert "'c'" not in failure


def test_many_differences_are_counted_and_a_few_shown():
    published = rows(*[(m, "a", 1) for m in range(SHOWN + 4)])
    batch = rows(*[(m, "a", 2) for m in range(SHOWN + 4)])
    (failure,) = compare("gold/s", published, batch, KEYS).failures
    assert failure.count("views published 1 vs batch 2") == SHOWN and failure.endswith("(and 4 more)")
