"""The settings of a driver upgrade on a live node: policy, timeout, grace period, DaemonSets.

`refuse` (the default) keeps the old behaviour: a driver in use is never replaced. `evict`
and `drain` free the GPUs through the Kubernetes API first (docs/deploy.md, the upgrade
runbook), so they need this node's name; that is checked with the rest, before any I/O.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from installer.config.setting import Setting, boolean, choice
from installer.config.values import Invalid, decimal, integer
from installer.errors import ConfigError

if TYPE_CHECKING:
    from installer.config import Config

POLICIES = ("refuse", "evict", "drain")
MAX_TIMEOUT_S = 86400.0  # a day: beyond that a stuck upgrade is forgotten, not waited for
MAX_GRACE_S = 86400
_PERCENT = re.compile(r"[0-9]{1,3}%")


def timeout(value: str) -> float:
    """Seconds, more than zero and at most a day."""
    number = decimal(value)
    if not 0 < number <= MAX_TIMEOUT_S:
        raise Invalid(value)
    return number


def grace_period(value: str) -> int | None:
    """Whole seconds 0..86400, or `pod` (empty too): the pod's own grace period."""
    if value.strip().lower() in ("", "pod"):
        return None
    number = integer(value)
    if number > MAX_GRACE_S:
        raise Invalid(value)
    return number


def max_unavailable(value: str) -> str:
    """What a DaemonSet's `rollingUpdate.maxUnavailable` takes: a count >= 1 or 1%-100%."""
    text = value.strip()
    if _PERCENT.fullmatch(text):
        if not 1 <= int(text[:-1]) <= 100:
            raise Invalid(value)
        return text
    if integer(text) < 1:
        raise Invalid(value)
    return str(int(text))


SETTINGS: tuple[Setting, ...] = (
    Setting("upgrade_policy", "--upgrade-policy", "UPGRADE_POLICY", "refuse",
            "when another driver version is loaded and in use: refuse (exit 10), evict the "
            "pods holding the GPUs, or drain every non-DaemonSet pod (needs --node-name)",
            "one of refuse, evict, drain", choice(*POLICIES)),
    Setting("upgrade_timeout", "--upgrade-timeout", "UPGRADE_TIMEOUT", "900",
            "seconds allowed to free the GPUs (evictions refused by a PodDisruptionBudget "
            "are retried until then)", "a number of seconds above 0, at most 86400",
            timeout),
    Setting("upgrade_grace_period", "--upgrade-grace-period", "UPGRADE_GRACE_PERIOD", "pod",
            "grace period given to evicted pods", "whole seconds from 0 to 86400, or 'pod' "
            "(each pod's terminationGracePeriodSeconds)", grace_period),
    Setting("upgrade_restart_daemonsets", "--upgrade-restart-daemonsets",
            "UPGRADE_RESTART_DAEMONSETS", "false",
            "delete DaemonSet pods that hold the GPUs (device plugin, exporters) during an "
            "upgrade; otherwise they block it", "true or false", boolean, is_flag=True),
    Setting("upgrade_max_unavailable", "--upgrade-max-unavailable",
            "UPGRADE_MAX_UNAVAILABLE", "1",
            "nodes that may be upgrading at once: the rollout overlay's maxUnavailable; "
            "this node waits while that many others are cordoned for an upgrade",
            "a whole number >= 1 or a percentage from 1% to 100%", max_unavailable),
)


def check(config: Config) -> None:
    """Evicting needs the Kubernetes API, so the node must be named."""
    if config.upgrade_policy != "refuse" and not config.node_name:
        raise ConfigError(f"UPGRADE_POLICY={config.upgrade_policy} needs this node's name",
                          remedy="set NODE_NAME (the downward API's spec.nodeName) or "
                                 "--node-name, or use UPGRADE_POLICY=refuse")
