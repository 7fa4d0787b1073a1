"""Checks of a whole `Config` that need more than one setting or the filesystem: run once
by `load_config`, after every value parsed, before anything is read or written."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.config import values
from installer.errors import ConfigError

if TYPE_CHECKING:
    from installer.config import Config


def mirrors(config: Config) -> None:
    """Plain http:// lets an index or manifest be altered in transit: opt in explicitly."""
    for url in (*config.mirrors, config.cos_tools_url or "", config.nvidia_runfile_url or ""):
        if url.startswith("http://") and not config.allow_http:
            raise ConfigError(f"mirror {values.shown_url(url)} uses plain http://",
                              remedy="use https:// or pass --allow-http (DRIVER_ALLOW_HTTP=1)")


def roots(config: Config, settings: Mapping[str, Any]) -> None:
    """The host mounts must exist before anything reads them."""
    for name in ("host_root", "proc_root", "sys_root"):
        path: Path = getattr(config, name)
        if not path.is_dir():
            flag = settings[name].flag
            raise ConfigError(f"{flag} {path} does not exist or is not a directory",
                              remedy=f"mount the node's filesystem there or pass {flag}")
