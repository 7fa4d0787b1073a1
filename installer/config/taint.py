"""The startup taint: a NoSchedule taint node pools register with, which the agent removes
once the node is ready (a GPU pod that lands earlier fails admission or finds no driver).

`key[=value]:Effect`, as `kubectl taint` and kubelet's `--register-with-taints` write it.
The key is a Kubernetes qualified name and the value a label value (the API validates
taints that way); the effect is NoSchedule or PreferNoSchedule. NoExecute is refused: the
agent puts the taint back when readiness is withdrawn (if asked), and a NoExecute taint
would then evict every running pod that does not tolerate it. An empty setting turns the
feature off. Shared by the agent (which owns the taint) and check-pod (which explains it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from installer.config.readers import AGENT
from installer.config.values import Invalid, visible

DEFAULT = "gpu-node-installer/driver-not-ready:NoSchedule"
EFFECTS = ("NoSchedule", "PreferNoSchedule")
ACCEPTED = ("key[=value]:Effect (a Kubernetes taint key, an optional label value, effect "
            "NoSchedule or PreferNoSchedule), or empty for no startup taint")

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
_KEY = re.compile(rf"(?:(?P<prefix>{_PREFIX})/)?{_NAME}", re.ASCII)
_VALUE = re.compile(rf"(?:{_NAME})?", re.ASCII)


@dataclass(frozen=True)
class Taint:
    """One taint as the Node's `spec.taints` holds it (no timeAdded: only NoExecute has it)."""

    key: str
    value: str
    effect: str

    def matches(self, entry: Any) -> bool:
        """Whether a `spec.taints` element is this taint (key and effect identify it,
        as `kubectl taint` and the API's uniqueness check do)."""
        return (isinstance(entry, dict) and entry.get("key") == self.key
                and entry.get("effect") == self.effect)

    def to_api(self) -> dict[str, str]:
        entry = {"key": self.key, "effect": self.effect}
        if self.value:
            entry["value"] = self.value
        return entry

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


def parse(text: str) -> Taint | None:
    """The setting's taint, None when empty (no startup taint); Invalid otherwise."""
    value = visible(text).strip()
    if not value:
        return None
    spec, colon, effect = value.rpartition(":")
    if not colon:
        raise Invalid(text, "no ':Effect' (e.g. ':NoSchedule')")
    if effect == "NoExecute":
        raise Invalid(text, "NoExecute is refused: put back on a node whose readiness is "
                            "withdrawn, it would evict every running pod; use NoSchedule")
    if effect not in EFFECTS:
        raise Invalid(text, f"the effect {effect!r} is not NoSchedule or PreferNoSchedule")
    key, _, taint_value = spec.partition("=")
    match = _KEY.fullmatch(key)
    if match is None or len(match.group("prefix") or "") > 253:
        raise Invalid(text, f"{key!r} is not a taint key (a qualified name: "
                            "[dns-prefix/]name, the name at most 63 characters)")
    if not _VALUE.fullmatch(taint_value):
        raise Invalid(text, f"{taint_value!r} is not a taint value (at most 63 letters, "
                            "digits, '-', '_', '.', starting and ending alphanumeric)")
    return Taint(key, taint_value, effect)


DEFAULT_TAINT = Taint("gpu-node-installer/driver-not-ready", "", "NoSchedule")


def restore(text: str) -> bool:
    """`STARTUP_TAINT_RESTORE`: on or off."""
    value = text.strip()
    if value not in ("on", "off"):
        raise Invalid(text)
    return value == "on"


# rows of config.SETTINGS
ROWS = (
    ("startup_taint", "--startup-taint", "STARTUP_TAINT", DEFAULT,
     "the taint node pools register GPU nodes with; the agent removes it when the node is "
     "ready (empty: none)", ACCEPTED, parse, AGENT),
    ("startup_taint_restore", "--startup-taint-restore", "STARTUP_TAINT_RESTORE", "off",
     "put the startup taint back when the agent withdraws readiness (new pods wait; running "
     "ones stay)", "one of on, off", restore, AGENT),
)
