"""The startup taint against the strict fake API (tests/kubefake.py): present from
registration until the agent has made the node ready, removed then, put back on withdrawal
only when asked, never removed on a node the agent did not make ready, other taints never
touched, a concurrent change never lost (the write carries the resourceVersion it read).

`sync_startup_taint` is driven directly for the cases; the real `agent` command (a
subprocess on the agent test node, tests/agentnode.py) shows the wiring end to end.
"""

from __future__ import annotations

import copy
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import kubefake
import pytest
from agentnode import daemon_package, make_node, wait_for
from kubefake import TOKEN, Cluster, node_doc

from installer.agent.taint import ABSENT, ADDED, PRESENT, REMOVED, sync_startup_taint
from installer.config.taint import DEFAULT, DEFAULT_TAINT, Taint, parse
from installer.node.kube import ApiServer, KubeError
from installer.packages.manifest import Package

NODE = "gpu-node-1"
OURS = {"key": "gpu-node-installer/driver-not-ready", "effect": "NoSchedule"}
KUBELETS = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}  # someone else's
DEDICATED = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def registered(*taints: dict[str, str]) -> kubefake.Doc:
    """A Node as kubelet registers it with `--register-with-taints`."""
    doc = node_doc(NODE)
    doc["spec"]["taints"] = [dict(t) for t in taints]
    kubefake.validate(doc)
    return doc


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ApiServer, Cluster]]:
    cluster = Cluster(nodes={NODE: registered(DEDICATED, OURS, KUBELETS)})
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with kubefake.serve(cluster) as url:
        yield ApiServer(url, token, None), cluster
    assert not cluster.errors, cluster.errors


def taints(cluster: Cluster) -> list[dict[str, str]]:
    return list(cluster.node()["spec"].get("taints", []))


def patches(cluster: Cluster) -> list[kubefake.Call]:
    return [c for c in cluster.calls if c.method == "PATCH"]


def sync(server: ApiServer, *, ready: bool, restore: bool = False,
         taint: Taint = DEFAULT_TAINT) -> str:
    return sync_startup_taint(server, NODE, ready=ready, restore=restore, taint=taint,
                              timeout=5)


class TestSync:
    def test_kept_while_not_ready_and_removed_once_ready(
            self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        assert sync(server, ready=False) == PRESENT
        assert sync(server, ready=False, restore=True) == PRESENT
        assert patches(cluster) == []  # nothing to change: nothing sent
        assert sync(server, ready=True) == REMOVED
        assert taints(cluster) == [DEDICATED, KUBELETS]  # the others, in their order
        (patch,) = patches(cluster)
        assert patch.status == 200 and patch.body == {
            "spec": {"taints": [DEDICATED, KUBELETS]}, "metadata": {"resourceVersion": "1"}}

    def test_idempotent_once_removed(self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        assert sync(server, ready=True) == REMOVED
        assert sync(server, ready=True) == ABSENT
        assert len(patches(cluster)) == 1

    def test_withdrawal_puts_it_back_only_when_asked(
            self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        sync(server, ready=True)
        assert sync(server, ready=False) == ABSENT  # restore off (the default)
        assert OURS not in taints(cluster)
        assert sync(server, ready=False, restore=True) == ADDED
        assert taints(cluster) == [DEDICATED, KUBELETS, OURS]
        assert sync(server, ready=False, restore=True) == PRESENT  # never twice
        assert len(patches(cluster)) == 2

    def test_a_node_the_agent_did_not_make_ready_keeps_it(
            self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        for restore in (False, True):
            assert sync(server, ready=False, restore=restore) == PRESENT
        assert OURS in taints(cluster) and patches(cluster) == []

    def test_the_last_taint_removed_leaves_no_list(self, tmp_path: Path) -> None:
        cluster = Cluster(nodes={NODE: registered(OURS)})
        (tmp_path / "token").write_text(TOKEN)
        with kubefake.serve(cluster) as url:
            assert sync(ApiServer(url, tmp_path / "token", None), ready=True) == REMOVED
        assert "taints" not in cluster.node()["spec"] and not cluster.errors

    def test_same_key_other_effect_is_not_ours(self, tmp_path: Path) -> None:
        other = {**OURS, "effect": "PreferNoSchedule"}
        cluster = Cluster(nodes={NODE: registered(other)})
        (tmp_path / "token").write_text(TOKEN)
        with kubefake.serve(cluster) as url:
            assert sync(ApiServer(url, tmp_path / "token", None), ready=True) == ABSENT
        assert taints(cluster) == [other] and not cluster.errors

    def test_a_custom_taint_with_a_value(self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        dedicated = parse("dedicated=gpu:NoSchedule")
        assert dedicated is not None
        assert sync(server, ready=True, taint=dedicated) == REMOVED
        assert taints(cluster) == [OURS, KUBELETS]

    def test_a_concurrent_change_is_kept(self, api: tuple[ApiServer, Cluster]) -> None:
        """Another controller adds a taint between our read and our write: the write is
        refused (409), read again, and both changes survive."""
        server, cluster = api
        late = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
        raced = []

        def controller() -> str:  # runs under the fake's lock after each request
            if not raced:  # right after our first read (the GET)
                node = copy.deepcopy(cluster.node())
                node["spec"]["taints"].append(late)
                node["metadata"]["resourceVersion"] = str(
                    int(node["metadata"]["resourceVersion"]) + 1)
                cluster.nodes[NODE] = node
                raced.append(True)
            return ""

        cluster.observe = controller
        assert sync(server, ready=True) == REMOVED
        assert [c.status for c in patches(cluster)] == [409, 200]
        assert taints(cluster) == [DEDICATED, KUBELETS, late]

    def test_conflicts_that_never_end_fail(self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        path = f"PATCH /api/v1/nodes/{NODE}"
        cluster.faults[path] = [409] * 10
        with pytest.raises(KubeError) as caught:
            sync(server, ready=True)
        assert caught.value.status == 409
        assert len(patches(cluster)) == 5  # ATTEMPTS, then the caller logs it
        assert OURS in taints(cluster)

    def test_refused_by_rbac_raises(self, api: tuple[ApiServer, Cluster]) -> None:
        server, cluster = api
        cluster.faults[f"PATCH /api/v1/nodes/{NODE}"] = [403]
        with pytest.raises(KubeError) as caught:
            sync(server, ready=True)
        assert caught.value.status == 403 and len(patches(cluster)) == 1


class TestSetting:
    @pytest.mark.parametrize(("text", "cause"), [
        ("gpu-node-installer/driver-not-ready:NoExecute", "NoExecute is refused"),
        ("gpu-node-installer/driver-not-ready", "no ':Effect'"),
        ("gpu node:NoSchedule", "is not a taint key"),
        ("a/b/c:NoSchedule", "is not a taint key"),
        ("k=" + "v" * 64 + ":NoSchedule", "is not a taint value"),
        ("k:noschedule", "is not NoSchedule or PreferNoSchedule"),
    ])
    def test_refused(self, text: str, cause: str) -> None:
        from installer.config.values import Invalid

        with pytest.raises(Invalid) as caught:
            parse(text)
        assert cause in str(caught.value.reason)

    def test_accepted(self) -> None:
        assert parse("") is None and parse("  ") is None
        assert parse(str(DEFAULT_TAINT)) == DEFAULT_TAINT == parse(DEFAULT)
        taint = parse("example.com/gpu=pending:PreferNoSchedule")
        assert taint == Taint("example.com/gpu", "pending", "PreferNoSchedule")
        assert taint.to_api() == {"key": "example.com/gpu", "value": "pending",
                                  "effect": "PreferNoSchedule"}


# --- the real agent ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return daemon_package(tmp_path_factory.mktemp("pkg"), daemons=("nvidia-persistenced",))


@pytest.fixture
def cluster() -> Iterator[tuple[str, Cluster]]:
    cluster = Cluster(nodes={NODE: registered(OURS, DEDICATED)})
    with kubefake.serve(cluster) as url:
        yield url, cluster
    assert not cluster.errors, cluster.errors


def label(cluster: Cluster) -> str | None:
    return cluster.node()["metadata"].get("labels", {}).get("gpu-node-installer/status")


class TestAgent:
    def test_removed_when_ready_restored_when_withdrawn(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                         env={"STARTUP_TAINT_RESTORE": "on"})
        with node.agent(api=url):
            wait_for(lambda: label(api) == "ready", 60)
            wait_for(lambda: OURS not in taints(api), 10)
            assert taints(api) == [DEDICATED]
            pid = node.pid("nvidia-persistenced")
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: label(api) == "not-ready", 30)
            wait_for(lambda: OURS in taints(api), 10)  # new GPU pods wait again
            assert taints(api) == [DEDICATED, OURS]
            wait_for(lambda: label(api) == "ready" and OURS not in taints(api), 60)
        assert '"event": "startup taint removed"' in node.log()

    def test_once_not_ready_keeps_it_and_empty_setting_turns_it_off(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1,
                         env={"FAKE_PERSISTENCED_FAIL": "start"})
        done = node.run("agent", "--once", api=url)
        assert done.returncode == 12, done.stderr
        assert taints(api) == [OURS, DEDICATED]  # not made ready: not removed
        node.env = {**node.env, "STARTUP_TAINT": ""}
        node.env.pop("FAKE_PERSISTENCED_FAIL")
        done = node.run("agent", "--once", api=url)
        assert done.returncode == 0, done.stderr
        assert label(api) == "ready" and taints(api) == [OURS, DEDICATED]  # off: untouched

    def test_noexecute_is_refused_before_anything_starts(
            self, tmp_path: Path, package: Package, cluster: tuple[str, Cluster]) -> None:
        url, api = cluster
        node = make_node(tmp_path, package, sample="debian12-l4", gpus=1)
        node.env["STARTUP_TAINT"] = "gpu-node-installer/driver-not-ready:NoExecute"
        done = node.run("agent", "--once", api=url, timeout=30)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "STARTUP_TAINT=" in lines[0], done.stderr
        assert "NoExecute is refused" in lines[0] and "Traceback" not in done.stderr
        assert node.started() == [] and api.calls == []
