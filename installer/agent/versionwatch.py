"""The per-pool driver map (DRIVER_VERSION_MAP), watched while the agent runs.

The install resolves the map once, at its start. The kubelet rewrites a mounted ConfigMap's
file in place (within its sync period, about a minute; not for a `subPath` mount), and a
node's override label can change at any time: without a watch, a changed entry reaches a
node only when its pod restarts. So every CHECK_S the agent resolves the map again, with
the install's own code (`choose`, handed in by the CLI: the agent does not import the
upgrade room), and compares the choice with what the running install was asked for (the
install state's requested version and flavour). On a change, once per new choice:

- an Event `DriverVersionChanged` names both choices and the rule;
- under UPGRADE_POLICY=refuse the node is labelled `upgrade-state=upgrade-required` and
  the agent goes on serving (daemons and readiness stay, nothing on the node changes): the
  operator frees the GPUs and restarts the pod, as for a changed NVIDIA_DRIVER_VERSION;
- under any other policy the agent deletes its own pod (POD_NAME, POD_NAMESPACE and POD_UID
  from the downward API, with a UID precondition), so the DaemonSet makes a new one whose
  install runs the live upgrade within the pool's Lease limit, as any rollout does.

A map that cannot be read or applied is logged once per message and changes nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from installer.compat.nodelabels import UPGRADE_STATE
from installer.config import Config
from installer.errors import InstallerError
from installer.installdir.state import read_state

if TYPE_CHECKING:
    from pathlib import Path

    from installer.agent.report import Reporter

CHECK_S = 60.0  # the kubelet's ConfigMap sync period: checking more often finds nothing sooner
REQUIRED = "upgrade-required"
POD_ENV = ("POD_NAMESPACE", "POD_NAME", "POD_UID")  # the downward API's, in the DaemonSet


class Choice(Protocol):
    """What the map chooses (upgrade.versionmap.Choice has these)."""

    version: str
    flavour: str
    reason: str


@dataclass(frozen=True)
class Changed:
    """The map now chooses another driver than the running install was asked for."""

    installed: tuple[str, str]  # (requested version, flavour) of the running install
    wanted: tuple[str, str]
    rule: str

    def describe(self) -> str:
        return (f"the driver version map now chooses {self.wanted[0]} ({self.wanted[1]}) by "
                f"{self.rule}; the running install was asked for {self.installed[0]} "
                f"({self.installed[1]})")


class VersionWatch:
    """Resolves the map every CHECK_S and says each new choice once."""

    def __init__(self, install_root: Path, choose: Callable[[], Choice], log: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.install_root, self.choose, self.log, self.clock = install_root, choose, log, clock
        self.next_check = 0.0
        self.said: tuple[str, str] | None = None  # the last choice acted on
        self.failure = ""  # the last refusal logged

    def check(self) -> Changed | None:
        """A change not yet acted on, when one is due to be looked for."""
        now = self.clock()
        if now < self.next_check:
            return None
        self.next_check = now + CHECK_S
        try:
            choice = self.choose()
            state = read_state(self.install_root)
        except InstallerError as exc:
            if exc.message != self.failure:
                self.log.warning("driver version map not applied", detail=exc.message)
            self.failure = exc.message
            return None
        self.failure = ""
        wanted = (choice.version, choice.flavour)
        if state is None or wanted == self.said:
            return None
        installed = (state.requested_version, state.flavour_requested)
        if wanted == installed:
            self.said = None  # back to what runs: a later change is new again
            return None
        self.said = wanted
        return Changed(installed, wanted, choice.reason)


def act(changed: Changed, config: Config, reporter: Reporter, log: Any,
        environ: Mapping[str, str] = os.environ) -> str:
    """Tell the cluster, then label (refuse) or delete this pod; what was done, in words."""
    log.info("driver version map changed", detail=changed.describe(),
             policy=config.upgrade_policy)
    if config.upgrade_policy == "refuse":
        reporter.event("DriverVersionChanged", f"{changed.describe()}; UPGRADE_POLICY=refuse: "
                       f"labelled {UPGRADE_STATE}={REQUIRED}; free the node's GPUs and "
                       "restart this node's installer pod to upgrade", warning=True)
        reporter.label(UPGRADE_STATE, REQUIRED)
        return "labelled"
    pod = [environ.get("POD_NAMESPACE", ""), environ.get("POD_NAME", ""),
           environ.get("POD_UID", "")]
    if not all(pod):
        reporter.event("DriverVersionChanged", f"{changed.describe()}; this pod does not know "
                       f"its name ({', '.join(POD_ENV)} unset): restart it to upgrade")
        return "told"
    reporter.event("DriverVersionChanged", f"{changed.describe()}; deleting this pod "
                   f"{pod[0]}/{pod[1]} so that its successor's install upgrades the node "
                   f"(UPGRADE_POLICY={config.upgrade_policy})", warning=False)
    reporter.delete_own_pod(*pod)
    return "restarting"
