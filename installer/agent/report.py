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

    from installer.node.kube import ApiServer

LABEL_PREFIX = "gpu-node-installer"
STATUS_LABEL = f"{LABEL_PREFIX}/status"
CONDITION = f"{LABEL_PREFIX}/DriverReady"
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
