"""Another process holding a table lock: flock is per open file description, so only a real second
process shows true exclusion. Ended by PID in a finally, also when the test fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tidewater.lake.locks import TableLock

    path, purpose, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    with TableLock(path, table="test", timeout_s=30).hold(purpose):
        print("held", flush=True)
        time.sleep(seconds)
    """
)


@contextmanager
def held_elsewhere(path: Path, purpose: str, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock file ``path`` for ``seconds``; yields once it holds it."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), purpose, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "held", "the holder process did not take the lock"
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
