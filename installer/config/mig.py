"""The settings of MIG partitioning: where the wanted layout comes from, how the
labels name the slices, and what a mode change that needs a reboot may do.

The layout itself is read by the partition stage (GKE's gpu_config.json on the node, a
mig-parted file, or one profile for every GPU); these parsers only check the settings'
shape, before any I/O. The settings are rows of the one table in `installer.config`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from installer.config.readers import MIG, SIGNALLING
from installer.config.values import Invalid, abs_path, choice, int_range

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


@dataclass(frozen=True)
class MigSettings:
    """The MIG fields of `installer.config.Config` (its base: one room per subsystem)."""

    mig_config_file: Path | None = None
    mig_config: str | None = None
    mig_profile: str | None = None
    mig_strategy: str = "single"
    mig_reboot: str = "refuse"
    mig_reboot_limit: int = 1


# Rows of the one SETTINGS table (`installer.config.Setting`'s fields, in order)
ROWS = (
    ("mig_config_file", "--mig-config-file", "MIG_CONFIG_FILE", None,
     "a mig-parted config file (version: v1, mig-configs) to partition the GPUs by; "
     "GKE's /etc/nvidia/gpu_config.json on the node wins", "an absolute path", abs_path, MIG),
    ("mig_config", "--mig-config", "MIG_CONFIG", None,
     "which config of --mig-config-file applies (default: the node's nvidia.com/mig.config "
     "label)", "a config name of that file", config_name, MIG),
    ("mig_profile", "--mig-profile", "MIG_PROFILE", None,
     "partition every GPU into as many instances of this MIG profile as fit (when neither "
     "gpu_config.json nor --mig-config-file is there)", "a MIG profile name like 1g.10gb",
     profile, MIG),
    ("mig_strategy", "--mig-strategy", "MIG_STRATEGY", "single",
     "how the GPU labels name MIG slices (gpu-feature-discovery's strategies): single "
     "(gpu.product=<model>-MIG-<profile>) or mixed (mig-<profile>.count)",
     "one of single, mixed", choice(*STRATEGIES), MIG | SIGNALLING),
    ("mig_reboot", "--mig-reboot", "MIG_REBOOT", "refuse",
     "when a MIG mode change waits for a node reboot (a GPU reset did not apply it): "
     "refuse (exit 15) or reboot the node", "one of refuse, reboot", choice(*REBOOT), MIG),
    ("mig_reboot_limit", "--mig-reboot-limit", "MIG_REBOOT_LIMIT", "1",
     "MIG_REBOOT=reboot: the most reboot signals sent in one boot (counted per boot ID in "
     "the install dir); a mode still pending after a reboot is `failed`, never rebooted "
     "again", "an integer from 1 to 10", int_range(1, 10), MIG),
)
