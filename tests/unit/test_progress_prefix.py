"""A progress recorder follows its own pipeline's queries only: in the stream host one session runs
several pipelines' queries, each pipeline with a recorder (and a progress folder) of its own, and their
query names end alike (``bronze``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tidewater.streaming.progress import ProgressRecorder, ProgressRouter


def progress_event(name: str, batch: int) -> SimpleNamespace:
    return SimpleNamespace(progress=SimpleNamespace(json=json.dumps({"name": name, "batchId": batch, "id": "q"})))


def test_each_recorder_writes_its_own_pipelines_queries(tmp_path):
    rsvps = ProgressRecorder(tmp_path / "rsvps", prefix="live.rsvps.")
    payments = ProgressRecorder(tmp_path / "payments", prefix="live.payments.")
    for recorder in (rsvps, payments):  # a session's listeners all hear every query
        recorder.onQueryProgress(progress_event("live.rsvps.bronze", 3))
        recorder.onQueryProgress(progress_event("live.payments.bronze", 7))
    assert json.loads((tmp_path / "rsvps" / "bronze.json").read_text())["batch_id"] == 3
    assert json.loads((tmp_path / "payments" / "bronze.json").read_text())["batch_id"] == 7
    assert len((tmp_path / "rsvps" / "progress.jsonl").read_text().splitlines()) == 1


def test_started_and_idle_events_of_other_pipelines_are_ignored(tmp_path):
    rsvps = ProgressRecorder(tmp_path / "rsvps", prefix="live.rsvps.")
    rsvps.onQueryStarted(SimpleNamespace(name="live.payments.bronze", id="p"))
    rsvps.onQueryStarted(SimpleNamespace(name="live.rsvps.bronze", id="r"))
    assert rsvps._names == {"r": "live.rsvps.bronze"}


def test_a_sessions_router_hands_each_event_to_its_pipelines_recorder_alone(tmp_path):
    """The stream host's session has one listener, the router: an event crosses py4j and is parsed
    once whatever the number of pipelines, and reaches the recorder of the pipeline it names."""
    rsvps = ProgressRecorder(tmp_path / "rsvps", prefix="live.rsvps.")
    payments = ProgressRecorder(tmp_path / "payments", prefix="live.payments.")
    router = ProgressRouter()
    router.add(rsvps)
    router.add(payments)
    router.onQueryStarted(SimpleNamespace(name="live.payments.bronze", id="p"))
    router.onQueryStarted(SimpleNamespace(name="live.ads.bronze", id="a"))  # no recorder: ignored
    router.on_progress_json({"name": "live.rsvps.bronze", "batchId": 3, "id": "r"})
    router.on_progress_json({"name": "live.payments.bronze", "batchId": 7, "id": "p"})
    router.on_progress_json({"name": "live.ads.bronze", "batchId": 1, "id": "a"})
    assert json.loads((tmp_path / "rsvps" / "bronze.json").read_text())["batch_id"] == 3
    assert json.loads((tmp_path / "payments" / "bronze.json").read_text())["batch_id"] == 7
    assert len((tmp_path / "payments" / "progress.jsonl").read_text().splitlines()) == 1
    assert payments._names == {"p": "live.payments.bronze"} and rsvps._names == {}

    router.onQueryIdle(SimpleNamespace(id="p"))  # the heartbeat: the progress file touched
    assert router.remove(rsvps) is False
    router.on_progress_json({"name": "live.rsvps.bronze", "batchId": 4, "id": "r"})
    assert json.loads((tmp_path / "rsvps" / "bronze.json").read_text())["batch_id"] == 3  # no longer routed
    assert router.remove(payments) is True  # the last one: the router may leave the session
