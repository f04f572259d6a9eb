"""Publish a run's Data Docs (static HTML) into the pipeline's reports area of the lake.

GX renders into a local folder; this copies it to ``<lake>/<ns>/<pipeline>/reports/<report id>/``
(local or S3, through pyarrow's file systems) without the ~4 MB of fonts and illustrations GX adds
to every site. GX's own index lists the validations with jQuery and bootstrap-table from public
CDNs, which a closed network (and a reader offline) never gets: it is kept as ``gx_index.html`` and
``index.html`` becomes a plain page listing every validation and suite page of the run, with each
suite's outcome. The validation pages themselves render without the CDN styles, readable as is.
"""

from __future__ import annotations

import html
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import pyarrow.fs as pafs

from tidewater.lake.storage import filesystem, join
from tidewater.pipelines.layout import PipelineLayout

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


def write_index(site: Path, title: str, outcomes: Mapping[str, tuple[bool, list[str]]]) -> None:
    """A self-contained index: each suite's outcome and failures, linked to its GX pages."""
    if (site / "index.html").exists():
        (site / "index.html").rename(site / "gx_index.html")
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "gx_index.html")
    items = []
    for suite, (success, failures) in outcomes.items():
        parts = suite.split(".")
        links = [p for p in pages if f"/{'/'.join(parts)}/" in f"/{p}" or p.endswith(f"/{'/'.join(parts)}.html")]
        state = "passed" if success else "FAILED"
        failed = "".join(f"<li>{html.escape(f)}</li>" for f in failures)
        anchors = " ".join(f'<a href="{html.escape(p)}">{html.escape(p.split("/")[0])}</a>' for p in links)
        items.append(
            f'<tr class="{state.lower()}"><td>{html.escape(suite)}</td><td>{state}</td><td>{anchors}</td>'
            f"<td><ul>{failed}</ul></td></tr>"
        )
    (site / "index.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<link rel='stylesheet' href='static/styles/data_docs_default_styles.css'>"
        "<style>body{font-family:sans-serif;margin:1.5em}td{padding:.3em .8em;vertical-align:top;"
        "border-bottom:1px solid #ddd}.failed td:nth-child(2){color:#b00;font-weight:bold}"
        ".passed td:nth-child(2){color:#070}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table><tr><th>suite</th><th>result</th><th>pages</th>"
        f"<th>failed expectations / checks</th></tr>{''.join(items)}</table>"
        "<p><a href='gx_index.html'>Great Expectations' own index</a> (needs its CDN scripts)</p></body></html>",
        encoding="utf-8",
    )


def publish(site: Path, layout: PipelineLayout, folder: str) -> str:
    """Copy the site to the reports area; return its index.html relative to the lake root."""
    prune(site)
    destination = join(layout.reports_uri(), folder)
    fs, path = filesystem(destination)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(site), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return f"{layout.namespace}/{layout.pipeline.name}/reports/{folder}/index.html"
