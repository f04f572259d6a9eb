"""Publish a run's Data Docs (static HTML) into the pipeline's reports area of the lake.

GX renders into a local folder; this copies it to ``<lake>/<ns>/<pipeline>/reports/<report id>/``
(local or S3, through pyarrow's file systems) without the ~4 MB of fonts and illustrations GX adds
to every site: the pages keep their styles and render the same in the Airflow UI's report view.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pyarrow.fs as pafs

from tidewater.lake.layout import PipelineLayout
from tidewater.lake.storage import filesystem, join

_KEEP_IMAGES = ("favicon.ico", "short-logo.png", "short-logo-vector.svg", "validation_failed_unexpected_values.gif")


def report_id(*parts: str) -> str:
    """A path-safe folder name for one audit run."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "__".join(p for p in parts if p)).strip("_")[:200]


def prune(site: Path) -> None:
    shutil.rmtree(site / "static" / "fonts", ignore_errors=True)
    images = site / "static" / "images"
    if images.is_dir():
        for image in images.iterdir():
            if image.name not in _KEEP_IMAGES:
                image.unlink()


def publish(site: Path, layout: PipelineLayout, folder: str) -> str:
    """Copy the site to the reports area; return its index.html relative to the lake root."""
    prune(site)
    destination = join(layout.reports_uri(), folder)
    fs, path = filesystem(destination)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(site), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return f"{layout.namespace}/{layout.pipeline.name}/reports/{folder}/index.html"
