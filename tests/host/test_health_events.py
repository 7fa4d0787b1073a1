"""One XIDError Event per GPU, on the strict fake API: a GPU hitting a critical Xid the
condition already lists (another GPU had it) still gets its own Event, and an agent
restarted in the same boot (re-reading the kernel log) posts none twice."""

from __future__ import annotations

from pathlib import Path

import kubefake
from healthkit import BOOT, NODE, REBOOTED, api_for, fake_cluster

from installer.agent import health
from installer.agent.health import Xid
from installer.agent.verdict import load_announced, save_announced


def test_each_gpu_gets_its_own_event_even_for_a_listed_xid(tmp_path: Path) -> None:
    cluster, announced = fake_cluster(), set[str]()
    with kubefake.serve(cluster) as url:
        api = api_for(url, tmp_path)
        health.report_critical(api, NODE, [Xid("0000:3b:00", 79, "")], BOOT, announced)
        health.report_critical(api, NODE, [Xid("0000:86:00", 79, ""),
                                           Xid("0000:b1:00", 48, "DBE")], BOOT, announced)
    assert kubefake.conditions(cluster)[health.CONDITION]["reason"] == "Xid:48,79"
    assert [e["message"].split(" (boot")[0] for e in cluster.events] == [
        "critical Xid 79 on GPU 0000:3b:00", "critical Xid 79 on GPU 0000:86:00",
        "critical Xid 48 on GPU 0000:b1:00: DBE"]
    assert announced == {"0000:3b:00:79", "0000:86:00:79", "0000:b1:00:48"}
    assert cluster.errors == []


def test_a_restarted_agent_posts_no_event_twice(tmp_path: Path) -> None:
    cluster, announced = fake_cluster(), set[str]()
    xids = [Xid("0000:3b:00", 79, ""), Xid("0000:86:00", 79, "")]
    with kubefake.serve(cluster) as url:
        api = api_for(url, tmp_path)
        health.report_critical(api, NODE, xids, BOOT, announced)
        save_announced(tmp_path, BOOT, announced)
        again = load_announced(tmp_path, BOOT)  # the restarted agent, same boot
        health.report_critical(api, NODE, xids, BOOT, again)
    assert len(cluster.events) == 2
    assert load_announced(tmp_path, REBOOTED) == set()  # another boot starts afresh
