"""The settings of a driver upgrade on a live node: policy, timeout, grace period, DaemonSets.

`refuse` (the default) keeps the old behaviour: a driver in use is never replaced. `evict`
and `drain` free the GPUs through the Kubernetes API first (docs/deploy.md, the upgrade
runbook), so they need this node's name; that is checked with the rest, before any I/O.
The settings themselves are rows of the one table in `installer.config`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

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


def check(config: Config) -> None:
    """Evicting needs the Kubernetes API, so the node must be named."""
    if config.upgrade_policy != "refuse" and not config.node_name:
        raise ConfigError(f"UPGRADE_POLICY={config.upgrade_policy} needs this node's name",
                          remedy="set NODE_NAME (the downward API's spec.nodeName) or "
                                 "--node-name, or use UPGRADE_POLICY=refuse")
