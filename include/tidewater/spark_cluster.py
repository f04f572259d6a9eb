"""A Spark standalone cluster of our own on 127.0.0.1: one master and one worker from the pyspark wheel.

The wheel has no ``sbin/start-master.sh``; ``bin/spark-class`` runs the master and worker classes
directly. Each runs in its own process group and is stopped by its PID (SIGTERM, then SIGKILL).
The worker gets a scrubbed environment (no ``TIDEWATER_*``, no ``AWS_*``): what its executors know of
the lake and the broker comes from the driver (``spark.executorEnv.*``, :func:`tidewater.spark.executor_env`),
as on a real cluster whose workers were started long before the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tidewater import class_data
from tidewater.errors import TidewaterError

START_TIMEOUT_S = 120
SCRUBBED_PREFIXES = ("TIDEWATER_", "AWS_", "PYSPARK_")


class SparkClusterError(TidewaterError):
    """The standalone master or worker did not start."""


def spark_class() -> Path:
    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass
class StandaloneCluster:
    """A master on ``port`` (UI on ``ui_port``) and a worker with ``cores`` and ``memory``."""

    state_dir: Path
    port: int
    ui_port: int
    worker_ui_port: int
    cores: int = 1
    memory: str = "1g"
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
        env.update({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(spark_class().parent.parent)})
        if options := class_data.java_options():  # the master and worker JVMs start ~2 s sooner
            env["SPARK_DAEMON_JAVA_OPTS"] = " ".join([*env.get("SPARK_DAEMON_JAVA_OPTS", "").split(), *options])
        return env

    def _launch(self, name: str, *args: str) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.state_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            process = subprocess.Popen(
                [str(spark_class()), *args],
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.processes.append(process)

    def start(self) -> StandaloneCluster:
        """Start the master, then the worker; return once the master counts the worker alive."""
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        self._launch(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--webui-port",
            str(self.worker_ui_port),
            "--work-dir",
            str(self.state_dir / "work"),
            self.master_url,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.alive_workers() < 1:
            for process in self.processes:
                if process.poll() is not None:
                    self.stop()
                    raise SparkClusterError(f"a Spark standalone process exited: see {self.state_dir}/*.log")
            if time.monotonic() > deadline:
                self.stop()
                raise SparkClusterError(f"no worker joined {self.master_url} in {START_TIMEOUT_S} s")
            time.sleep(1.0)
        return self

    def alive_workers(self) -> int:
        """What the master's UI says (0 while it is not up)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
                return int(json.loads(response.read()).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the worker, then the master: each process group we started, by its PID."""
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=timeout_s)
        self.processes.clear()
