"""upgrade.selection, rule by rule: which pods go, which wait, which block, and which
settings unlock which (the live flow over the fake API: tests/host/test_upgrade_selection.py).
"""

from __future__ import annotations

import pytest
from kubefake import pod_doc

from installer.errors import UpgradeBlockedError
from installer.node.cgroup import PodCgroup
from installer.node.holders import Holder
from installer.upgrade import selection

NODE = "gpu-node-1"
IDLE = "41111111-2222-4333-8444-555555555555"
DS_UID = "9f8e7d6c-5b4a-4321-8fed-cba987654321"
GPU = {"nvidia.com/gpu": "1"}


class TestPlanRules:
    """selection.plan's decisions, pod by pod, without a node (each rule's edge)."""

    @staticmethod
    def _plan(*docs: dict[str, object], held: str | None = None, exists: bool = True,
              **rules: bool) -> selection.Plan:
        pods = [selection.pod_from_api(d) for d in docs]
        holders = [Holder(7, "python3", PodCgroup(held, "burstable", "systemd"))] if held \
            else []
        return selection.plan(holders, pods, node=NODE,
                              rules=selection.Rules("evict", **rules),
                              daemonset_exists=lambda pod: exists)

    def test_settings_never_unlock_a_static_pod(self) -> None:
        static = pod_doc("s", IDLE, NODE, owner="Node", limits=GPU,
                         annotations={"kubernetes.io/config.mirror": "h"})
        with pytest.raises(UpgradeBlockedError, match="static pod default/s"):
            self._plan(static, force=True, delete_emptydir_data=True,
                       restart_daemonsets=True)

    def test_a_pod_already_terminating_is_only_waited_for(self) -> None:
        doc = pod_doc("leaving", IDLE, NODE, owner=None, limits=GPU, empty_dirs=("x",))
        doc["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
        plan = self._plan(doc)
        assert [p.ref for p in plan.wait] == ["default/leaving"] and plan.evict == []

    def test_daemonset_pods_asking_for_gpus_are_left_to_their_controller(self) -> None:
        ds = pod_doc("plugin", DS_UID, NODE, owner="DaemonSet", limits=GPU)
        assert self._plan(ds).empty
        with pytest.raises(UpgradeBlockedError, match="its DaemonSet plugin-owner is gone"):
            self._plan(ds, exists=False)
        orphan = self._plan(ds, exists=False, force=True)
        assert [p.ref for p in orphan.evict] == ["default/plugin"]
        held = self._plan(ds, held=DS_UID, restart_daemonsets=True)
        assert [p.ref for p in held.delete] == ["default/plugin"]

    def test_every_gpu_resource_form_is_seen(self) -> None:
        forms = [{"limits": {"nvidia.com/gpu.shared": "1"}},
                 {"init_limits": {"nvidia.com/mig-3g.40gb": "1"}}, {"claim": "c"}]
        for form in forms:
            plan = self._plan(pod_doc("p", IDLE, NODE, **form))  # type: ignore[arg-type]
            assert [p.ref for p in plan.evict] == ["default/p"], form
        assert self._plan(pod_doc("cpu", IDLE, NODE, limits={"cpu": "2"})).empty
