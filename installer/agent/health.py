"""GPU health: count Xids per GPU, and put the critical ones on the Node for everyone to see.

A critical Xid (the `XID_CRITICAL` setting: GKE's set by default, 48 always, never one of
NVIDIA's application errors) sets the node condition `gpu-node-installer/XidCriticalError`
to True, Reason `Xid:<codes>` (every critical Xid of this boot), Message this boot's ID, and
posts a Warning Event `XIDError` per GPU, naming it and the driver's words (a GPU hitting a
Xid the condition already lists gets its own Event too, where the caller keeps the set of
GPU:Xid pairs announced this boot, as the agent does in its work area): GKE's device plugin
does the same under the plain type `XidCriticalError`, which we leave to it. A broken GPU
stays broken until the node reboots, so the condition clears only when its boot ID is not
the current one (`clear_after_reboot`, at the agent's start); an agent restart never clears
it. The kernel log is read from its start, so a restarted agent sees the same Xids again:
the condition already lists them and nothing is written twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from installer.agent.xids import Xid as Xid
from installer.agent.xids import XidSource as XidSource
from installer.agent.xids import open_xid_source as open_xid_source
from installer.config import Config
from installer.config.health import ALWAYS_CRITICAL, APPLICATION_XIDS
from installer.node import kube

CONDITION = f"{kube.COMPONENT}/XidCriticalError"
EVENT_REASON = "XIDError"
CLEARED_REASON = "XidCriticalErrorCleared"
_REASON_PREFIX = "Xid:"
MAX_SERIES = 1024  # (GPU, Xid) pairs counted; the sources name real GPUs, this caps the rest


def critical_set(config: Config) -> frozenset[int]:
    """The Xids that make a GPU broken: the setting, 48 always, application errors never."""
    return (frozenset(config.xid_critical) | {ALWAYS_CRITICAL}) - APPLICATION_XIDS


class Health:
    """Xid counts per GPU since the agent started, and which critical ones are new.

    Memory is bounded: at most `MAX_SERIES` (GPU, Xid) pairs are counted (one metric series
    each); an Xid of a further pair is only added to `dropped`.
    """

    def __init__(self, critical: Iterable[int]) -> None:
        self.critical = frozenset(critical) - APPLICATION_XIDS
        self.counts: dict[str, Counter[int]] = {}
        self.last: dict[str, int] = {}  # GPU -> the Xid it had last (one entry per GPU)
        self.unreported: list[Xid] = []  # critical, not yet on the Node (API down)
        self._unreported_lock = threading.Lock()  # the API writer thread removes from it
        self.dropped = 0  # Xids of pairs past MAX_SERIES
        self._seen: set[tuple[str, int]] = set()
        self._series = 0

    def observe(self, xids: list[Xid]) -> list[Xid]:
        """Count every Xid; return the critical ones not seen before on that GPU."""
        new: list[Xid] = []
        for xid in xids:
            self._count(xid)
            key = (xid.gpu, xid.code)
            if xid.code in self.critical and key not in self._seen:
                self._seen.add(key)
                new.append(xid)
        return new

    def add_unreported(self, xids: list[Xid]) -> list[Xid]:
        """Keep `xids` until they are on the Node; all kept so far, as a copy."""
        with self._unreported_lock:
            self.unreported += xids
            return list(self.unreported)

    def reported(self, xids: list[Xid]) -> None:
        """These are on the Node now (called from the thread that wrote them)."""
        with self._unreported_lock:
            self.unreported = [xid for xid in self.unreported if xid not in xids]

    def _count(self, xid: Xid) -> None:
        """Count one Xid, unless its (GPU, Xid) pair is new and the cap is reached."""
        self.last[xid.gpu] = xid.code
        counts = self.counts.get(xid.gpu)
        if counts is None or xid.code not in counts:
            if self._series >= MAX_SERIES:
                self.dropped += 1
                return
            self._series += 1
        self.counts.setdefault(xid.gpu, Counter())[xid.code] += 1

    def summary(self) -> str:
        """One line: `0000:3b:00 Xid 13 x1, Xid 79 x2; ...` ("no Xid" when none)."""
        parts = [f"{gpu} " + ", ".join(f"Xid {code} x{count}"
                                       for code, count in sorted(counts.items()))
                 for gpu, counts in sorted(self.counts.items())]
        return "; ".join(parts) or "no Xid"


def condition_codes(condition: dict[str, Any] | None) -> set[int]:
    """The Xids our condition's Reason lists (`Xid:48,79`)."""
    reason = str((condition or {}).get("reason") or "")
    if not reason.startswith(_REASON_PREFIX):
        return set()
    items = reason.removeprefix(_REASON_PREFIX).split(",")
    return {int(item) for item in items if item.isascii() and item.isdigit()}


def our_condition(api: kube.ApiServer, node: str) -> dict[str, Any] | None:
    """Our XidCriticalError condition on the Node, if it has one."""
    return next((c for c in kube.node_conditions(api, node) if c.get("type") == CONDITION),
                None)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def report_critical(api: kube.ApiServer | None, node: str, xids: list[Xid],
                    boot_id: str, announced: set[str] | None = None) -> None:
    """Set the condition (this boot's critical Xids) and post a Warning Event per GPU: for
    the GPU:Xid pairs not in `announced` (added to it once posted), or without it for the
    Xids the condition did not list yet. KubeError as is."""
    if api is None or not node or not xids:
        return
    current = our_condition(api, node)
    same_boot = (current is not None and current.get("status") == "True"
                 and current.get("message") == boot_id)
    known = condition_codes(current) if same_boot else set()
    new = [xid for xid in xids if xid.code not in known]
    told = new if announced is None else [x for x in xids if _pair(x) not in announced]
    if new:
        _set_condition(api, node, current, known | {xid.code for xid in new}, boot_id,
                       same_boot)
    for gpu in dict.fromkeys(xid.gpu for xid in told):  # one Event per GPU, in order
        mine = [xid for xid in told if xid.gpu == gpu]
        kube.post_node_event(api, node, reason=EVENT_REASON, event_type="Warning",
                             message="; ".join(_describe(xid) for xid in mine)
                             + f" (boot {boot_id or 'unknown'})")
        if announced is not None:
            announced.update(_pair(xid) for xid in mine)


def _pair(xid: Xid) -> str:
    return f"{xid.gpu}:{xid.code}"


def _set_condition(api: kube.ApiServer, node: str, current: dict[str, Any] | None,
                   codes: set[int], boot_id: str, same_boot: bool) -> None:
    now = _now()
    since = str(current.get("lastTransitionTime") or now) if same_boot and current else now
    kube.patch_node_status(api, node, [{
        "type": CONDITION, "status": "True",
        "reason": _REASON_PREFIX + ",".join(map(str, sorted(codes))), "message": boot_id,
        "lastHeartbeatTime": now, "lastTransitionTime": since}])


def _describe(xid: Xid) -> str:
    detail = f": {xid.detail}" if xid.detail else ""
    return f"critical Xid {xid.code} on GPU {xid.gpu}{detail}"


def clear_after_reboot(api: kube.ApiServer | None, node: str, boot_id: str) -> bool:
    """Delete our condition when it was set in another boot (the node rebooted since, the
    GPUs were reset). True when it was cleared. KubeError as is."""
    if api is None or not node or not boot_id:
        return False
    current = our_condition(api, node)
    if current is None or current.get("message") == boot_id:
        return False
    kube.patch_node_status(api, node, [{"type": CONDITION, "$patch": "delete"}])
    codes = ",".join(map(str, sorted(condition_codes(current)))) or "none"
    kube.post_node_event(api, node, reason=CLEARED_REASON,
                         message=f"the node rebooted (boot {current.get('message')} -> "
                                 f"{boot_id}): condition {CONDITION} (Xids {codes}) cleared")
    return True


Send = Callable[[str, Callable[[], None]], None]  # queue one API write, never wait


def watch_once(source: XidSource, health: Health, *, api: kube.ApiServer | None,
               node: str | None, boot_id: str, timeout_s: float, log: Any,
               announced: set[str] | None = None, send: Send | None = None) -> list[Xid]:
    """One round: wait up to `timeout_s` for Xids, count them, log them, report the new
    critical ones (kept for the next round when the API fails). Returns those new ones.

    With `send` (the agent's API write queue) the report is queued, covering every Xid not
    yet on the Node, so a hung API server never holds up the round; a queued report left
    unsent is replaced by the next one, which covers the same Xids and more."""
    xids, dropped = source.wait(timeout_s), health.dropped
    for xid in xids:
        log.warning("GPU Xid", gpu=xid.gpu, xid=xid.code, detail=xid.detail,
                    critical=xid.code in health.critical, source=source.kind)
    new = health.observe(xids)
    if health.dropped and not dropped:
        log.error("GPU Xids not counted: too many (GPU, Xid) pairs", limit=MAX_SERIES)
    pending = health.add_unreported(new)
    if not pending:
        return new
    if api is None or node is None:
        log.error("critical GPU Xid: no Kubernetes API to report it to",
                  xids=[xid.code for xid in pending])
        health.reported(pending)
        return new
    if send is not None:
        if new:  # queued once per new Xid; the queue retries it until it is sent
            send("report critical Xids", lambda: _report(api, node, pending, boot_id,
                                                         announced, health))
        return new
    try:
        _report(api, node, pending, boot_id, announced, health)
    except kube.KubeError as exc:
        log.warning("critical Xid not yet on the Node: retried next round", detail=str(exc))
    return new


def _report(api: kube.ApiServer, node: str, xids: list[Xid], boot_id: str,
            announced: set[str] | None, health: Health) -> None:
    report_critical(api, node, xids, boot_id, announced)
    health.reported(xids)
