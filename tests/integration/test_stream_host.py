"""The stream host (TIDEWATER_STREAM_HOST=true) with real supervisors and a real spark-submit job: two
pipelines' queries in one JVM, each pipeline still started, failed, stopped and restarted on its own.

Driven through StreamControl as the supervising DAG's task drives it (tests/integration/test_supervision.py
does the same for a job per pipeline).
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from pipeline_helpers import send, wait_for
from tidewater.generator.events import GeneratorConfig, generate
from tidewater.generator.producer import ensure_topic
from tidewater.orchestration.platform import end_stream_host
from tidewater.orchestration.supervisor import DEAD, RUNNING, STOPPED, StreamControl
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import alive, children, group_members
from tidewater.runner_forkserver import WAITER_SCRIPT
from tidewater.streaming.host_requests import HostFiles

pytestmark = pytest.mark.slow

NAMES = ("payments", "rsvps")


def task_worker_daemons(jvm_pid: int) -> list[int]:
    """The JVM's Python daemons that fork task workers (``python -m pyspark.daemon pyspark.worker``)."""
    return [pid for pid, command in children(jvm_pid) if command.rstrip().endswith("-m pyspark.daemon pyspark.worker")]


def test_two_pipelines_in_one_host(kafka_settings, make_topic):
    settings = kafka_settings.replace(
        kafka_topic_prefix=make_topic(partitions=1, prefix="host") + "-",
        pipelines=",".join(NAMES),
        stream_host=True,
        stream_startup_seconds=180,
        stream_stop_timeout_seconds=60,
    )
    for name in NAMES:
        for source in get_pipeline(name).sources:
            ensure_topic(settings, settings.topic(source.topic), 1)
    rsvps, payments = StreamControl(settings, "rsvps"), StreamControl(settings, "payments")
    host = HostFiles(settings.state_dir, settings.namespace)
    # payments refuses its checkpoint at its first start (left by another tool): its error is its own
    refused = PipelineLayout.of(settings, payments.pipeline).checkpoint("bronze")
    (refused / "offsets").mkdir(parents=True)

    def running(control: StreamControl) -> bool:
        return control.health().state == RUNNING

    try:
        assert rsvps.supervise()[0] == "started"
        assert payments.supervise()[0] == "started"
        first = host.last_pid()
        assert first is not None and rsvps.driver()["pid"] == payments.driver()["pid"] == first
        assert rsvps.driver()["hosted"] is True

        send(
            settings,
            settings.topic(get_pipeline("rsvps").source().topic),
            generate(GeneratorConfig(seed=5, rate=50), 300),
        )
        wait_for(
            lambda: running(rsvps) and rsvps.batches()["bronze"] is not None,
            timeout_s=240,
            what="rsvps to commit in the host",
            log=host.log_path,
        )
        wait_for(
            lambda: payments.health().state == DEAD,
            timeout_s=120,
            what="payments' refused start",
            log=payments.log_path,
        )
        assert payments.health().error.startswith("CheckpointError: "), payments.health().error
        (driver,) = rsvps.lease_pids()  # the host's Python driver, in the launched job's process group
        assert os.getpgid(driver) == first
        assert running(rsvps)  # one pipeline's failure is its own

        shutil.rmtree(refused)
        action, _ = payments.supervise()
        assert action.startswith("restarted (died: driver exited: CheckpointError"), action
        assert payments.driver()["pid"] == first  # the same host: no second JVM
        wait_for(lambda: running(payments), timeout_s=180, what="payments running in the host", log=host.log_path)
        assert payments.lease_pids() == {driver}

        # Their streaming-source runners are forks of the host's fork server (tidewater.runner_forkserver):
        # each process Spark started for one handed its connection over and waits for its fork.
        def runners() -> tuple[int, int] | None:
            commands = [command for _, command in group_members(first)]
            forks = sum("tidewater.runner_forkserver" in command for command in commands) - 1  # less the server
            waiting = sum(WAITER_SCRIPT in command for command in commands)  # each now a shell
            return (forks, waiting) if forks == waiting >= 4 else None  # two pipelines, two sources each at least

        wait_for(runners, timeout_s=60, what="every runner forked by the fork server", log=host.log_path)
        # One pool of task workers for the Kafka reads and the UDFs (tidewater.spark.session_conf: one
        # environment for every Python function); Spark keeps a daemon per pool.
        # One pool of task workers for the Kafka reads, the UDFs and payments' state machine
        # (transformWithState): one environment for every Python function (tidewater.spark.session_conf).
        # Spark keeps a daemon per pool; the spark-submit launched is the host's JVM.
        pay = get_pipeline("payments")
        send(
            settings,
            settings.topic(pay.source().topic),
            generate(GeneratorConfig(seed=7, rate=50), 300, pay.sample_events),
        )
        wait_for(
            lambda: (payments.batches().get("gold_fraud_alerts") or 0) > 0 and len(task_worker_daemons(first)) > 0,
            timeout_s=120,
            what="payments' state machine to run a batch",
            log=host.log_path,
        )
        assert len(task_worker_daemons(first)) == 1

        # A stop ends one pipeline's queries; the host and the other pipeline run on.
        assert payments.stop(reason="test: stop one").state == STOPPED
        assert [e["how"] for e in payments.events() if e["event"] == "stop"] == ["request"]
        assert not payments.lease_pids() and alive(first) and running(rsvps) and rsvps.lease_pids() == {driver}
        assert "stop requested by" in payments.log_path.read_text()

        # kill -9 of the host's driver ends both; each supervisor restarts its pipeline, in one new host,
        # and what was left of the old one (its JVM) is ended.
        os.kill(driver, signal.SIGKILL)
        wait_for(lambda: rsvps.health().state == DEAD, timeout_s=30, what="rsvps dead with its host")
        assert rsvps.supervise()[0].startswith("restarted (died")
        wait_for(lambda: not group_members(first), timeout_s=30, what="the killed host's JVM to be ended")
        assert payments.supervise()[0] == "started"
        second = host.last_pid()
        assert second != first and rsvps.driver()["pid"] == payments.driver()["pid"] == second
        before = rsvps.batches()["bronze"]
        send(
            settings,
            settings.topic(get_pipeline("rsvps").source().topic),
            generate(GeneratorConfig(seed=6, rate=50), 300),
        )
        wait_for(
            lambda: running(payments) and running(rsvps) and rsvps.batches()["bronze"] != before,
            timeout_s=240,
            what="both pipelines running again in the new host",
            log=host.log_path,
        )

        # Once it hosts nothing, the host leaves by itself.
        for control in (rsvps, payments):
            assert control.stop(reason="test: stop all").state == STOPPED
        wait_for(lambda: not alive(second), timeout_s=90, what="the host to leave", log=host.log_path)
        assert "hosts no pipeline: leaving" in host.log_path.read_text()
    finally:
        for control in (rsvps, payments):
            control.stop(reason="test cleanup", timeout_s=20)
        end_stream_host(settings, timeout_s=30)
