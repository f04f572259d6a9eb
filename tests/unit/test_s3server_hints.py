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


def test_port_pairs_are_drawn_below_the_ephemeral_range(monkeypatch, tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert s3server.ephemeral_ports(ranges) == (32768, 60999)
    monkeypatch.setattr(s3server, "ephemeral_ports", lambda: (32768, 60999))
    first, last = s3server.port_pair_range()
    assert first >= 1024 and last + s3server.GRPC_OFFSET < 32768
    port = s3server.free_port_pair()
    assert first <= port <= last


def test_an_ephemeral_range_too_low_for_pairs_below_it_falls_back(monkeypatch, tmp_path):
    assert s3server.ephemeral_ports(tmp_path / "missing") == (32768, 60999)
    monkeypatch.setattr(s3server, "ephemeral_ports", lambda: (15000, 60999))
    assert s3server.port_pair_range() == (20_000, 55_000)
