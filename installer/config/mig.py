"""The settings of MIG partitioning (issue 26): where the wanted layout comes from, how the
labels name the slices, and what a mode change that needs a reboot may do.

The layout itself is read by the partition stage (GKE's gpu_config.json on the node, a
mig-parted file, or one profile for every GPU); these parsers only check the settings'
shape, before any I/O. The settings are rows of the one table in `installer.config`.
"""

from __future__ import annotations

import re

from installer.config.values import Invalid

STRATEGIES = ("single", "mixed")
REBOOT = ("refuse", "reboot")
# NVIDIA's profile names: <slices>g.<memory>gb, with an optional +me / +gfx / +me.all suffix
_PROFILE = re.compile(r"[1-8]g\.[0-9]{1,3}gb(\+(me|gfx|me\.all))?")
# a mig-parted config name is a YAML key that also fits a label value
_CONFIG_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def profile(value: str) -> str:
    """One MIG profile name such as `1g.10gb` (empty: none)."""
    text = value.strip()
    if text and not _PROFILE.fullmatch(text):
        raise Invalid(value)
    return text


def config_name(value: str) -> str:
    """The name of one config in a mig-parted file, as its node label would give it."""
    text = value.strip()
    if text and not _CONFIG_NAME.fullmatch(text):
        raise Invalid(value)
    return text
