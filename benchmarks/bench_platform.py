"""Platform benchmark: how long ``tidewater platform`` takes to be useful, and what it costs in memory.

Starts the real platform command (embedded broker, generator, Airflow's four components, one
supervised streaming job per pipeline) in a temporary state folder and prints:

1. seconds from the command's start to Airflow healthy, to every stream holding its checkpoints, and
   to the first silver rows of every pipeline (what "running within a few minutes, without clicks"
   means here);
2. memory, sampled every 2 s from the command's start, per part: the platform process (with
   generator thread), each Airflow component's session (with the task processes it starts), each
   streaming job's session (JVM + Python driver + workers). Each part as PSS (each shared page
   split between the processes sharing it: the sum is what the host holds) and as summed RSS (a
   page that forked processes share counted once per process: an upper bound). Peak and mean of
   the total for the ``--seconds`` once every source has silver rows, and the peak while the
   platform started. A platform whose sources never all get silver rows within ``--start-timeout``
   still gets its memory reported (over the whole run), with the sources still waiting named;
3. per streaming job, how often one of its queries missed Spark's 10 s connect-back window and was
   restarted (the streaming job's log), which is what a host too busy at the start looks like.

    .venv/bin/python benchmarks/bench_platform.py [--seconds 120] [--rate 150] [--setting NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_stream import rss_bytes, session_pss_by_role, session_roles

from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.errors import ConfigError, one_line
from tidewater.orchestration.supervisor import RUNNING, StreamControl
from tidewater.pipelines import all_pipelines
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import exit_on_sigterm
from tidewater.streaming.host_requests import HostFiles
from tidewater.streaming.runner import WORKER_RESTART

BIN = Path(sys.executable).parent


def wait(predicate, timeout_s: float) -> float | None:
    """When ``predicate()`` held; None when it did not within ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic()
        time.sleep(0.5)
    return None


def session_memory(sid: int, by_role: dict[str, tuple[int, int]] | None = None) -> tuple[int, int]:
    """(PSS, summed RSS) in bytes of every process in session ``sid``; ``by_role`` gets (count, PSS) per
    kind of process (JVM, Python driver, task worker, ...)."""
    roles = session_roles(sid)
    each = session_pss_by_role(roles)
    if by_role is not None:
        for role, pss in each:
            count, total = by_role.get(role, (0, 0))
            by_role[role] = (count + 1, total + pss)
    return sum(pss for _, pss in each), rss_bytes(roles)


def role_lines(by_role: dict[str, tuple[int, int]]) -> str:
    """A stream job's processes by kind: ``JVM 1 x 1,020 MiB, task worker 3 x 610 MiB, ...``."""
    parts = sorted(by_role.items(), key=lambda item: -item[1][1])
    return ", ".join(f"{role} {count} x {pss / 2**20:,.0f} MiB" for role, (count, pss) in parts)


def summary(samples: list[dict[str, tuple[int, int]]], what: str) -> list[str]:
    """Lines: each part's peak and mean PSS (and peak RSS) over ``samples``, then the total's."""
    mib = 2**20
    if not samples:
        return [f"{what} no sample (the platform ended first)"]
    lines = [what]
    parts = dict.fromkeys(part for sample in samples for part in sample)
    for part in parts:
        pss = [s.get(part, (0, 0))[0] for s in samples]
        rss = [s.get(part, (0, 0))[1] for s in samples]
        lines.append(
            f"  {part:<26} PSS peak {max(pss) / mib:6.0f} MiB  mean {statistics.mean(pss) / mib:6.0f} MiB"
            f"   RSS peak {max(rss) / mib:6.0f} MiB"
        )
    pss_totals = [sum(v[0] for v in s.values()) for s in samples]
    rss_totals = [sum(v[1] for v in s.values()) for s in samples]
    lines.append(
        f"  total: PSS peak {max(pss_totals) / mib:,.0f} MiB, mean {statistics.mean(pss_totals) / mib:,.0f} MiB; "
        f"summed RSS peak {max(rss_totals) / mib:,.0f} MiB, mean {statistics.mean(rss_totals) / mib:,.0f} MiB"
    )
    return lines


def without_rows(tables: list) -> list[str]:
    """The tables (as <pipeline>/<table>) with no row yet."""
    return ["/".join(t.uri.rstrip("/").split("/")[-2:]) for t in tables if not (t.exists() and t.row_count() > 0)]


def setting_env(pairs: list[str]) -> dict[str, str]:
    """``--setting NAME=VALUE`` -> ``TIDEWATER_NAME=VALUE`` (a setting the platform is run with)."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"bench_platform: --setting {pair!r}: expected NAME=VALUE, e.g. RELEASE_STARTUP_WORKERS=0")
        env["TIDEWATER_" + name.strip().upper().removeprefix("TIDEWATER_")] = value
    return env


def connect_back_restarts(log_path: Path) -> int:
    """How often the job restarted a query whose Python worker missed the connect-back window (its log)."""
    return log_path.read_text(errors="replace").count(WORKER_RESTART) if log_path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to sample memory once running")
    parser.add_argument("--rate", type=float, default=150.0, help="generated events per second, per pipeline")
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for every stream to hold its checkpoints, and then for every source's first silver rows",
    )
    parser.add_argument(
        "--setting", action="append", default=[], help="NAME=VALUE: run the platform with TIDEWATER_NAME=VALUE"
    )
    args = parser.parse_args()
    exit_on_sigterm()  # a killed bench still stops the platform it started

    state = tempfile.mkdtemp(prefix="tidewater-bench-platform-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWATER_")}
    env |= setting_env(args.setting)
    env |= {"TIDEWATER_STATE_DIR": str(Path(state) / "state"), "TIDEWATER_AIRFLOW_PORT": str(free_port())}
    try:
        settings = Settings.from_env(env)  # what the platform runs with (its pipelines: TIDEWATER_PIPELINES)
    except ConfigError as exc:
        shutil.rmtree(state)
        raise SystemExit(f"bench_platform: {one_line(exc)}") from None
    log = Path(state) / "platform.log"
    began = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "tidewater"), "platform", "--rate", str(args.rate)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pipelines = all_pipelines(settings)
    controls = {name: StreamControl(settings, name) for name in pipelines}
    silvers = [
        PipelineLayout.of(settings, p).table(name)
        for p in pipelines.values()
        for name in PipelineLayout.of(settings, p).tier_tables("silver")
    ]
    samples: list[tuple[float, dict[str, tuple[int, int]]]] = []  # (monotonic time, part -> (PSS, RSS))
    # per sample, each stream job's processes by kind: part -> role -> (count, PSS)
    breakdowns: list[dict[str, dict[str, tuple[int, int]]]] = []
    roles_now: dict[str, dict[str, tuple[int, int]]] = {}
    stop_sampling = threading.Event()

    def sample() -> dict[str, tuple[int, int]]:
        try:
            recorded = json.loads((Path(settings.state_dir) / "platform.json").read_text())
        except (OSError, ValueError):
            recorded = {}
        parts = {"platform": session_memory(proc.pid)}
        if recorded.get("broker_pid"):
            parts["broker"] = session_memory(os.getsid(recorded["broker_pid"]))
        if recorded.get("s3_server_pid"):  # the durable broker's log lives on the embedded S3 server
            parts["broker's S3 server"] = session_memory(os.getsid(recorded["s3_server_pid"]))
        for name, pid in (recorded.get("airflow_pids") or {}).items():
            parts[f"airflow {name}"] = session_memory(pid)
        jobs: dict[int | None, list[str]] = {}  # session -> the pipelines it runs (several: the stream host)
        for name, control in controls.items():
            try:
                stream = control.health().pid
                jobs.setdefault(os.getsid(stream) if stream else None, []).append(name)
            except (OSError, ProcessLookupError):  # a job ending between the look and the count
                jobs.setdefault(None, []).append(name)
        for sid, names in jobs.items():
            label = f"stream job {names[0]}" if len(names) == 1 else f"stream host ({', '.join(names)})"
            try:
                roles_now[label] = {}
                parts[label] = session_memory(sid, roles_now[label]) if sid else (0, 0)
            except (OSError, ProcessLookupError):
                parts[label] = (0, 0)
        return parts

    def sample_all_along() -> None:
        while not stop_sampling.is_set() and proc.poll() is None:
            roles_now.clear()
            samples.append((time.monotonic(), sample()))
            breakdowns.append(dict(roles_now))
            stop_sampling.wait(2.0)

    sampler = threading.Thread(target=sample_all_along, daemon=True)
    sampler.start()
    running = first_rows = None
    waiting: list[str] = []  # the sources without silver rows when the wait gave up
    try:
        healthy = wait(lambda: "Airflow UI at" in log.read_text(), 300)
        if healthy is None:
            raise SystemExit(f"bench_platform: Airflow was not healthy within 300 s (see {log})")
        # Started one after another at the start gate, the last stream may claim its checkpoints minutes in.
        running = wait(lambda: all(c.health().state == RUNNING for c in controls.values()), args.start_timeout)
        if running is not None:
            first_rows = wait(lambda: not without_rows(silvers), args.start_timeout)
        if first_rows is None:
            waiting = without_rows(silvers)
        else:
            time.sleep(args.seconds)
    finally:
        stop_sampling.set()
        sampler.join(10)
        subprocess.run([str(BIN / "tidewater"), "stop", "--timeout", "240"], env=env, timeout=300)
        proc.wait(timeout=60)

    def after(mark: float | None) -> str:
        return "not within the wait" if mark is None else f"after {mark - began:.0f} s"

    print(f"machine: {os.cpu_count()} cores, {platform.platform()}")
    print(
        f"pipelines: {', '.join(pipelines)}; Airflow healthy {after(healthy)}; every stream running {after(running)}; "
        f"every source's first silver rows {after(first_rows)}"
    )
    if first_rows is None:
        print(f"without silver rows when the bench gave up: {', '.join(waiting)}")
        whole = [parts for _, parts in samples]
        print("\n".join(summary(whole, f"memory over the whole run ({len(whole)} samples):")))
    else:
        starting = [parts for at, parts in samples if at < first_rows]
        steady = [parts for at, parts in samples if at >= first_rows]
        print("\n".join(summary(steady, f"memory over {args.seconds:.0f} s at {args.rate:g} events/s per pipeline:")))
        kept = [(sum(v[0] for v in parts.values()), i) for i, (at, parts) in enumerate(samples) if at >= first_rows]
        if kept:
            for part, roles in breakdowns[max(kept)[1]].items():
                print(f"  {part} at the total's peak: {role_lines(roles)}")
        if starting:
            totals = [sum(v[0] for v in parts.values()) for parts in starting]
            print(f"while starting (to the first silver rows): PSS peak {max(totals) / 2**20:,.0f} MiB")
    misses = {name: connect_back_restarts(control.log_path) for name, control in controls.items()}
    if settings.stream_host:  # the hosted pipelines' Spark output is in the host's log
        misses = {"stream host": connect_back_restarts(HostFiles(settings.state_dir, settings.namespace).log_path)}
    print(
        "queries restarted after a missed connect-back: "
        + ", ".join(f"{name} {count}" for name, count in misses.items())
        + f" ({sum(misses.values())} in all)"
    )
    if args.setting:
        print(f"settings: {', '.join(args.setting)}")


if __name__ == "__main__":
    main()
