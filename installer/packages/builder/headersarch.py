"""The arch kernel headers name, read without unpacking them (`package build` without
`--arch`). Kept out of `headers`: the compile cache's key digests the code that shapes a
compile's output, and choosing a default arch is not such code (the arch is in the key)."""

from __future__ import annotations

from pathlib import Path

from installer.node import arches
from installer.packages.builder.headers import _CONFIG_ARCHES
from installer.packages.builder.inputs import deb_control
from installer.packages.builder.rpmheaders import is_rpm, read_header


def headers_arch(paths: tuple[Path, ...]) -> str | None:
    """The arch the given headers name: a .deb's `Architecture`, an RPM's arch, a build
    tree's `.config`; None when none says (tarballs, `all` packages)."""
    for path in paths:
        if path.is_dir():
            config = path / ".config"
            if config.is_file():
                text = config.read_text(errors="replace")
                for line, arch in _CONFIG_ARCHES:
                    if line in text:
                        return arch
        elif path.suffix == ".deb":
            named = arches.canonical(deb_control(path).get("Architecture", ""))
            if named is not None:
                return named
        elif is_rpm(path):
            named = arches.canonical(read_header(path).arch)
            if named is not None:
                return named
    return None
