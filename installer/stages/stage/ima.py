"""Firmware signatures set as `security.ima` while a version directory is built.

COS appraises GSP firmware with IMA: the kernel refuses a firmware file whose
`security.ima` attribute does not carry a signature by Google's key. The package carries
the signatures (manifest `ima`); they are set on the staged files before the version is
switched to, so a node never sees firmware without its signature. A hard-linked file shares
the attribute with its cache blob, whose bytes stay as verified.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from installer.errors import StagingError
from installer.installdir.layout import Placed, destination
from installer.packages.ima import XATTR


class ImaLike(Protocol):
    """installer.packages.ima.ImaEntry."""

    @property
    def file(self) -> str: ...
    @property
    def signature(self) -> bytes: ...


def set_signatures(tmp: Path, files: tuple[Placed, ...], signatures: tuple[ImaLike, ...]
                   ) -> None:
    """Set each signature on the staged copy of its firmware file under `tmp`."""
    by_path = {entry.path: entry for entry in files}
    for signature in signatures:
        staged = destination(by_path[signature.file])
        try:
            os.setxattr(tmp / staged, XATTR, signature.signature, follow_symlinks=False)
        except OSError as exc:
            raise StagingError(
                f"cannot set {XATTR} on {staged}: {exc.strerror or exc}",
                remedy="the install dir's filesystem must keep security.* extended attributes "
                       "(COS's stateful partition does) and the installer needs CAP_SYS_ADMIN "
                       "(privileged)") from None
