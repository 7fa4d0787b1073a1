"""What the agent tells the cluster: the readiness label, a node condition, Events.

Best effort, as the signal stage's labels, and never in the readiness loop's way: every
write goes through the bounded queue of `installer.agent.publish`, which coalesces the
condition and the label to the latest verdict and retries a failed write with backoff, so
a hung API server delays nothing on the node. Only changes are sent (the condition and
label when the verdict changes, an Event once per cause; the state once more after a write
went unanswered), so an idle agent makes no calls.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from installer.agent import taint
from installer.agent.publish import ApiQueue
from installer.config import Config

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from installer.agent.nextkernel import Said
    from installer.node.kube import ApiServer

LABEL_PREFIX = "gpu-node-installer"
STATUS_LABEL = f"{LABEL_PREFIX}/status"
CONDITION = f"{LABEL_PREFIX}/DriverReady"
NEXT_KERNEL_LABEL = f"{LABEL_PREFIX}/next-kernel"
NEXT_KERNEL_CONDITION = f"{LABEL_PREFIX}/NextKernelReady"
NEXT_KERNEL_EVENTS = {"ready": "NextKernelReady", "missing": "NextKernelDriverMissing",
                      "building": "NextKernelPreparing", "failed": "NextKernelPrepareFailed"}
STOP_DRAIN_S = 5.0  # a stopping agent's last words: at most this long
WRITE_S = 5.0  # one write, retries included: a hung server frees the writer this soon


def _write_deadline() -> float:
    return time.monotonic() + WRITE_S


class Reporter:
    """The node's label, condition and Events, when a node name and the API are known."""

    def __init__(self, config: Config, log: FilteringBoundLogger) -> None:
        self.node, self.config = config.node_name, config
        self.log = log
        self.api: ApiServer | None = None
        self.queue = ApiQueue(log)
        if self.node:
            from installer.node import kube  # the API client: only with a node name

            self.api = kube.connect(config, os.environ)
            if self.api is None:
                log.warning("no API server URL or service-account token: the agent reports "
                            "readiness on the node only")
        self._sent_events: set[str] = set()

    def verdict(self, *, ready: bool, reason: str, message: str) -> None:
        """Queue the condition and the status label for a changed verdict (each replaces
        a queued one of its kind: only the latest verdict is ever sent)."""
        api, node = self.api, self.node
        if api is None or node is None:
            return
        from installer.node import kube

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {"type": CONDITION, "status": "True" if ready else "False",
                     "reason": reason, "message": message[:1024],
                     "lastHeartbeatTime": now, "lastTransitionTime": now}
        label = "ready" if ready else "not-ready"
        self.queue.put("condition", "set the node condition",
                       lambda: kube.patch_node_status(api, node, [condition],
                                                      deadline=_write_deadline()))
        self.queue.put("label", "label the node",
                       lambda: kube.patch_node_labels(api, node, {STATUS_LABEL: label},
                                                      deadline=_write_deadline()))
        self.queue.put("taint", "update the startup taint", lambda: taint.on_verdict(
            api, node, self.config, self.log, ready=ready))

    def next_kernel(self, said: Said | None) -> None:
        """Queue the next kernel's label, condition and an Event for a changed state;
        with none (any more), the label and condition go where the Node has them (read
        first: an agent's first word on a node without them writes nothing)."""
        api, node = self.api, self.node
        if api is None or node is None:
            return
        from installer.node import kube

        if said is None:
            self.queue.put("next-kernel-condition", "clear the node's next kernel",
                           lambda: _clear_next_kernel(api, node))
            self.queue.put("next-kernel-label", "clear the node's next kernel", lambda: None)
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {"type": NEXT_KERNEL_CONDITION,
                     "status": "True" if said.state == "ready" else "False",
                     "reason": said.reason, "message": said.message,
                     "lastHeartbeatTime": now, "lastTransitionTime": now}
        self.event(NEXT_KERNEL_EVENTS[said.state], said.message,
                   warning=said.state in ("missing", "failed"))
        self.queue.put("next-kernel-condition", "set the next kernel's node condition",
                       lambda: kube.patch_node_status(api, node, [condition],
                                                      deadline=_write_deadline()))
        self.queue.put("next-kernel-label", "label the node's next kernel",
                       lambda: kube.patch_node_labels(api, node, {
                           NEXT_KERNEL_LABEL: said.state}, deadline=_write_deadline()))

    def event(self, reason: str, message: str, *, warning: bool = True,
              once_key: str | None = None) -> None:
        """Queue an Event; with `once_key`, only the first time for that key (until
        `rearm`)."""
        api, node = self.api, self.node
        if api is None or node is None:
            return
        if once_key is not None:
            if once_key in self._sent_events:
                return
            self._sent_events.add(once_key)
        from installer.node import kube

        self.queue.event("post an Event", lambda: kube.post_node_event(
            api, node, reason=reason, message=message,
            event_type="Warning" if warning else "Normal", deadline=_write_deadline()))

    def label(self, key: str, value: str) -> None:
        """Queue one node label (the latest value for `key` replaces a queued one)."""
        api, node = self.api, self.node
        if api is None or node is None:
            return
        from installer.node import kube

        self.queue.put(f"label {key}", f"label the node {key}={value}",
                       lambda: kube.patch_node_labels(api, node, {key: value},
                                                      deadline=_write_deadline()))

    def delete_own_pod(self, namespace: str, name: str, uid: str) -> None:
        """Queue this pod's deletion (its UID as the precondition): the DaemonSet replaces it."""
        api = self.api
        if api is None:
            return
        from installer.node import kube

        self.queue.put("own-pod", f"delete this pod {namespace}/{name}", lambda: kube.delete_pod(
            api, namespace, name, uid, None, deadline=_write_deadline()))

    def rearm(self) -> None:
        """The node is ready again: the next failure of any cause is reported anew."""
        self._sent_events.clear()

    def close(self, timeout_s: float = STOP_DRAIN_S) -> None:
        """Send what is queued, for at most `timeout_s` (the agent is stopping)."""
        if not self.queue.close(timeout_s):
            self.log.warning("API writes left unsent at stop", pending=self.queue.pending())


def _clear_next_kernel(api: ApiServer, node: str) -> None:
    """Remove our next-kernel label and condition where the Node has them (none: no write)."""
    from installer.node import kube

    current = kube.get_node(api, node, deadline=_write_deadline())
    metadata, status = current.get("metadata"), current.get("status")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if isinstance(labels, dict) and NEXT_KERNEL_LABEL in labels:
        kube.patch_node(api, node, {"metadata": {"labels": {NEXT_KERNEL_LABEL: None}}},
                        deadline=_write_deadline())
    if isinstance(conditions, list) and any(
            isinstance(c, dict) and c.get("type") == NEXT_KERNEL_CONDITION for c in conditions):
        kube.patch_node_status(api, node, [{"type": NEXT_KERNEL_CONDITION, "$patch": "delete"}],
                               deadline=_write_deadline())
