"""Read-only SQL over the lake: the table catalog (:mod:`.catalog`), the read-only guard
(:mod:`.guard`), the engine (:mod:`.sql`, Apache DataFusion inside delta-rs) and ``tidewater sql``
(:mod:`.cli`).

Nothing here writes to the lake and nothing here starts Spark: it runs inside Airflow's api-server.
"""
