"""The Data Docs' CDN assets, vendored: every URL GX's templates use is covered, pages are rewritten to
the vendored copies, nothing outside them is served, and a tarball that is not the pinned one is refused."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import great_expectations
import pytest

from tidewater.errors import ConfigError
from tidewater.ui import vendor

GX_TEMPLATES = Path(great_expectations.__file__).parent / "render" / "view" / "templates"
ASSET_URL = re.compile(r"""(?:src|href)=["'](https?://[^"']+)["']""")


def gx_asset_urls() -> set[str]:
    found = set()
    for template in GX_TEMPLATES.rglob("*"):
        if template.is_file():
            found |= {
                u for u in ASSET_URL.findall(template.read_text(errors="replace")) if "greatexpectations.io" not in u
            }
    return found


def test_every_cdn_asset_of_the_installed_gx_is_vendored() -> None:
    urls = gx_asset_urls()
    assert len(urls) >= 10, urls  # the templates are where we look for them
    assert urls <= set(vendor.URLS), sorted(urls - set(vendor.URLS))
    assert {key for key, _ in vendor.URLS.values()} == set(vendor.PACKAGES)


def test_a_page_is_rewritten_to_the_vendored_copies() -> None:
    page = (
        '<link href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css" rel="stylesheet">'
        "<script src='https://cdn.jsdelivr.net/npm/vega-lite@5'></script>"
        '<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>'
        '<a href="https://greatexpectations.io">GX</a>'
    )
    rewritten = vendor.rewrite_html(page, "/tidewater/vendor")
    assert '"/tidewater/vendor/bootstrap@4.3.1/dist/css/bootstrap.min.css"' in rewritten
    assert "'/tidewater/vendor/vega-lite@5.23.0/build/vega-lite.min.js'" in rewritten
    assert '"/tidewater/vendor/vega@5.33.1/build/vega.min.js"' in rewritten  # not vega-lite's prefix
    assert "https://greatexpectations.io" in rewritten  # a plain link stays
    assert "cdn" not in rewritten.replace("greatexpectations.io", "")


def test_only_vendored_files_are_served(tmp_path: Path) -> None:
    css = tmp_path / "bootstrap@4.3.1" / "dist" / "css" / "bootstrap.min.css"
    css.parent.mkdir(parents=True)
    css.write_text("body{}")
    font = tmp_path / "@fortawesome/fontawesome-free@6.6.0" / "webfonts" / "fa-solid-900.woff2"
    font.parent.mkdir(parents=True)
    font.write_bytes(b"font")
    (tmp_path / "bootstrap@4.3.1" / "package.json").write_text("{}")
    assert vendor.local_path("bootstrap@4.3.1/dist/css/bootstrap.min.css", tmp_path) == css
    assert vendor.local_path("@fortawesome/fontawesome-free@6.6.0/webfonts/fa-solid-900.woff2", tmp_path) == font
    for refused in (
        "bootstrap@4.3.1/package.json",  # in the package, but not a file the pages use
        "bootstrap@4.3.1/../bootstrap@4.3.1/dist/css/bootstrap.min.css",
        "bootstrap@9.9.9/dist/css/bootstrap.min.css",
        "/etc/passwd",
        "jquery@3.7.1/dist/jquery.min.js",  # known, but not unpacked here
    ):
        assert vendor.local_path(refused, tmp_path) is None, refused


def _tarball(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return path


def test_a_tarball_is_checked_against_its_pinned_digest_and_must_hold_the_files(tmp_path: Path) -> None:
    import base64
    import hashlib

    package = vendor.PACKAGES["jquery@3.7.1"]
    forged = _tarball(tmp_path / "forged.tgz", {"dist/jquery.min.js": b"alert('not jquery')"})
    with pytest.raises(ConfigError, match="not the pinned"):
        vendor.unpack(package, forged, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    def pinned_to(tarball: Path) -> vendor.Package:
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        return vendor.Package(package.name, package.version, digest)

    empty = _tarball(tmp_path / "empty.tgz", {"README.md": b"x"})
    with pytest.raises(ConfigError, match=r"has no dist/jquery\.min\.js"):
        vendor.unpack(pinned_to(empty), empty, tmp_path / "out")
    good = _tarball(tmp_path / "good.tgz", {"dist/jquery.min.js": b"/* jquery */", "src/core.js": b"x"})
    vendor.unpack(pinned_to(good), good, tmp_path / "out")
    assert (tmp_path / "out" / "dist" / "jquery.min.js").read_bytes() == b"/* jquery */"
    assert not (tmp_path / "out" / "src").exists()  # only what the pages use
    assert (tmp_path / "out" / vendor.COMPLETE).exists()
