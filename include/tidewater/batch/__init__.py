"""Bounded recomputes over the streaming code: scheduled interval recompute, replay, late-data correction.

"Batch is a bounded stream": every job here runs the pipeline's own transforms (``silver_from_bronze``,
``GoldTable.rows``) over a bounded input and replaces exactly the rows it recomputed.

    recompute.py    recompute_interval (the scheduled batch DAG), replay (range, entities, bronze|kafka,
                    live|sandbox); the shared core ``rebuild``
    correction.py   correct_late_data: closed gold windows reconciled with silver, every change in the ledger
    sources.py      reads: bronze since a time (from the table or Kafka), silver and gold for a range
    windows.py      gold rows of an interval with their status (pure DataFrame transforms)
    gold_diff.py    what a recompute/correction does to published rows (pure, over Arrow tables)
    lateness.py     how many of a row's events arrived after its window closed
    ledger.py       the corrections ledger table
    predicates.py   one selection as a Spark filter and as the delta-rs predicate that replaces it
    interval.py     [start, end) in UTC, durations (pure)
    targets.py      live or sandbox target: table creation, commit metadata, argument checks
    result.py       BatchResult: what a job did, one JSON line
    cli.py          ``tidewater batch recompute|replay|correct`` (spark_jobs/batch.py)

This package imports no Spark at import time (the command line loads it for every command).
"""
