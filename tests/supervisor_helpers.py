"""Stand-ins for the supervisor's tests: a stream launch that fails the way a refused driver does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tidewater.config import Settings

ERROR = "CheckpointError: checkpoint /x/bronze is corrupt: offsets/0 is not valid JSON"


class RefusingLaunch:
    """Stands in for launch_stream_job: a real process that prints a one-line error and exits 2."""

    def __init__(self) -> None:
        self.error = ERROR
        self.launched: list[subprocess.Popen[bytes]] = []

    def __call__(self, settings: Settings, pipeline: str, log_path: Path, **_: Any) -> subprocess.Popen[bytes]:
        script = f"import sys; print('starting'); print({'tidewater: ' + self.error!r}, file=sys.stderr); sys.exit(2)"
        with open(log_path, "ab") as log:
            process = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)
        process.wait(timeout=60)
        self.launched.append(process)
        return process
