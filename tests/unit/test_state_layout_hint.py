"""A query that fails on its checkpoint's state layout says what to do about it."""

from tidewater.streaming.checkpoint import state_layout_hint

# The error Spark 4.2 raised (seen) when a state machine's checkpoint from the per-key layout was resumed
# by the bucketed one (tidewater.keyed_state).
SEEN = (
    "StreamingQueryException: [STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match "
    "existing state key schema. (caused by StateStoreKeySchemaNotCompatible: [STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] "
    "Provided key schema does not match existing state key schema.)"
)


def test_a_state_layout_error_gets_the_way_out():
    hint = state_layout_hint(SEEN)
    assert hint.startswith("; its checkpoint's state was written by another layout of this query")
    assert "move it aside and rebuild the affected tables with a replay" in hint


def test_any_other_error_gets_nothing():
    assert state_layout_hint("StreamingQueryException: [STREAM_FAILED] ValueError: boom") == ""
