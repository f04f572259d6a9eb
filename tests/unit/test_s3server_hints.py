"""The S3 server's readiness error names a nearly full disk, the one cause its own log does not."""

from __future__ import annotations

import shutil
from collections import namedtuple

from tidewater import s3server

Usage = namedtuple("Usage", "total used free")


def test_a_nearly_full_disk_is_named_in_the_error(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(100 * 2**30, 99 * 2**30, 2**30))
    hint = s3server.low_disk_hint(tmp_path)
    assert "only 1024 MB free" in hint and str(tmp_path) in hint


def test_a_disk_with_room_adds_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(100 * 2**30, 50 * 2**30, 50 * 2**30))
    assert s3server.low_disk_hint(tmp_path) == ""
