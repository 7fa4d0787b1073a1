"""Fabric Manager's config with NVIDIA's `NVFM_CONFIG_<FIELD>=value` overrides applied.

The staged config (`fabricmanager.cfg`: `KEY=VALUE` lines, `#` comments) is never edited;
the agent writes a copy with the overrides into its own work area and starts Fabric Manager
on that copy. A name the staged file does not have, or a value that could break the file's
line format, is refused when the agent starts (exit 2), before any daemon runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from installer.errors import ConfigError

PREFIX = "NVFM_CONFIG_"
_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_VALUE = re.compile(r"[A-Za-z0-9_./:,@+=-]{0,256}")
_LINE = re.compile(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*=(.*)")
# The agent supervises Fabric Manager in the foreground: a daemonizing copy would leave it.
FORCED = {"DAEMONIZE": "0"}


def overrides_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Every `NVFM_CONFIG_<FIELD>=value`, checked for shape (names against the file later)."""
    found: dict[str, str] = {}
    for key, value in sorted(environ.items()):
        if not key.startswith(PREFIX):
            continue
        field = key[len(PREFIX):]
        if not _NAME.fullmatch(field):
            raise ConfigError(f"{key} does not name a Fabric Manager field",
                              remedy=f"use {PREFIX}<FIELD> with FIELD in upper case as in "
                                     "fabricmanager.cfg, e.g. NVFM_CONFIG_FABRIC_MODE=0")
        if not _VALUE.fullmatch(value):
            raise ConfigError(f"{key}={value!r} is invalid: a value is at most 256 of "
                              "A-Z a-z 0-9 _ . / : , @ + = -",
                              remedy=f"correct {key}")
        if field in FORCED:
            raise ConfigError(f"{key} is set by the agent itself ({field}={FORCED[field]}: "
                              "it supervises Fabric Manager in the foreground)",
                              remedy=f"remove {key}")
        found[field] = value
    return found


def render(text: str, overrides: Mapping[str, str],
           defaults: Mapping[str, str] | None = None) -> str:
    """The config with each overridden field's value replaced and DAEMONIZE=0; a field the
    file does not have is a ConfigError naming it. `defaults` replace fields the file has
    and no override names (where the package staged Fabric Manager's topology files)."""
    wanted = {**(defaults or {}), **overrides, **FORCED}
    seen: set[str] = set()
    lines = []
    for line in text.splitlines():
        match = _LINE.fullmatch(line)
        if match and match.group(1) in wanted:
            seen.add(match.group(1))
            line = f"{match.group(1)}={wanted[match.group(1)]}"
        lines.append(line)
    unknown = sorted(set(overrides) - seen)
    if unknown:
        raise ConfigError(f"{PREFIX}{unknown[0]}: the staged Fabric Manager config has no "
                          f"field {unknown[0]}",
                          remedy="name a field of fabricmanager.cfg (see NVIDIA's Fabric "
                                 "Manager user guide) or remove the variable")
    lines += [f"{key}={value}" for key, value in FORCED.items() if key not in seen]
    return "\n".join(lines) + "\n"
