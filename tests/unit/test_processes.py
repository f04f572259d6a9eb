"""tidewater.processes: signal handling a command relies on to clean up after itself."""

from __future__ import annotations

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
