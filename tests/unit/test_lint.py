"""The code base passes ruff (lint rules and formatting) with the repository's configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ["include", "tests", "benchmarks", "spark_jobs", "plugins"]


def test_ruff_check() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", *CODE], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *CODE], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
