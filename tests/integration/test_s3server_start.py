"""The embedded S3 server's start when a port it chose is taken before weed binds it (a real weed
process): it is started again on fresh ports, and the first failure is printed with weed's own
reason, not only its exit code."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tidewater import s3server
from tidewater.s3server import ExitedAtStartError, S3Server


def _race_on(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """The first check of ``port`` calls it free, as a check made just before another process took it."""
    real = s3server._pair_free
    fooled: list[int] = []

    def pair_free(candidate: int) -> bool:
        if candidate == port and not fooled:
            fooled.append(candidate)
            return True
        return real(candidate)

    monkeypatch.setattr(s3server, "_pair_free", pair_free)


@pytest.fixture
def taken_port():
    """A listening socket on 127.0.0.1, as another process's server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", s3server.free_port_pair()))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_taken_after_the_check_starts_the_server_again_on_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], taken_port: int
):
    data = tmp_path / "s3"
    data.mkdir()
    # the folder's recorded filer port is the taken one; the check is fooled once
    (data / "server.json").write_text(json.dumps({"ports": {"filer": taken_port}}))
    _race_on(monkeypatch, taken_port)
    server = S3Server(data, buckets=["one"])
    try:
        server.start()
        first_error = capsys.readouterr().err
        assert "the S3 server exited with code" in first_error
        assert f"port {taken_port}" in first_error and "starting it again on fresh ports" in first_error
        assert taken_port not in server.ports.values()
        client = server.client()
        client.put_object(Bucket="one", Key="k", Body=b"v")
        assert client.get_object(Bucket="one", Key="k")["Body"].read() == b"v"
        assert json.loads((data / "server.json").read_text())["ports"] == server.ports  # the next start reuses them
    finally:
        server.stop()
    assert server.process is None


def test_an_asked_for_port_is_not_swapped_for_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_port: int):
    data = tmp_path / "s3"
    data.mkdir()
    (data / "server.json").write_text(json.dumps({"ports": {"filer": taken_port}}))
    _race_on(monkeypatch, taken_port)
    server = S3Server(data, port=s3server.free_port_pair())
    with pytest.raises(ExitedAtStartError, match=rf"exited with code \d+ on port \d+: .*{taken_port}"):
        server.start()
    assert server.process is None
