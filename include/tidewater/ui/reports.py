"""Serving a pipeline's reports area (static Data Docs) out of the lake, and nothing else.

A report file is addressed by its path relative to the lake root, the way audit rows record it
(``<namespace>/<pipeline>/reports/<report id>/index.html``), so the relative links inside GX's
HTML (``static/...``, ``../../index.html``) resolve to sibling files under the same URL prefix.
:func:`report_location` is the only gate: a path that is not strictly inside some pipeline's
``reports/`` folder is refused before any file system is touched. Files are read through
:func:`tidewater.lake.storage.filesystem`, so the same code serves a local lake and S3.
"""

from __future__ import annotations

import mimetypes
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import pyarrow.fs as pafs

from tidewater.config import NAMESPACE_PATTERN
from tidewater.errors import TidewaterError
from tidewater.lake.storage import filesystem, join

# A namespace as tidewater.config checks it, a pipeline name by the same segment rule (no dots: ".."
# cannot match either).
_REPORT_PATH = re.compile(
    rf"^(?P<namespace>{NAMESPACE_PATTERN})/(?P<pipeline>{NAMESPACE_PATTERN})/reports/(?P<rest>.+)$"
)
CHUNK_BYTES = 1 << 20

# Types GX Data Docs need (the OS table can lack some, and a wrong type stops CSS or JS from loading).
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".ico": "image/x-icon",
    ".woff": "font/woff",
    ".woff2": "font/woff2",
    ".ttf": "font/ttf",
    ".eot": "application/vnd.ms-fontobject",
    ".txt": "text/plain; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
}


class ReportPathRefused(TidewaterError):
    """A report request names a path outside every pipeline's reports area."""


class ReportNotFound(TidewaterError):
    """The report path is allowed but no such file exists."""


@dataclass(frozen=True)
class ReportLocation:
    relative: str  # <namespace>/<pipeline>/reports/<rest>, as in the URL
    uri: str  # the file's URI in the lake
    reports_uri: str  # <lake>/<namespace>/<pipeline>/reports: nothing outside it is served


def report_location(lake_uri: str, relative: str) -> ReportLocation:
    """Check a requested report path and return where it lives; refuse anything outside a reports area.

    Refused: empty, absolute, ``.``/``..``/empty segments, backslashes, control characters, and paths
    whose first three segments are not ``<namespace>/<pipeline>/reports``. A trailing slash means
    the folder's ``index.html``.
    """
    if relative.endswith("/"):
        relative += "index.html"
    if not relative or relative.startswith("/") or "\\" in relative or any(ord(c) < 32 for c in relative):
        raise ReportPathRefused(f"refused: {relative!r} is not a report path")
    if any(part in ("", ".", "..") for part in relative.split("/")):
        raise ReportPathRefused(f"refused: {relative!r} leaves the reports area")
    match = _REPORT_PATH.match(relative)
    if match is None:
        raise ReportPathRefused(
            f"refused: {relative!r} is outside every reports area (<namespace>/<pipeline>/reports/...)"
        )
    reports = join(lake_uri, match["namespace"], match["pipeline"], "reports")
    return ReportLocation(relative=relative, uri=join(lake_uri, relative), reports_uri=reports)


def content_type(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in CONTENT_TYPES:
        return CONTENT_TYPES[ext]
    guessed, _ = mimetypes.guess_type(path)
    return guessed or "application/octet-stream"


def report_href(root: str, report_path: str) -> str:
    """The URL of a report file (``report_path`` relative to the lake root) under the app's root."""
    return f"{root}/reports/files/{quote(report_path.lstrip('/'), safe='/')}"


@dataclass(frozen=True)
class ReportFile:
    location: ReportLocation
    size: int
    is_dir: bool

    @property
    def content_type(self) -> str:
        return content_type(self.location.relative)


def stat_report(location: ReportLocation) -> ReportFile:
    """Look the file up; a folder is reported as such (the caller redirects to ``folder/``)."""
    fs, path = filesystem(location.uri)
    _check_inside(location, fs, path)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise ReportNotFound(f"no report file {location.relative}")
    return ReportFile(location, int(info.size or 0), info.type == pafs.FileType.Directory)


def read_report(location: ReportLocation) -> Iterator[bytes]:
    """The file's bytes in chunks (reports are served straight from the lake, S3 included)."""
    fs, path = filesystem(location.uri)
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(CHUNK_BYTES):
            yield chunk


def _check_inside(location: ReportLocation, fs: pafs.FileSystem, path: str) -> None:
    """On a local lake, a symlink inside the reports area must not lead out of it."""
    if not isinstance(fs, pafs.LocalFileSystem):
        return  # object stores have no links; the path check above is the whole story
    _, reports_path = filesystem(location.reports_uri)
    real_reports = os.path.realpath(reports_path)
    if os.path.commonpath([os.path.realpath(path), real_reports]) != real_reports:
        raise ReportPathRefused(f"refused: {location.relative!r} leads outside the reports area")
