"""One replay validator for both sides (tidewater.batch.requests.ReplayRequest): pure, no broker, no Spark.

The replay DAG's validate task parses the trigger form's params and the spark-submit job parses
its command line; both call :meth:`ReplayRequest.parse`, so the same request is accepted or refused
the same way on each side, only named as that side's person wrote it (``sandbox_namespace`` or
``--sandbox-namespace``). The form's full refusal list (with the live broker and lake) is in
tests/integration/test_replay_params.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from typing import Any

import pytest

from tidewater.batch import cli as batch_cli
from tidewater.batch.requests import OPTIONS, PARAMS, ReplayRequest, Spelling
from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.orchestration.params import parse_replay_params
from tidewater.pipelines import get_pipeline

RSVPS = get_pipeline("rsvps")
NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
SETTINGS = Settings(state_dir="/nonexistent/tidewater-state")
VALID: dict[str, Any] = {
    "start": "2026-11-21T10:00:00Z",
    "end": "2026-11-21T11:00:00",
    "source": "kafka",
    "target": "sandbox",
    "sandbox_namespace": "replay_1",
    "entities": ["101", "102"],
}


def parse(spelling: Spelling = PARAMS, pipeline=RSVPS, **changes: Any) -> ReplayRequest:
    return ReplayRequest.parse(SETTINGS, pipeline, now=NOW, spelling=spelling, **{**VALID, **changes})


def command_line(args: list[str]) -> argparse.Namespace:
    """The batch job's own argument parser (as spark_jobs/batch.py runs it)."""
    parser = argparse.ArgumentParser()
    batch_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["batch", "replay", *args, "--run-id", "r1"])


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"target": "live", "sandbox_namespace": None, "source": "bronze"},
        {"entities": None, "start": T0, "end": T0 + dt.timedelta(minutes=1)},
    ],
    ids=["sandbox-kafka-entities", "live-bronze", "datetimes"],
)
def test_what_the_dag_accepts_the_job_parses_back_to_the_same_request(changes: dict[str, Any]) -> None:
    """The validate task's request -> the job's arguments -> the job's own parse: the same request."""
    request = parse(**changes)
    again = batch_cli.replay_request(command_line(request.to_args()), SETTINGS, RSVPS, now=NOW)
    assert again == request
    assert again.interval.start == request.start and again.interval.end == request.end


def test_the_form_and_the_library_call_build_the_same_request() -> None:
    params = {"pipeline": "rsvps", **VALID, "entities": "101, 102,101"}
    assert (
        parse_replay_params(params, SETTINGS, now=NOW)
        == parse()
        == ReplayRequest("rsvps", T0, T0 + dt.timedelta(hours=1), "kafka", "sandbox", "replay_1", ("101", "102"))
    )
    # The form always carries sandbox_namespace (its field has a default): a live replay ignores it,
    # while the command line refuses an explicit --sandbox-namespace with --target live.
    live = parse_replay_params({**params, "target": "live"}, SETTINGS, now=NOW)
    assert live.sandbox_namespace == "" and live.written_namespace("live") == "live"
    with pytest.raises(ConfigError, match=r"^--sandbox-namespace needs --target sandbox$"):
        parse(OPTIONS, target="live")


@pytest.mark.parametrize(
    ("changes", "as_param", "as_option"),
    [
        ({"source": "s3"}, "source 's3' is not one of bronze, kafka", "--source 's3' is not one of bronze, kafka"),
        ({"target": "prod"}, "target 'prod' is not one of sandbox, live", "--target 'prod' is not one of"),
        (
            {"end": "2026-11-21T09:00:00Z"},
            "end 2026-11-21T09:00:00.000000Z is not after start 2026-11-21T10:00:00.000000Z: the range is "
            "[start, end), give end > start",
            "--end 2026-11-21T09:00:00.000000Z is not after --start 2026-11-21T10:00:00.000000Z",
        ),
        ({"start": "noon"}, "start 'noon' is not an ISO-8601 time", "--start 'noon' is not an ISO-8601 time"),
        ({"start": "2026-11-21T12:05:01Z", "end": "2026-11-21T13:00:00Z"}, "starts in the future", "in the future"),
        ({"sandbox_namespace": ""}, "a sandbox replay needs sandbox_namespace", "needs --sandbox-namespace"),
        ({"sandbox_namespace": " "}, "or set target=live", "or set --target live"),
        ({"sandbox_namespace": "live"}, "sandbox_namespace 'live' is the live namespace", "--sandbox-namespace 'live'"),
        ({"sandbox_namespace": "a/b"}, "sandbox_namespace 'a/b' may hold only", "--sandbox-namespace 'a/b' may hold"),
        (
            {"entities": ["12", "12a"]},
            "entities 12a are not valid venue_id values of pipeline rsvps (whole numbers)",
            "--entity 12a are not valid venue_id values",
        ),
        ({"entities": 7}, "entities 7 must be a list of values", "--entity 7 must be a list"),
    ],
    ids=lambda value: str(value)[:30] if isinstance(value, dict) else "",
)
def test_both_sides_refuse_the_same_request_naming_their_own_fields(
    changes: dict[str, Any], as_param: str, as_option: str
) -> None:
    for spelling, message in ((PARAMS, as_param), (OPTIONS, as_option)):
        with pytest.raises(ConfigError) as caught:
            parse(spelling, **changes)
        assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_sandbox_is_neither_the_live_namespace_nor_the_one_replayed_from() -> None:
    with pytest.raises(ConfigError, match="'other' is the live namespace"):
        parse(sandbox_namespace="other", namespace="other")
    request = parse(target="live", sandbox_namespace=None, namespace="other")
    assert request.written_namespace("other") == "other"


def test_entities_need_a_pipeline_whose_every_table_is_kept_per_entity() -> None:
    plain = dataclasses.replace(RSVPS, name="plain", entity_column=None)
    with pytest.raises(ConfigError) as caught:
        parse(pipeline=plain)
    assert "pipeline plain has no entity column" in str(caught.value)
    assert str(caught.value).endswith("leave entities empty to replay every entity")
    with pytest.raises(ConfigError, match=r"leave out --entity to replay every entity$"):
        parse(OPTIONS, pipeline=plain)
    assert parse(pipeline=plain, entities=[]).entities == ()

    per_member = dataclasses.replace(RSVPS, name="members", entity_column="member_id")
    with pytest.raises(ConfigError, match="gold table venue_response_counts of pipeline members is not kept per"):
        parse(pipeline=per_member)
