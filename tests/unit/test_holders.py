"""node.holders and upgrade.selection/rollout: who holds the GPUs, what may be evicted.

The /proc tree is a temp dir read through the real Host seam (RealHost), as on a node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.errors import UpgradeBlockedError
from installer.node.holders import Holder, find_holders
from installer.node.host import RealHost, Roots
from installer.upgrade import rollout, selection
from installer.upgrade.selection import Pod, Rules, pod_from_api

UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
CID = "ab" * 32


def _process(proc: Path, pid: int, comm: str, fds: dict[str, str],
             cgroup: str | None) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True)
    for fd, target in fds.items():
        (proc / str(pid) / "fd" / fd).symlink_to(target)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    if cgroup is not None:
        (proc / str(pid) / "cgroup").write_text(cgroup)


def _host(tmp_path: Path) -> RealHost:
    return RealHost(Roots(tmp_path, tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))


class TestFindHolders:
    def test_pods_and_host_processes(self, tmp_path: Path) -> None:
        proc = tmp_path / "proc"
        pod_line = f"0::/kubepods/burstable/pod{UID}/{CID}\n"
        _process(proc, 300, "python3", {"0": "/dev/null", "5": "/dev/nvidia0"}, pod_line)
        _process(proc, 120, "nvidia-smi", {"3": "/dev/nvidiactl"},
                 "0::/system.slice/ssh.service\n")
        _process(proc, 99, "bash", {"0": "/dev/pts/0"}, pod_line)  # holds no GPU
        _process(proc, 400, "gone", {"4": "/dev/nvidia-uvm"}, None)  # cgroup file vanished
        (proc / "self").mkdir()
        holders = find_holders(_host(tmp_path))
        assert [(h.pid, h.command, h.pod.pod_uid if h.pod else None) for h in holders] == [
            (120, "nvidia-smi", None), (300, "python3", UID), (400, "gone", None)]
        assert holders[0].describe() == "120 (nvidia-smi) (not in a pod)"
        assert holders[1].describe() == f"300 (python3) in pod {UID}"


def _pod(name: str, uid: str, owner: str | None = "ReplicaSet", **extra: object) -> Pod:
    meta: dict[str, object] = {"name": name, "namespace": "ns", "uid": uid, **extra}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "controller": True}]
    return pod_from_api({"metadata": meta, "status": {"phase": "Running"}})


def _alive(pod: Pod) -> bool:
    return True


def _holder(pid: int, uid: str | None) -> Holder:
    from installer.node.cgroup import PodCgroup

    return Holder(pid, f"p{pid}", PodCgroup(uid, "burstable", "cgroupfs") if uid else None)


class TestPlan:
    def test_holders_pods_are_evicted_daemonsets_deleted_when_allowed(self) -> None:
        pods = [_pod("job", "u1"), _pod("exporter", "u2", "DaemonSet"), _pod("web", "u3")]
        plan = _plan([_holder(1, "u1"), _holder(2, "u1"), _holder(3, "u2")], pods,
                     Rules("evict", restart_daemonsets=True))
        assert [p.ref for p in plan.evict] == ["ns/job"]
        assert [p.ref for p in plan.delete] == ["ns/exporter"]
        assert plan.holders == {"ns/job": [1, 2], "ns/exporter": [3]}

    def test_every_unevictable_holder_is_named_at_once(self) -> None:
        pods = [_pod("etcd", "x", "Node", annotations={"kubernetes.io/config.mirror": "h1"}),
                _pod("exporter", "u2", "DaemonSet")]
        with pytest.raises(UpgradeBlockedError) as caught:
            _plan([_holder(1, None), _holder(2, "h1"), _holder(3, "u2"),
                   _holder(4, "missing")], pods, Rules("evict"))
        message = caught.value.message
        assert "process 1 (p1) is not in a pod" in message
        assert "static pod ns/etcd" in message
        assert "DaemonSet pod ns/exporter" in message
        assert "pod missing, which the API does not list on n" in message
        assert caught.value.code == 15

    def test_static_pods_match_by_their_config_hash(self) -> None:
        pods = [_pod("etcd", "api-uid", None, annotations={"kubernetes.io/config.hash": "h"})]
        with pytest.raises(UpgradeBlockedError, match="static pod ns/etcd"):
            _plan([_holder(1, "h")], pods, Rules("evict", restart_daemonsets=True))

    def test_no_holders_no_work_unless_draining(self) -> None:
        pods = [_pod("web", "u3"), _pod("agent", "u4", "DaemonSet")]
        assert _plan([], pods, Rules("evict")).empty
        drained = _plan([], pods, Rules("drain"))
        assert [p.ref for p in drained.evict] == ["ns/web"]


def _plan(holders: list[Holder], pods: list[Pod], rules: Rules) -> selection.Plan:
    return selection.plan(holders, pods, node="n", rules=rules, daemonset_exists=_alive)


class TestRolloutLimit:
    @pytest.mark.parametrize(("value", "nodes", "expected"), [
        ("1", 10, 1), ("3", 2, 3), ("10%", 10, 1), ("10%", 11, 2), ("25%", 3, 1),
        ("100%", 7, 7), ("1%", 1, 1)])
    def test_counts_and_percentages_round_up(self, value: str, nodes: int,
                                             expected: int) -> None:
        assert rollout.limit(value, nodes) == expected
