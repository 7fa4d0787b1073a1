"""Runs inside the guest: the agent's GPU health (Xid) against the real /dev/kmsg, results as JSON.

The test script has already written Xid lines into the guest kernel's real log from user
space (`echo '<3>NVRM: Xid ...' > /dev/kmsg`, as the driver's lines look) before this
starts: the backlog an agent finds at start. The kernel stores them with facility LOG_USER,
so they are forgeries the agent must refuse. The strict fake API (tests/kubefake.py)
listens on the guest's 127.0.0.1 with a Node that still carries our condition from an
earlier boot. Then, as the agent does: clear that condition (the boot ID differs), read the
log from its start (RealHost over the guest's /, /proc, /sys, /dev), wait while a live
forged line is written, report nothing; then a restarted agent re-reads the same log.
Usage: python tests/kernel/health_guest.py OUT.json
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kubefake
from kubefake import Cluster, node_doc

from installer.agent import health
from installer.node import kmsg, kube
from installer.node.host import RealHost, Roots

NODE = "gpu-node-1"
OLD_BOOT = "00000000-1111-2222-3333-444444444444"
LIVE = "<3>NVRM: Xid (PCI:0000:00:05): 79, pid=4242, name=train.py, GPU has fallen off the bus."
WORK = Path("/tmp/gni-health")


class Log:
    """What the agent would log, kept to report."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append({"level": level, "event": event,
                                                          **fields})


def cluster() -> Cluster:
    node = node_doc(NODE)
    node["status"] = {"conditions": [{
        "type": health.CONDITION, "status": "True", "reason": "Xid:48", "message": OLD_BOOT,
        "lastHeartbeatTime": "2026-12-01T00:00:00Z",
        "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
    return Cluster(node_name=NODE, nodes={NODE: node})


def inject_later(line: str, after_s: float) -> threading.Timer:
    """Write one record into the real log while the agent's round waits."""

    def write() -> None:
        with open("/dev/kmsg", "w") as handle:
            handle.write(line + "\n")

    timer = threading.Timer(after_s, write)
    timer.start()
    return timer


def xid_facilities() -> list[int]:
    """The facility the real kernel stored with each `NVRM: Xid` record (read raw)."""
    log = kmsg.Kmsg(Path("/dev/kmsg"))
    try:
        return [r.facility for r in log.wait(0.5) if "NVRM: Xid" in r.message]
    finally:
        log.close()


def main() -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "token").write_text(kubefake.TOKEN + "\n")
    host = RealHost(Roots(Path("/"), Path("/proc"), Path("/sys"), Path("/dev")))
    boot = kmsg.boot_id(host)
    fake, log = cluster(), Log()
    out: dict[str, Any] = {"boot_id": boot, "kmsg_char": host.char_device(Path("/dev/kmsg"))}
    with kubefake.serve(fake) as url:
        api = kube.ApiServer(url, WORK / "token", None)
        out["cleared"] = health.clear_after_reboot(api, NODE, boot)
        out["after_clear"] = list(kubefake.conditions(fake))
        source = health.open_xid_source(host, use_nvml=False)
        out["source"] = source.kind
        watch = health.Health({48, 79})
        rounds: list[list[list[Any]]] = []
        backlog = health.watch_once(source, watch, api=api, node=NODE, boot_id=boot,
                                    timeout_s=30, log=log)
        rounds.append([[x.gpu, x.code] for x in backlog])
        timer = inject_later(LIVE, 1.0)
        live = health.watch_once(source, watch, api=api, node=NODE, boot_id=boot,
                                 timeout_s=60, log=log)
        timer.join()
        rounds.append([[x.gpu, x.code] for x in live])
        out["rounds"] = rounds
        out["refused"] = dict(getattr(source, "refused", {}))
        out["counts"] = {gpu: dict(c) for gpu, c in watch.counts.items()}
        out["summary"] = watch.summary()
        source.close()
        events_before_restart = len(fake.events)
        again = health.open_xid_source(host, use_nvml=False)  # the agent, restarted
        restarted = health.Health({48, 79})
        out["restart_new"] = [[x.gpu, x.code] for x in health.watch_once(
            again, restarted, api=api, node=NODE, boot_id=boot, timeout_s=5, log=log)]
        out["restart_counts"] = {gpu: dict(c) for gpu, c in restarted.counts.items()}
        out["restart_events"] = len(fake.events) - events_before_restart
        again.close()
        out["facilities"] = xid_facilities()
    out["conditions"] = kubefake.conditions(fake)
    out["events"] = [{k: e[k] for k in ("reason", "type", "message")} for e in fake.events]
    out["errors"] = list(fake.errors)
    out["log"] = log.lines
    return out


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(main(), indent=1))
