"""Small JSON state files (a supervisor's records, a job's passage through the start gate, a query's
heartbeat, a stop request, a checkpoint's identity): read forgivingly, replaced atomically so a reader
in another process never sees half of one."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when missing or unreadable."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Replace a JSON file atomically (readers never see half of it). The temporary file is named for
    this process and host: two writers of one file (a stop request sent from two hosts to a shared
    checkpoint root) never write into each other's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    tmp.replace(path)
