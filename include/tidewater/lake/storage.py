"""Where lake files live: the local file system or S3 (MinIO, moto), seen by delta-rs and pyarrow.

Executors and the driver both call these: credentials come from the standard ``AWS_*`` variables
and the endpoint from ``TIDEWATER_S3_ENDPOINT_URL``, the way Hadoop's s3a reads them, so that no
secret travels inside a Spark plan or option.
"""

from __future__ import annotations

import os
from functools import lru_cache
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

from tidewater.config import Settings


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


def storage_options(uri: str) -> dict[str, str]:
    """delta-rs storage options for a table URI."""
    if not is_s3(uri):
        return {}
    return _settings().s3_storage_options()


@lru_cache(maxsize=1)
def _settings() -> Settings:
    return Settings.from_env()


def reset_cache() -> None:
    """Forget cached settings (tests change the environment between cases)."""
    _settings.cache_clear()
    _filesystem.cache_clear()


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and the path inside it for ``uri``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return _filesystem("file"), unquote(parsed.path)
    if is_s3(uri):
        return _filesystem("s3"), f"{parsed.netloc}{unquote(parsed.path)}"
    raise ValueError(f"unsupported lake URI scheme in {uri!r}")


@lru_cache(maxsize=2)
def _filesystem(kind: str) -> pafs.FileSystem:
    if kind == "file":
        return pafs.LocalFileSystem()
    settings = _settings()
    endpoint = settings.s3_endpoint_url
    scheme = "http" if endpoint.startswith("http://") or settings.s3_allow_http else "https"
    return pafs.S3FileSystem(
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
        region=settings.s3_region,
        endpoint_override=endpoint.split("://", 1)[-1] if endpoint else None,
        scheme=scheme,
    )


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])
