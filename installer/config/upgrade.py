"""The settings of a driver upgrade on a live node: policy, timeout, grace period, DaemonSets.

`refuse` (the default) keeps the old behaviour: a driver in use is never replaced. `evict`
and `drain` free the GPUs through the Kubernetes API first (docs/evictions.md, the
runbook), so they need this node's name; that is checked with the rest, before any I/O.
The settings themselves are rows of the one table in `installer.config`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from installer.config.readers import RESOLVING, UPGRADE
from installer.config.values import Invalid, abs_path, decimal, integer, ranged
from installer.errors import ConfigError

if TYPE_CHECKING:
    from installer.config import Config

POLICIES = ("refuse", "evict", "drain")
MAX_TIMEOUT_S = 86400.0  # a day: beyond that a stuck upgrade is forgotten, not waited for
MAX_GRACE_S = 86400
_PERCENT = re.compile(r"[0-9]{1,3}%")

# Rows of the SETTINGS table (installer.config): one DaemonSet, a driver per node pool.
MAP_ROWS = (
    ("driver_version_map", "--driver-version-map", "DRIVER_VERSION_MAP", None,
     "file (a mounted ConfigMap) mapping node selectors to a driver version or branch and "
     "optionally a flavour, read at start: the node label "
     "gpu-node-installer/driver-version.override, then the first entry whose selector "
     "matches the Node's labels, then NVIDIA_DRIVER_VERSION (needs --node-name and the API); "
     "the agent resolves it again every 60 s and acts on a change",
     "an absolute path to a YAML list of {selector: {label: value}, version: ..., "
     "flavour: ...} entries", abs_path, RESOLVING | {"agent"}),
)


MAX_JOBS_WAIT_S = 7 * 86400.0
_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_EXACT = re.compile(r"(!?)([^=!<>]+)(?:(==|=|!=|<|>)(.*))?")
_SET = re.compile(r"(\S+)\s+(in|notin)\s*\(([^()]*)\)")
_INTEGER = re.compile(r"[+-]?[0-9]+")
Term = tuple[str, str, tuple[str, ...]]  # key, op (=, !=, in, notin, <, >, exists, !exists), values


def pod_selector(value: str) -> tuple[Term, ...]:
    """A label selector as the API's labelSelector takes it (apimachinery
    pkg/labels/selector.go, Parser and NewRequirement @ eed236ce): `key=value`,
    `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key`, `!key`,
    `key>N`, `key<N`, separated by commas; an empty text selects nothing (no wait)."""
    terms = []
    for raw in (t.strip() for t in _split(value)):
        if raw:
            terms.append(_term(value, raw))
    return tuple(terms)


def _split(value: str) -> list[str]:
    """The terms: the text cut at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(value):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth not in (0, 1):
            raise Invalid(value, "its parentheses do not pair")
        if char == "," and depth == 0:
            parts.append(value[start:at])
            start = at + 1
    if depth:
        raise Invalid(value, "its parentheses do not pair")
    return [*parts, value[start:]]


def _term(value: str, raw: str) -> Term:
    found = _SET.fullmatch(raw)
    if found is not None:
        key, op, inner = found.groups()
        values = tuple(sorted({v.strip() for v in inner.split(",")}))
        if any(not _VALUE.fullmatch(v) or len(v) > 63 for v in values):
            raise Invalid(value, f"{raw!r} is not a selector term")
        return _key(value, key), op, values
    match = _EXACT.fullmatch(raw)
    if match is None:
        raise Invalid(value, f"{raw!r} is not a selector term")
    bang, key, op, text = match.groups()
    if op is None:
        return _key(value, key.strip()), "!exists" if bang else "exists", ()
    text = text.strip()
    wrong = not integer64(text) if op in ("<", ">") else (
        not _VALUE.fullmatch(text) or len(text) > 63)
    if bang or wrong:
        raise Invalid(value, f"{raw!r} is not a selector term")
    return _key(value, key.strip()), "=" if op == "==" else op, (text,)


def integer64(text: str) -> bool:
    """What Go's strconv.ParseInt(text, 10, 64) reads."""
    return (len(text) <= 20 and bool(_INTEGER.fullmatch(text))
            and -(2**63) <= int(text) < 2**63)


def _key(value: str, key: str) -> str:
    if not _KEY.fullmatch(key) or len(key.rpartition("/")[2]) > 63:
        raise Invalid(value, f"{key!r} is not a label key")
    return key


@ranged(0, MAX_JOBS_WAIT_S)
def jobs_timeout(value: str) -> float:
    """Seconds, 0 (no limit of its own) to a week."""
    number = decimal(value)
    if not 0 <= number <= MAX_JOBS_WAIT_S:
        raise Invalid(value)
    return number


# Rows of the SETTINGS table: wait for batch Jobs before the eviction step (operator-libs'
# waitForCompletion: a pod selector and a timeout, 0 for none of its own).
JOB_ROWS = (
    ("upgrade_wait_for_jobs", "--upgrade-wait-for-jobs", "UPGRADE_WAIT_FOR_JOBS", None,
     "pods on this node matching this label selector (batch Jobs) are waited for, not "
     "evicted, after the cordon and before the eviction step, until they are no longer "
     "Running or Pending (state label wait-for-jobs-required)",
     "a label selector: key=value, key!=value, key in (a,b), key notin (a,b), key, !key, "
     "key>N or key<N, separated by commas",
     pod_selector, UPGRADE),
    ("upgrade_wait_for_jobs_timeout", "--upgrade-wait-for-jobs-timeout",
     "UPGRADE_WAIT_FOR_JOBS_TIMEOUT", "0",
     "seconds to wait for the pods of --upgrade-wait-for-jobs; then the eviction step goes "
     "on with them (0: wait as long as they run); not counted in UPGRADE_TIMEOUT",
     "a number of seconds from 0 to 604800", jobs_timeout, UPGRADE),
)

@ranged(0, MAX_TIMEOUT_S, low_open=True)
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
    """Evicting, and choosing by the Node's labels, need the Kubernetes API, so the node
    must be named."""
    if config.driver_version_map is not None and not config.node_name:
        raise ConfigError("DRIVER_VERSION_MAP needs this node's name to read its labels",
                          remedy="set NODE_NAME (the downward API's spec.nodeName) or "
                                 "--node-name, or unset DRIVER_VERSION_MAP")
    if config.upgrade_policy != "refuse" and not config.node_name:
        raise ConfigError(f"UPGRADE_POLICY={config.upgrade_policy} needs this node's name",
                          remedy="set NODE_NAME (the downward API's spec.nodeName) or "
                                 "--node-name, or use UPGRADE_POLICY=refuse")
