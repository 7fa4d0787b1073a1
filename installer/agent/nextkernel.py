"""The next kernel: a kernel installed on the node, newer than the running one, that the
node will boot into; found without busy polling, its driver prepared, its state said.

Where it looks (`installer.node.kernels`): the complete modules trees under /lib/modules,
the boot links (`/vmlinuz`, `/boot/vmlinuz`) and the reboot-required marker. When it looks:
at the first round, whenever inotify reports a change to one of those names (checked each
round on a non-blocking descriptor, never waited on), and every RESCAN_S anyway (SCAN_S
where inotify is unavailable). Releases not newer than the running one (dpkg's ordering,
`kernelorder`) are ignored. The next kernel is the boot default when that is newer, else
the newest newer tree. Each decision about a release, and each refused entry, is logged
once. What it finds is handed to `nextprepare`; what the node is told comes out as `Said`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.agent import kernelorder
from installer.agent.nextprepare import BUILDING, FAILED, MISSING, READY, Outcome, Preparer
from installer.config import Config
from installer.node import inotify, kernels
from installer.node.confine import EscapeError
from installer.node.host import Host

SCAN_S = 60.0  # without inotify: a new kernel is seen within a minute
RESCAN_S = 600.0  # with inotify: a look anyway, for what a watch could not see
MAX_TREE_WATCHES = 32
REASONS = {READY: "DriverReady", MISSING: "DriverMissing", BUILDING: "Preparing",
           FAILED: "PrepareFailed"}


@dataclass(frozen=True)
class Said:
    """The next kernel as the node tells it: label value, condition, Event, metric, view."""

    kernel: str
    state: str  # ready, missing, building, failed
    message: str
    driver: str = ""

    @property
    def reason(self) -> str:
        return REASONS[self.state]

    def to_view(self) -> dict[str, str]:
        return {"kernel": self.kernel, "state": self.state, "reason": self.reason,
                "message": self.message, "driver": self.driver}


def _watch_names(name: str) -> Callable[[str], bool]:
    return lambda entry: entry.startswith(name)


class Detector:
    """Finds the next kernel; `due` says whether to look again this round."""

    def __init__(self, host: Host, log: Any, *, use_inotify: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host, self.log, self.clock = host, log, clock
        self.watcher = inotify.open_watcher() if use_inotify else None
        self.scan_s = RESCAN_S if self.watcher is not None else SCAN_S
        self.looked_at: float | None = None
        self._said: set[tuple[str, ...]] = set()
        self.current: str | None = None
        log.info("next kernel watched", inotify=self.watcher is not None,
                 scan_every_s=self.scan_s)

    def due(self) -> bool:
        """A look is due: the first, a watched name changed, or the scan interval passed."""
        if self.looked_at is None or self.clock() - self.looked_at >= self.scan_s:
            return True
        if self.watcher is None:
            return False
        changes = self.watcher.changed()
        if changes:
            self.log.debug("next kernel: change seen", paths=changes[:8])
        return bool(changes)

    def look(self) -> str | None:
        """The next kernel now (None: none), each decision logged once."""
        self.looked_at = self.clock()
        running = kernels.running_release(self.host)
        found = kernels.look(self.host)
        self._watch(found)
        for refused in found.refused:
            self._once("next kernel: entry ignored", path=refused.what, reason=refused.why)
        if found.reboot_required:
            self._once("next kernel: the node asks for a reboot",
                       marker=str(kernels.REBOOT_REQUIRED), packages=list(found.reboot_packages))
        if running is None:
            self._once("next kernel: the running kernel's release is unreadable",
                       warning=True)
            self.current = None
            return None
        newer = [f for f in (*found.defaults, *found.trees) if self._judge(f, running)]
        default = next((f.release for f in found.defaults if f in newer), None)
        trees = [f.release for f in found.trees if f in newer]
        chosen = default or kernelorder.newest(trees)
        if chosen != self.current:
            self.log.info("next kernel", kernel=chosen, running=running,
                          why="the boot default" if default else
                          "the newest newer modules tree" if chosen else "none newer")
        self.current = chosen
        return chosen

    def _judge(self, found: kernels.Found, running: str) -> bool:
        newer = kernelorder.newer(found.release, running)
        self._once("next kernel: candidate" if newer else "next kernel: ignored",
                   kernel=found.release, seen_in=found.source, running=running,
                   reason="newer than the running kernel" if newer else
                   "the running kernel" if found.release == running else
                   "not newer than the running kernel")
        return newer

    def _once(self, event: str, *, warning: bool = False, **fields: Any) -> None:
        key = (event, *(str(v) for v in fields.values()))
        if key in self._said:
            return
        self._said.add(key)
        (self.log.warning if warning else self.log.info)(event, **fields)

    def _watch(self, found: kernels.Installed) -> None:
        """(Re)add the watches: inotify_add_watch on a watched directory only updates it."""
        if self.watcher is None:
            return
        everything = _watch_names("")
        top = kernels.modules_dir(self.host)
        if top is not None:
            self.watcher.watch(top, everything)
            names = [f.release for f in found.trees] + list(found.incomplete)
            for name in names[:MAX_TREE_WATCHES]:  # depmod's modules.dep lands in there
                self.watcher.watch(top / name, everything)
        for node_dir, prefix in (("/", "vmlinuz"), ("/boot", "vmlinuz"),
                                 ("/var/run", "reboot-required")):
            try:
                self.watcher.watch(self.host.roots.node(node_dir), _watch_names(prefix))
            except EscapeError:
                continue

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()


def describe(kernel: str, state: str, outcome: Outcome | None, requested: str) -> Said:
    """What to say about `kernel` in `state`, from the outcome behind it."""
    driver = outcome.driver_version if outcome and outcome.driver_version else requested
    flavour = f" ({outcome.flavour})" if outcome and outcome.flavour else ""
    if state == READY and outcome is not None:
        message = (f"kernel {kernel}: driver {driver}{flavour} ready in the host cache "
                   f"(from {outcome.source or 'unknown'}, {outcome.digest[:19] or 'no digest'})")
    elif state == MISSING:
        build = outcome.build_command if outcome and outcome.build_command else None
        message = (f"kernel {kernel}: no package of driver {driver}{flavour} in any source; "
                   + (f"build it: {build}" if build else "no build command given"))
    elif state == BUILDING:
        message = f"kernel {kernel}: preparing driver {driver}{flavour}"
    else:
        error = outcome.error if outcome and outcome.error else "unknown error"
        message = f"kernel {kernel}: preparing driver {driver}{flavour} failed: {error}"
    return Said(kernel, state, message[:1024], driver)


class NextKernel:
    """Detection and preparation together; `tick` once per agent round."""

    def __init__(self, config: Config, host: Host, environ: Mapping[str, str], log: Any, *,
                 work: Path, use_inotify: bool = True) -> None:
        self.config = config
        self.detector = Detector(host, log, use_inotify=use_inotify)
        self.preparer = Preparer(config, environ, work, log)
        self.log = log
        self.kernel: str | None = None
        self.said: Said | None = None  # swapped whole: the metrics thread reads it
        self.told = False  # the cluster heard this agent's first word (a stale label goes)

    def round(self, now: float, say: Callable[[Said | None], None]) -> bool:
        """`tick`, then `say` what changed (and this agent's first state, whatever an
        earlier boot left on the Node); True when it changed. Never raises: the next
        kernel is a courtesy, never the end of a readiness round."""
        try:
            changed = self.tick(now)
        except Exception as exc:
            self.log.error("next kernel: round failed", detail=repr(exc)[:300])
            return False
        if changed or not self.told:
            say(self.said)
            self.told = True
        return changed

    def tick(self, now: float) -> bool:
        """One round: look when due, advance the preparation; True when what is said
        changed (state or kernel)."""
        if self.detector.due():
            self.kernel = self.detector.look()
        state, outcome = self.preparer.tick(self.kernel, now)
        said = None if self.kernel is None else describe(
            self.kernel, state, outcome, self.config.driver_version)
        changed = (said.kernel, said.state) if said else None
        before = (self.said.kernel, self.said.state) if self.said else None
        self.said = said
        return changed != before

    def close(self) -> None:
        self.preparer.stop()
        self.detector.close()
