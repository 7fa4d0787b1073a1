"""A driver version per node pool from one DaemonSet: DRIVER_VERSION_MAP, resolved at start.

The map is a YAML list (a mounted ConfigMap's file), read in order:

    - selector: {cloud.google.com/gke-nodepool: h200-pool}
      version: "570"
      flavour: open            # optional: else NVIDIA_DRIVER_FLAVOUR
    - selector: {cloud.google.com/gke-nodepool: a100-pool}
      version: 535.261.03

The first rule that applies chooses: the Node's label OVERRIDE_LABEL (one node), then the
first entry whose selector's labels all equal the Node's, then NVIDIA_DRIVER_VERSION. The
Node's labels come from the API (NODE_NAME is required with the map). A map that is not
a list of such entries (unknown key, bad version or flavour, empty or invalid selector) is
a ConfigError naming the entry, raised before anything is written. The chosen version
replaces the setting for the whole run, so everything downstream (the fast path, fetch,
the live upgrade when another driver is loaded) sees one requested version; RULE_LABEL
names the rule on the Node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from installer.compat.nodelabels import (
    VERSION_OVERRIDE as OVERRIDE_LABEL,
)
from installer.compat.nodelabels import (
    VERSION_RULE as RULE_LABEL,
)
from installer.compat.nodelabels import valid_key, valid_value
from installer.config import Config
from installer.config.values import Invalid, parse_driver_version
from installer.context import Context
from installer.errors import ConfigError, UpgradeBlockedError
from installer.node.documents import quote, read_yaml
from installer.node.files import read_regular

MAX_BYTES = 256 * 1024
MAX_ENTRIES = 1000
_KEYS = frozenset({"selector", "version", "flavour"})
_FLAVOURS = ("auto", "open", "proprietary")
_REMEDY = ("fix DRIVER_VERSION_MAP's file: a YAML list of entries, each {selector: {label "
           "key: value, ...}, version: a branch like '570' or a version like '570.195.03', "
           "flavour: open|proprietary|auto (optional)}")

__all__ = ["OVERRIDE_LABEL", "RULE_LABEL", "Choice", "Entry", "apply", "parse", "resolve"]


@dataclass(frozen=True)
class Entry:
    """One line of the map: labels that must all match, and what they choose."""

    number: int  # 1-based, in file order
    selector: tuple[tuple[str, str], ...]
    version: str
    flavour: str | None

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.selector)

    def describe(self) -> str:
        pairs = ",".join(f"{k}={v}" for k, v in self.selector)
        return f"DRIVER_VERSION_MAP entry {self.number} ({pairs})"


@dataclass(frozen=True)
class Choice:
    """The version this run installs and the rule that chose it."""

    version: str
    flavour: str
    rule: str  # "label", "map-<n>" or "setting": RULE_LABEL's value
    reason: str  # the rule in words, for `status`, `versions` and the log

    def to_dict(self) -> dict[str, str]:
        return {"version": self.version, "flavour": self.flavour, "rule": self.rule,
                "reason": self.reason}


def parse(data: bytes | str, name: str = "DRIVER_VERSION_MAP") -> tuple[Entry, ...]:
    """The entries of a map file, or ConfigError naming the entry and what is wrong."""
    import yaml  # type: ignore[import-untyped]

    try:
        documents = read_yaml(data, name=name, error=ConfigError)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:  # read_yaml's
        where = " ".join(str(exc).split())[:200]
        raise ConfigError(f"{name} is not valid YAML: {where}", remedy=_REMEDY) from None
    if len(documents) > 1:
        raise ConfigError(f"{name} holds {len(documents)} YAML documents, not one list",
                          remedy=_REMEDY)
    items = documents[0] if documents else []
    if not isinstance(items, list):
        raise ConfigError(f"{name} is a {type(items).__name__}, not a list of entries",
                          remedy=_REMEDY)
    if len(items) > MAX_ENTRIES:
        raise ConfigError(f"{name} has {len(items)} entries, more than {MAX_ENTRIES}",
                          remedy=_REMEDY)
    return tuple(_entry(item, number, name) for number, item in enumerate(items, 1))


def _entry(item: Any, number: int, name: str) -> Entry:
    where = f"{name} entry {number}"
    if not isinstance(item, dict):
        raise _bad(where, f"is {quote(item, 40)}, not a mapping")
    unknown = sorted(str(k) for k in item if k not in _KEYS)
    if unknown:
        raise _bad(where, f"has unknown key {quote(unknown[0], 60)} (known: flavour, "
                   "selector, version)")
    selector = item.get("selector")
    if not isinstance(selector, dict) or not selector:
        raise _bad(where, "has an empty or missing selector (it would match every node)")
    pairs = []
    for key, value in selector.items():
        if not isinstance(key, str) or not valid_key(key):
            raise _bad(where, f"selector key {quote(key, 60)} is not a label key")
        if not isinstance(value, str | int) or isinstance(value, bool) or not valid_value(
                str(value)):
            raise _bad(where, f"selector value {quote(value, 60)} of {key} is not a label "
                       "value (quote numbers and booleans)")
        pairs.append((key, str(value)))
    return Entry(number, tuple(pairs), _version(item.get("version"), where),
                 _flavour(item.get("flavour"), where))


def _version(value: Any, where: str) -> str:
    if value is None:
        raise _bad(where, "has no version")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _bad(where, f"version {quote(value, 40)} is not a branch or version (quote it)")
    try:
        return parse_driver_version(str(value))
    except Invalid:
        raise _bad(where, f"version {quote(value, 40)} is not 'default', 'latest', a "
                   "branch like '570' or a version like '570.195.03'") from None


def _flavour(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if value not in _FLAVOURS:
        raise _bad(where, f"flavour {quote(value, 40)} is not one of {', '.join(_FLAVOURS)}")
    return str(value)


def _bad(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where} {problem}", remedy=_REMEDY)


def read(path: Path) -> tuple[Entry, ...]:
    """The map file's entries; a missing, unreadable or oversized file is a ConfigError."""
    data = read_regular(path, MAX_BYTES, error=ConfigError,
                        name=f"DRIVER_VERSION_MAP {path}",
                        remedy="mount the ConfigMap's file there, or unset DRIVER_VERSION_MAP")
    if data is None:
        raise ConfigError(f"DRIVER_VERSION_MAP {path} does not exist",
                          remedy="mount the ConfigMap's file there, or unset "
                                 "DRIVER_VERSION_MAP")
    return parse(data)


def resolve(config: Config, entries: tuple[Entry, ...], labels: dict[str, str]) -> Choice:
    """The first rule that applies: the override label, the map in file order, the setting."""
    override = labels.get(OVERRIDE_LABEL)
    if override is not None:
        try:
            version = parse_driver_version(override)
        except Invalid:
            raise ConfigError(f"node label {OVERRIDE_LABEL}={override[:64]!r} is not a branch "
                              "or version", remedy=f"kubectl label node {config.node_name} "
                              f"{OVERRIDE_LABEL}=<570 or 570.195.03> --overwrite") from None
        return Choice(version, config.flavour, "label", f"node label {OVERRIDE_LABEL}")
    for entry in entries:
        if entry.matches(labels):
            return Choice(entry.version, entry.flavour or config.flavour,
                          f"map-{entry.number}", entry.describe())
    return Choice(config.driver_version, config.flavour, "setting",
                  "NVIDIA_DRIVER_VERSION (no map entry matched)" if entries or
                  config.driver_version_map else "NVIDIA_DRIVER_VERSION")


def choose(config: Config) -> Choice:
    """Read the map and the Node's labels and resolve; the setting alone without a map
    (no API call)."""
    if config.driver_version_map is None:
        return resolve(config, (), {})
    entries = read(config.driver_version_map)  # a bad map: refused before the API is asked
    from installer.node import kube  # the API client (http.client): only with a map

    node = config.node_name
    api = kube.connect(config, os.environ)
    if node is None or api is None:
        raise ConfigError("DRIVER_VERSION_MAP needs the Kubernetes API to read the Node's "
                          "labels, and there is no API server URL or service-account token",
                          remedy="run in the cluster (or set KUBE_API_URL and the service "
                                 "account), or unset DRIVER_VERSION_MAP")
    try:
        labels, _ = kube.node_metadata(api, node)
    except kube.KubeError as exc:
        raise UpgradeBlockedError(
            f"DRIVER_VERSION_MAP: the labels of node {node} could not be read, so its "
            f"driver version is unknown: {exc}", remedy="check the API server and the "
            "installer's RBAC (nodes get); the next run tries again") from None
    return resolve(config, entries, labels)


def apply(ctx: Context) -> Choice:
    """Resolve and make the choice this run's NVIDIA_DRIVER_VERSION/FLAVOUR."""
    choice = choose(ctx.config)
    if ctx.config.driver_version_map is not None:
        ctx.log.info("driver version chosen", version=choice.version, flavour=choice.flavour,
                     rule=choice.reason)
    ctx.config = replace(ctx.config, driver_version=choice.version, flavour=choice.flavour)
    return choice


def label(ctx: Context, choice: Choice) -> None:
    """RULE_LABEL on the Node, when the map is in use; a failure is a warning."""
    from installer.node import kube

    node = ctx.config.node_name
    api = kube.connect(ctx.config, os.environ) if node else None
    if ctx.config.driver_version_map is None or node is None or api is None:
        return
    try:
        kube.patch_node_labels(api, node, {RULE_LABEL: choice.rule})
    except kube.KubeError as exc:
        ctx.log.warning("version rule not labelled", detail=str(exc))
