"""agent.health's reports on the strict fake API (tests/kubefake.py): the node condition
gpu-node-installer/XidCriticalError and the XIDError Event, cleared after a reboot, and one
watch round from a kernel log (a FIFO at <dev root>/kmsg) to the Node."""

from __future__ import annotations

import os
import time
from pathlib import Path

import kubefake
import kubefronts
import pytest
from healthkit import (
    BOOT,
    NODE,
    REBOOTED,
    XID13,
    XID48_OLD,
    XID79,
    Log,
    StaticSource,
    api_for,
    fake_cluster,
    host_tree,
    record,
)

from installer.agent import health
from installer.agent.health import Health, Xid
from installer.agent.xids import parse_xid
from installer.node import kmsg, kube
from installer.node.host import RealHost


class TestReport:
    def test_the_condition_and_a_warning_event(self, tmp_path: Path) -> None:
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url:
            health.report_critical(api_for(url, tmp_path), NODE, [parse_xid(XID79)], BOOT)
        ours = kubefake.conditions(cluster)[health.CONDITION]
        assert health.CONDITION == "gpu-node-installer/XidCriticalError"
        assert (ours["status"], ours["reason"], ours["message"]) == ("True", "Xid:79", BOOT)
        assert kubefake.conditions(cluster)["Ready"]["reason"] == "KubeletReady"  # untouched
        [event] = cluster.events
        assert (event["reason"], event["type"]) == ("XIDError", "Warning")
        assert event["involvedObject"]["name"] == NODE
        assert event["message"] == ("critical Xid 79 on GPU 0000:3b:00: pid=2211, "
                                    f"name=python3, GPU has fallen off the bus. (boot {BOOT})")
        patch = [c for c in cluster.calls if c.method == "PATCH"]
        assert [c.path for c in patch] == [f"/api/v1/nodes/{NODE}/status"]
        assert cluster.errors == []

    def test_more_xids_in_the_same_boot_join_the_reason(self, tmp_path: Path) -> None:
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url:
            api = api_for(url, tmp_path)
            health.report_critical(api, NODE, [Xid("0000:3b:00", 79, "")], BOOT)
            since = kubefake.conditions(cluster)[health.CONDITION]["lastTransitionTime"]
            time.sleep(1.1)  # a later second, so a moved transition time would show
            health.report_critical(api, NODE, [Xid("0000:86:00", 48, "DBE")], BOOT)
        ours = kubefake.conditions(cluster)[health.CONDITION]
        assert ours["reason"] == "Xid:48,79" and ours["lastTransitionTime"] == since
        assert [e["message"].split(" (boot")[0] for e in cluster.events] == [
            "critical Xid 79 on GPU 0000:3b:00", "critical Xid 48 on GPU 0000:86:00: DBE"]

    def test_xids_the_condition_lists_already_write_nothing(self, tmp_path: Path) -> None:
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url:
            api = api_for(url, tmp_path)
            health.report_critical(api, NODE, [Xid("0000:3b:00", 79, "")], BOOT)
            calls = len(cluster.calls)
            health.report_critical(api, NODE, [Xid("0000:3b:00", 79, "")], BOOT)
            writes = [c.method for c in cluster.calls[calls:]]
        assert writes == ["GET"] and len(cluster.events) == 1

    def test_no_api_or_no_node_name_writes_nothing(self, tmp_path: Path) -> None:
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url:
            api = api_for(url, tmp_path)
            for target, node in ((None, NODE), (api, "")):
                health.report_critical(target, node, [Xid("0000:3b:00", 79, "")], BOOT)
                assert health.clear_after_reboot(target, node, REBOOTED) is False
        assert cluster.calls == []


class TestClearAfterReboot:
    def test_kept_in_the_same_boot_cleared_in_another_with_an_event(self, tmp_path: Path
                                                                      ) -> None:
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url:
            api = api_for(url, tmp_path)
            health.report_critical(api, NODE, [Xid("0000:3b:00", 79, "")], BOOT)
            assert health.clear_after_reboot(api, NODE, BOOT) is False  # an agent restart
            assert kubefake.conditions(cluster)[health.CONDITION]["status"] == "True"
            assert health.clear_after_reboot(api, NODE, REBOOTED) is True
            assert health.clear_after_reboot(api, NODE, REBOOTED) is False  # gone already
        assert set(kubefake.conditions(cluster)) == {"Ready"}
        cleared = cluster.events[-1]
        assert (cleared["reason"], cleared["type"]) == ("XidCriticalErrorCleared", "Normal")
        assert BOOT in cleared["message"] and REBOOTED in cleared["message"]
        assert cluster.errors == []

    def test_the_fake_refuses_a_delete_holding_more_than_the_key(self, tmp_path: Path) -> None:
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url, pytest.raises(kube.KubeError) as refused:
            kube.patch_node_status(api_for(url, tmp_path), NODE, [
                {"type": "Ready", "$patch": "delete", "status": "False"}])
        assert refused.value.status == 400 and len(cluster.errors) == 1
        assert set(kubefake.conditions(cluster)) == {"Ready"}


class TestWatchOnce:
    def test_kmsg_xids_reach_the_node(self, fifo_host: tuple[RealHost, int],
                                      tmp_path: Path) -> None:
        host, writer = fifo_host
        cluster, log = fake_cluster(), Log()
        source, watch = health.open_xid_source(host, use_nvml=False), Health({48, 79})
        os.write(writer, record(1, XID13) + record(2, XID79) + record(3, XID79))
        with kubefake.serve(cluster) as url:
            new = health.watch_once(source, watch, api=api_for(url, tmp_path), node=NODE,
                                    boot_id=kmsg.boot_id(host), timeout_s=5, log=log)
        assert [(x.gpu, x.code) for x in new] == [("0000:3b:00", 79)]
        assert kubefake.conditions(cluster)[health.CONDITION]["message"] == BOOT
        assert [e["reason"] for e in cluster.events] == ["XIDError"]
        assert [(f["xid"], f["critical"]) for _, _, f in log.lines] == [
            (13, False), (79, True), (79, True)]

    def test_an_api_failure_is_retried_next_round(self, tmp_path: Path) -> None:
        cluster, log = fake_cluster(), Log()
        source = StaticSource([Xid("0000:3b:00", 79, "")])
        watch = Health({79})
        dead = api_for("http://127.0.0.1:9", tmp_path)  # nothing listens there
        health.watch_once(source, watch, api=dead, node=NODE, boot_id=BOOT, timeout_s=0,
                          log=log)
        assert watch.unreported and log.lines[-1][1].startswith("critical Xid not yet")
        with kubefake.serve(cluster) as url:
            assert health.watch_once(source, watch, api=api_for(url, tmp_path), node=NODE,
                                     boot_id=BOOT, timeout_s=0, log=log) == []
        assert watch.unreported == [] and len(cluster.events) == 1

    def test_a_restarted_agent_rereading_the_log_reports_nothing_twice(
            self, tmp_path: Path) -> None:
        host = host_tree(tmp_path)
        (tmp_path / "dev/kmsg").write_bytes(record(1, XID79) + record(2, XID48_OLD))
        cluster = fake_cluster()
        with kubefake.serve(cluster) as url:
            for _ in range(2):  # the agent, then the agent restarted in the same boot
                source = health.open_xid_source(host, use_nvml=False)
                health.watch_once(source, Health({48, 79}), api=api_for(url, tmp_path),
                                  node=NODE, boot_id=BOOT, timeout_s=1, log=Log())
                source.close()
        assert kubefake.conditions(cluster)[health.CONDITION]["reason"] == "Xid:48,79"
        assert len(cluster.events) == 2 and cluster.errors == []  # one per GPU, once

    def test_without_an_api_the_critical_xid_is_logged(self) -> None:
        log = Log()
        health.watch_once(StaticSource([Xid("0000:3b:00", 79, "")]), Health({79}), api=None,
                          node=None, boot_id=BOOT, timeout_s=0, log=log)
        assert log.lines[-1][:2] == ("error", "critical GPU Xid: no Kubernetes API to "
                                              "report it to")


class TestQueuedReport:
    """The agent queues the Xid report on its API writer (`send`): a round never waits on
    the API server, and the queued report, retried, reaches the Node once it answers."""

    def test_a_hung_api_server_never_holds_the_round(self, tmp_path: Path) -> None:
        from installer.agent.publish import ApiQueue

        cluster, log = fake_cluster(), Log()
        queue, watch, announced = ApiQueue(log), Health({79}), set[str]()
        with kubefake.serve(cluster) as url:
            front = kubefronts.HangingFront(url)
            front.hung.set()
            try:
                start = time.monotonic()
                new = health.watch_once(
                    StaticSource([Xid("0000:3b:00", 79, "")]), watch,
                    api=api_for(front.url, tmp_path), node=NODE, boot_id=BOOT, timeout_s=0,
                    log=log, announced=announced,
                    send=lambda what, call: queue.put("xid-report", what, call))
                took = time.monotonic() - start
                assert [x.code for x in new] == [79] and watch.unreported  # kept until sent
                assert took < 1.0, f"the round waited {took:.1f}s on the API server"
                time.sleep(0.5)
                assert health.CONDITION not in kubefake.conditions(cluster)  # still held
                front.hung.clear()
                deadline = time.monotonic() + 30
                while watch.unreported and time.monotonic() < deadline:
                    time.sleep(0.1)
            finally:
                queue.close(5)
                front.close()
        assert watch.unreported == [] and announced == {"0000:3b:00:79"}
        assert kubefake.conditions(cluster)[health.CONDITION]["reason"] == "Xid:79"
        assert [e["reason"] for e in cluster.events] == ["XIDError"]
