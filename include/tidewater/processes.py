"""Process facts the platform's supervisors share (lowest layer: stdlib only)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Is ``pid`` a live process? A zombie (exited, not yet reaped by its parent) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
