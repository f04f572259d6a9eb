"""The Data Docs' CSS, JavaScript and fonts, vendored from npm, so reports render styled offline.

GX 1.x writes Data Docs pages that load Bootstrap, jQuery, popper.js, Font Awesome, bootstrap-table,
bootstrap-datepicker and Vega from public CDNs; on a closed network a report is bare HTML. Each of
those URLs (:data:`URLS`, checked against GX's installed templates by the unit tests) maps to the same
file of the same version in the npm package that ships it (:data:`PACKAGES`, each pinned to its
tarball's sha512).

``scripts/bootstrap.sh`` runs ``python -m tidewater.ui.vendor install``: per package, ``npm pack``
fetches the tarball from the npm registry, the tarball is checked against the pinned digest, and the
files the pages need are unpacked under ``<venv>/share/tidewater-vendor/<package>@<version>/``. The
plugin serves them at ``/tidewater/vendor/<package>@<version>/<path>`` and, as it serves a report
page, points the page's CDN URLs there (:func:`rewrite_html`), so reports written before the assets
were vendored render styled too.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tidewater.errors import ConfigError


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str  # npm's dist.integrity of the tarball
    extra: tuple[str, ...] = ()  # folders the mapped files refer to (a stylesheet's fonts)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


PACKAGES = {
    p.key: p
    for p in (
        Package(
            "bootstrap",
            "4.3.1",
            "sha512-rXqOmH1VilAt2DyPzluTi2blhk17bO7ef+zLLPlWvG494pDxcM234pJ8wTc/6R40UWizAIIMgxjvxZg5kmsbag==",
        ),
        Package(
            "bootstrap-table",
            "1.19.1",
            "sha512-WvV+l1AI/C+zThaKmfHmi/IuayVNB0qdFyEhFx1jyZhO0oLtNJNANkCR3rvJf6Dkh72dsLElxpE/bzK9seEQLA==",
        ),
        Package(
            "bootstrap-table",
            "1.19.0",
            "sha512-L+USHm3X9FKocx/6yngGu12yF6r6s1Ntuc+hoIK2a2QQJjHw5kcySLiE2HY/9sEaSGAOfPbfQOtBH3uKkcpqEA==",
        ),
        Package(
            "bootstrap-datepicker",
            "1.9.0",
            "sha512-9rYYbaVOheGYxjOr/+bJCmRPihfy+LkLSg4fIFMT9Od8WwWB/MB50w0JO1eBgKUMbb7PFHQD5uAfI3ArAxZRXA==",
        ),
        Package(
            "@forevolve/bootstrap-dark",
            "1.1.0",
            "sha512-A3ucpEpxPoTVO490lZZCfjPXxv832l7mm1IxX3bXyxvgwnPGXDLyh7dWrphXKO8YBAu3EswbBEu3VSW8NRMW3A==",
        ),
        Package(
            "jquery",
            "3.7.1",
            "sha512-m4avr8yL8kmFN8psrbFFFmB/If14iN5o9nw/NgnnM+kybDJpRsAynV2BsfpTYrTRysYUdADVD7CkUUizgkpLfg==",
        ),
        Package(
            "popper.js",
            "1.12.9",
            "sha512-s0EEi9xiSCdqz9lV4IiVH5yIZnDX/U1t0tCjB+0jXx9jW8lrR7kOpVupiUg175ogqVoudpDXHF1p6dKATCHMeg==",
        ),
        Package(
            "@fortawesome/fontawesome-free",
            "6.6.0",
            "sha512-60G28ke/sXdtS9KZCpZSHHkCbdsOGEhIUGlwq6yhY74UpTiToIh8np7A8yphhM4BWsvNFtIvLpi4co+h9Mr9Ow==",
            extra=("webfonts/",),
        ),
        # "vega@5" on the CDN is the newest 5.x: these are the newest of each major as vendored.
        Package(
            "vega",
            "5.33.1",
            "sha512-1fArfVDUqVbb5z8n+/nVQb+VNBzx8svY6CrsyTK4Ujm4yrd9I1auoKxBAPXLCavY1LcrbHUskQbGUP8gXOzyQw==",
        ),
        Package(
            "vega-lite",
            "5.23.0",
            "sha512-l4J6+AWE3DIjvovEoHl2LdtCUkfm4zs8Xxx7INwZEAv+XVb6kR6vIN1gt3t2gN2gs/y4DYTs/RPoTeYAuEg6mA==",
        ),
        Package(
            "vega-embed",
            "6.29.0",
            "sha512-PmlshTLtLFLgWtF/b23T1OwX53AugJ9RZ3qPE2c01VFAbgt3/GSNI/etzA/GzdrkceXFma+FDHNXUppKuM0U6Q==",
        ),
    )
}

_TABLE_FILTER = "dist/extensions/filter-control/bootstrap-table-filter-control"
# A CDN URL in a Data Docs page -> (package key, the same file in the package).
URLS: dict[str, tuple[str, str]] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": (
        "bootstrap@4.3.1",
        "dist/css/bootstrap.min.css",
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": (
        "bootstrap@4.3.1",
        "dist/js/bootstrap.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        "bootstrap-table@1.19.1",
        "dist/bootstrap-table.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        "bootstrap-table@1.19.1",
        "dist/bootstrap-table.min.js",
    ),
    f"https://unpkg.com/bootstrap-table@1.19.1/{_TABLE_FILTER}.min.js": (
        "bootstrap-table@1.19.1",
        f"{_TABLE_FILTER}.min.js",
    ),
    f"https://unpkg.com/bootstrap-table@1.19.0/{_TABLE_FILTER}.css": ("bootstrap-table@1.19.0", f"{_TABLE_FILTER}.css"),
    f"https://unpkg.com/bootstrap-table@1.19.0/{_TABLE_FILTER}.min.css": (
        "bootstrap-table@1.19.0",
        f"{_TABLE_FILTER}.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker@1.9.0",
        "dist/css/bootstrap-datepicker.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker@1.9.0",
        "dist/js/bootstrap-datepicker.min.js",
    ),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        "@forevolve/bootstrap-dark@1.1.0",
        "dist/css/bootstrap-prefers-dark.css",
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": ("jquery@3.7.1", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": (
        "popper.js@1.12.9",
        "dist/umd/popper.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        "@fortawesome/fontawesome-free@6.6.0",
        "css/all.min.css",
    ),
    "https://cdn.jsdelivr.net/npm/vega@5": ("vega@5.33.1", "build/vega.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": ("vega-lite@5.23.0", "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": ("vega-embed@6.29.0", "build/vega-embed.min.js"),
}

COMPLETE = ".complete"  # written last in a package's folder: the unpacking finished


def vendor_dir() -> Path:
    """Where the files are unpacked: beside the venv's other installed data."""
    return Path(sys.prefix) / "share" / "tidewater-vendor"


def _wanted(package: Package) -> tuple[set[str], tuple[str, ...]]:
    files = {path for key, path in URLS.values() if key == package.key}
    return files, package.extra


def installed(package: Package, root: Path | None = None) -> bool:
    return ((root or vendor_dir()) / package.key / COMPLETE).exists()


def install(root: Path | None = None, *, npm: str = "npm", progress: bool = True) -> list[str]:
    """Fetch, check and unpack every package not unpacked yet; the keys unpacked now."""
    root = root or vendor_dir()
    done = []
    for package in PACKAGES.values():
        if installed(package, root):
            continue
        if shutil.which(npm) is None:
            raise ConfigError(f"{npm} not found: install Debian's npm to vendor the Data Docs assets")
        if progress:
            print(f"tidewater: vendoring {package.key} for offline Data Docs", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="tidewater-vendor-") as tmp:
            fetched = subprocess.run(
                [npm, "pack", package.key, "--pack-destination", tmp, "--silent"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            tarballs = list(Path(tmp).glob("*.tgz"))
            if fetched.returncode != 0 or len(tarballs) != 1:
                detail = (fetched.stderr or fetched.stdout).strip().splitlines()[-1:] or ["no tarball"]
                raise ConfigError(f"npm pack {package.key} failed: {detail[0]}")
            unpack(package, tarballs[0], root / package.key)
        done.append(package.key)
    return done


def unpack(package: Package, tarball: Path, dest: Path) -> None:
    """Check ``tarball`` against the pinned digest and unpack the files the pages need into ``dest``."""
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if digest != package.integrity:
        raise ConfigError(f"{package.key}: the tarball's digest is {digest}, not the pinned {package.integrity}")
    files, folders = _wanted(package)
    shutil.rmtree(dest, ignore_errors=True)
    found = set()
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            name = PurePosixPath(member.name)
            relative = PurePosixPath(*name.parts[1:])  # npm packs everything under package/
            text = str(relative)
            if not member.isfile() or ".." in relative.parts or not (text in files or text.startswith(folders)):
                continue
            source = archive.extractfile(member)
            assert source is not None
            target = dest / text
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
            found.add(text)
    if missing := files - found:
        raise ConfigError(f"{package.key} has no {', '.join(sorted(missing))}")
    (dest / COMPLETE).write_text(package.integrity)


def local_path(relative: str, root: Path | None = None) -> Path | None:
    """The vendored file at ``<package>@<version>/<path>``, or None for anything else (no way out)."""
    root = root or vendor_dir()
    for key, package in PACKAGES.items():
        if relative.startswith(key + "/"):
            inner = PurePosixPath(relative.removeprefix(key + "/"))
            if ".." in inner.parts or inner.is_absolute():
                return None
            files, folders = _wanted(package)
            if str(inner) not in files and not str(inner).startswith(folders):
                return None
            path = root / key / inner
            return path if path.is_file() else None
    return None


def rewrite_html(html: str, prefix: str) -> str:
    """``html`` with every known CDN URL pointing at the vendored copy under ``prefix`` (``/tidewater/vendor``)."""
    for url, (key, path) in sorted(URLS.items(), key=lambda item: -len(item[0])):  # longest first
        html = html.replace(f'"{url}"', f'"{prefix}/{key}/{path}"').replace(f"'{url}'", f"'{prefix}/{key}/{path}'")
    return html


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidewater.ui.vendor", description="vendor the Data Docs assets")
    parser.add_argument("command", choices=("install", "check"))
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "check":
        missing = [key for key, package in PACKAGES.items() if not installed(package)]
        print("missing: " + ", ".join(missing) if missing else f"all {len(PACKAGES)} packages in {vendor_dir()}")
        return 1 if missing else 0
    try:
        install(progress=not args.quiet)
    except (ConfigError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"tidewater: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
