"""What the agent tells the cluster: the readiness label, a node condition, Events.

Best effort, as the signal stage's labels: a failed call is a logged warning and the next
change tries again; readiness on the node (the files) never waits on the API. Only changes
are sent (the condition and label when the verdict changes, an Event once per cause), so
an idle agent makes no API calls.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from installer.agent import taint
from installer.config import Config

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from installer.node.kube import ApiServer

LABEL_PREFIX = "gpu-node-installer"
STATUS_LABEL = f"{LABEL_PREFIX}/status"
CONDITION = f"{LABEL_PREFIX}/DriverReady"


class Reporter:
    """The node's label, condition and Events, when a node name and the API are known."""

    def __init__(self, config: Config, log: FilteringBoundLogger) -> None:
        self.node, self.config = config.node_name, config
        self.log = log
        self.api: ApiServer | None = None
        if self.node:
            from installer.node import kube  # the API client: only with a node name

            self.api = kube.connect(config, os.environ)
            if self.api is None:
                log.warning("no API server URL or service-account token: the agent reports "
                            "readiness on the node only")
        self._sent_events: set[str] = set()

    def verdict(self, *, ready: bool, reason: str, message: str) -> None:
        """The condition and the status label for a changed verdict."""
        if self.api is None or self.node is None:
            return
        from installer.node import kube

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {"type": CONDITION, "status": "True" if ready else "False",
                     "reason": reason, "message": message[:1024],
                     "lastHeartbeatTime": now, "lastTransitionTime": now}
        self._call("set the node condition", lambda api: kube.patch_node_status(
            api, str(self.node), [condition]))
        label = "ready" if ready else "not-ready"
        self._call("label the node", lambda api: kube.patch_node_labels(
            api, str(self.node), {STATUS_LABEL: label}))
        self._call("update the startup taint", lambda api: taint.on_verdict(
            api, str(self.node), self.config, self.log, ready=ready))

    def event(self, reason: str, message: str, *, warning: bool = True,
              once_key: str | None = None) -> None:
        """Post an Event; with `once_key`, only the first time for that key (until `rearm`)."""
        if self.api is None or self.node is None:
            return
        if once_key is not None:
            if once_key in self._sent_events:
                return
            self._sent_events.add(once_key)
        from installer.node import kube

        self._call("post an Event", lambda api: kube.post_node_event(
            api, str(self.node), reason=reason, message=message,
            event_type="Warning" if warning else "Normal"))

    def rearm(self) -> None:
        """The node is ready again: the next failure of any cause is reported anew."""
        self._sent_events.clear()

    def _call(self, what: str, call: Any) -> None:
        from installer.node import kube

        try:
            call(self.api)
        except kube.KubeError as exc:
            self.log.warning(f"could not {what}", detail=str(exc))
