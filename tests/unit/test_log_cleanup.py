"""Our commits leave expired log files to maintenance (``POST_COMMIT_HOOKS``), on real local Delta
tables: delta-rs' default after-commit cleanup lists the whole ``_delta_log`` at every commit. Each
case runs beside delta-rs' default on a twin table, which does delete them, so the check can fail."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tidewater.lake.files import write_data_files
from tidewater.lake.tables import LakeTable

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
COMMITS = 25  # delta.checkpointInterval is 20: version 19 gets a checkpoint, after which 0..18 expire


def rows(batch_id: int) -> pa.Table:
    return pa.table({"id": [batch_id], "v": [f"v{batch_id}"]}, schema=SCHEMA)


def expiring(path: Path) -> LakeTable:
    """A table whose log files expire at once (``delta.logRetentionDuration`` 0 s)."""
    table = LakeTable(path.as_uri())
    table.ensure(SCHEMA)
    DeltaTable(table.uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    return table


def commits_in_log(table: LakeTable) -> int:
    return len(list((Path(table.uri.removeprefix("file://")) / "_delta_log").glob("*.json")))


@pytest.mark.parametrize("operation", ["append_arrow", "merge", "commit_files"])
def test_our_commits_keep_expired_log_files(tmp_path: Path, operation: str) -> None:
    ours, theirs = expiring(tmp_path / "ours"), expiring(tmp_path / "theirs")
    for batch_id in range(1, COMMITS + 1):
        if operation == "merge":
            ours.merge(rows(batch_id), keys=["id"], app_id="q", batch_id=batch_id)
        elif operation == "commit_files":  # files staged as executors write them, then one transaction
            staged = write_data_files(ours.uri, rows(batch_id).to_batches(), schema=SCHEMA)
            ours.commit_files(staged, app_id="q", batch_id=batch_id)
        else:
            ours.append_arrow(rows(batch_id), app_id="q", batch_id=batch_id)
        write_deltalake(DeltaTable(theirs.uri), rows(batch_id), mode="append")  # delta-rs' default hooks

    version = ours.version()
    assert list((tmp_path / "ours" / "_delta_log").glob("*.checkpoint.parquet"))  # checkpoints are still written
    assert commits_in_log(ours) == version + 1  # every commit's log file is still there
    assert commits_in_log(theirs) < theirs.version() + 1  # the default deleted the expired ones
    assert ours.committed_version("q") == COMMITS and ours.row_count() == COMMITS
