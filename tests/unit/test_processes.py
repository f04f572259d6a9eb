"""tidewater.processes: signal handling a command relies on to clean up after itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path


def test_a_sigterm_runs_the_finally_blocks_and_exits_143_as_its_own_kind_of_exit(tmp_path: Path):
    cleaned = tmp_path / "cleaned"
    script = textwrap.dedent(
        f"""
        import sys, time
        from tidewater.processes import exit_on_sigterm
        exit_on_sigterm()
        try:
            try:
                print("ready", flush=True)
                time.sleep(60)
            except SystemExit as failed_step:  # as a bench records a child step's failure and goes on
                if type(failed_step) is SystemExit:
                    raise RuntimeError("SIGTERM taken for a failed step") from failed_step
                raise
        finally:
            open({str(cleaned)!r}, "w").write("stopped what it started")
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 143
    finally:
        if child.poll() is None:
            child.kill()
    assert cleaned.read_text() == "stopped what it started"


def test_a_process_whose_main_thread_exited_lives_while_another_thread_holds_its_locks(tmp_path: Path):
    """A kill -9'd driver's main thread shows as a zombie before its other threads are gone, and until
    then the process still holds its flocks (a checkpoint's lease): alive and in its group until the
    last thread ends, then neither (though not yet reaped)."""
    import fcntl
    import time

    from tidewater.processes import alive, group_members

    lock, release = tmp_path / "lease", tmp_path / "release"
    script = textwrap.dedent(
        f"""
        import ctypes, fcntl, os, threading, time
        held = open({str(lock)!r}, "a+")
        fcntl.flock(held, fcntl.LOCK_EX)
        def wait_for_release():
            while not os.path.exists({str(release)!r}):
                time.sleep(0.05)
        threading.Thread(target=wait_for_release).start()
        print("holding", flush=True)
        ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86-64): ends this thread alone
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"holding\n"
        deadline = time.monotonic() + 10
        while _state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(child.pid) == "Z"  # the main thread is gone
        with open(lock, "a+") as taker:
            try:
                fcntl.flock(taker, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the lock was free while the process still had a thread")
            except BlockingIOError:
                pass
        assert alive(child.pid)
        assert [pid for pid, _ in group_members(child.pid)] == [child.pid]

        release.touch()
        while alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child.pid) and not group_members(child.pid)
        assert child.poll() is None or child.returncode == 0  # gone, maybe not reaped yet
        with open(lock, "a+") as taker:
            fcntl.flock(taker, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the last thread ended
    finally:
        release.touch()
        child.wait(timeout=10)


def _state(pid: int) -> str:
    from tidewater.processes import stat_fields

    return stat_fields(f"/proc/{pid}/stat")[0]


def test_what_is_left_of_a_spark_group_is_killed_and_another_programs_group_is_not():
    import time

    from tidewater.processes import group_members, kill_spark_leftovers

    other = "import time; time.sleep(60)"
    leaders = []
    try:
        for name in ("org.apache.spark.deploy.SparkSubmit", "some-other-program"):
            leaders.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {other!r}]); "
                        "time.sleep(60)",
                        name,
                    ],
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 10
        while any(len(group_members(leader.pid)) < 2 for leader in leaders) and time.monotonic() < deadline:
            time.sleep(0.05)
        spark, unrelated = leaders
        members = sorted(pid for pid, _ in group_members(spark.pid))
        assert len(members) == 2
        assert sorted(kill_spark_leftovers(spark.pid)) == members  # its child without "spark" too
        assert spark.wait(timeout=10) == -9
        while group_members(spark.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group_members(spark.pid)
        assert kill_spark_leftovers(unrelated.pid) == []  # a reused pid's group is not ours
        assert len(group_members(unrelated.pid)) == 2
    finally:
        for leader in leaders:
            for pid, _ in group_members(leader.pid):
                os.kill(pid, 9)
            if leader.poll() is None:
                leader.kill()
            leader.wait()
