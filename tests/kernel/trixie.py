"""Debian trixie's NVIDIA 550.163.01 sources for the kernel tier, from a private trixie index.

Debian splits one version's kernel sources in two: `nvidia-kernel-source` (non-free, the
proprietary tree) and `nvidia-open-kernel-source` (contrib, the open tree). Downloaded
(never installed) and cached under the tier's `kernel-debs/` like every other .deb.
"""

from __future__ import annotations

from pathlib import Path

from .assets import NONFREE_COMPONENTS, Apt, AssetError, cache_root, ensure_debs


class TrixieApt(Apt):
    """A second private index for Debian trixie (NVIDIA 550's non-free and contrib sources)."""

    def stanzas(self) -> list[dict[str, str]]:
        return [{"Types": "deb", "URIs": "http://deb.debian.org/debian", "Suites": "trixie",
                 "Components": NONFREE_COMPONENTS,
                 "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"}]


def trixie_source_debs(version: str = "550.163.01") -> dict[str, Path]:
    """Trixie's nvidia-kernel-source and nvidia-open-kernel-source .debs of one version."""
    root = cache_root() / "apt-trixie"
    root.mkdir(parents=True, exist_ok=True)
    a = TrixieApt(root)
    out = {}
    for name in ("nvidia-kernel-source", "nvidia-open-kernel-source"):
        matching = [v for v in a.versions(name) if v.startswith(version)]
        if not matching:
            raise AssetError(f"no {name} {version} in Debian trixie")
        out[name] = ensure_debs(f"{name}-{matching[0]}", [f"{name}={matching[0]}"], a)[0]
    return out
