"""Answers from the Kubernetes API server: slow, malformed, refused for a while, or proxied.

Against the strict fake API server (tests/kubefake.py) on 127.0.0.1 with injected answers:
a pod list trickled one byte every 2 s ends by UPGRADE_TIMEOUT with the node labelled
`upgrade-failed` (never left at `upgrade-required`); a 2xx pod list that is not JSON, or
whose `items` is not a list, is an error naming the answer, never "no pods"; 429 and 503
on the label and Event writes are retried with backoff and then succeed; HTTPS_PROXY is
not used for the API server unless KUBE_API_PROXY names a proxy. Each case runs the real
CLI sandboxed (tests/adversarial/harness.py) within 5 s and asserts the exit code, the
one line and that nothing outside the installer's work area changed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import kubefake
import pytest
from e2e import INSTALL_DIR, Scene, add_version
from httpserver import self_signed
from kubefake import Cluster, Reply, node_doc, pod_doc
from kubefronts import Proxy

from adversarial.harness import (
    KERNEL_STATE,
    VERSION,
    WORK_AREA,
    Arena,
    Result,
    assert_ok,
    assert_refused,
    assert_untouched,
    install,
    make_arena,
    ok_on_node,
    refused_untouched,
    settle,
)
from installer.errors import UpgradeBlockedError, UpgradeTimeoutError
from installer.node.host import Roots
from installer.testing.kernel import FakeKernelHost

V2 = "535.309.01"
NODE = "gpu-node-1"
UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
CID = "4f1e7c0b6d5a3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"
CASE_S = 5.0  # every hostile run's bound
PODS = "GET /api/v1/pods"
# the upgrade's own work before the API failed: V2 fetched, and staged beside VERSION for
# the preflight (not served: the links still name VERSION)
OWN = (f"node/{INSTALL_DIR}/.cache/", f"node/{INSTALL_DIR}/.versions/{V2}-")


def account(arena: Arena) -> Path:
    directory = arena.scene.work / "serviceaccount"
    directory.mkdir(exist_ok=True)
    (directory / "token").write_text(kubefake.TOKEN + "\n")
    return directory


def kube_args(arena: Arena, api: str, *extra: str) -> list[str]:
    return ["--node-name", NODE, "--kube-api", api, "--service-account-dir",
            str(account(arena)), *extra]


def run_install(arena: Arena, api: str, env: dict[str, str] | None = None) -> Result:
    """`install` of VERSION from the arena's repository, telling the API at `api`."""
    return arena.run("install", *arena.args(
        "--mirror", f"file://{arena.scene.repo}", "--driver-version", VERSION,
        *kube_args(arena, api)), env=env, timeout=CASE_S)


# --- a live upgrade whose pod list misbehaves ----------------------------------------------


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node serving VERSION (installed for real), a repository with VERSION and V2: made
    once, copied for each case."""
    base = tmp_path_factory.mktemp("api-answers") / "template"
    base.mkdir()
    arena = make_arena(base)
    add_version(arena.scene, V2)
    assert_ok(install(arena))
    return base


@pytest.fixture
def busy(serving: Path, tmp_path: Path) -> Iterator[tuple[Arena, Cluster]]:
    """The serving node with a training pod's process holding /dev/nvidia0, and a cluster
    whose eviction of that pod ends the process."""
    base = tmp_path / "arena"
    shutil.copytree(serving, base, symlinks=True)
    template = make_arena(tmp_path / "unused")  # the environment and sentinels, as usual
    arena = Arena(base, Scene(base / "node", base / "repo", base / "work"), base / "outside",
                  template.env)
    root = arena.root
    kernel = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))
    pid = kernel.open_device("nvidia", "/dev/nvidia0", "python3", (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"))
    cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                      pods={"default/train": pod_doc("train", UID, NODE)})
    cluster.on_evict = lambda pod: kernel.close_device(pid)
    yield arena, cluster


def upgrade(arena: Arena, api: str) -> Result:
    """Install V2 over the busy node with UPGRADE_POLICY=evict and a 1 s UPGRADE_TIMEOUT."""
    repo = f"file://{arena.scene.repo}"
    return arena.run("install", *arena.args(
        "--mirror", repo, "--driver-version", V2, "--upgrade-policy", "evict",
        "--upgrade-timeout", "1", *kube_args(arena, api)),
        env={"FAKE_NVML_DRIVER": V2}, timeout=CASE_S)


def assert_failed_not_required(cluster: Cluster) -> None:
    """The label moved on to upgrade-failed; nothing was cordoned or evicted."""
    assert cluster.states() == ["upgrade-required", "upgrade-failed"], cluster.states()
    assert not cluster.node().get("spec", {}).get("unschedulable")
    assert not any(c.path.endswith("/eviction") for c in cluster.calls)
    assert "default/train" in cluster.pods
    assert any(e["reason"] == "DriverUpgradeFailed" for e in cluster.events)


class TestPodList:
    def test_a_trickled_list_ends_by_the_upgrade_timeout(
            self, busy: tuple[Arena, Cluster]) -> None:
        arena, cluster = busy
        body = b'{"kind": "PodList", "metadata": {}, "items": []}'
        cluster.faults[PODS] = [Reply(body=body, trickle_s=2.0)]
        before = arena.snapshot()
        with kubefake.serve(cluster) as api:
            started = time.monotonic()
            done = upgrade(arena, api)
            took = time.monotonic() - started
        assert_refused(done, UpgradeTimeoutError.code, "GET /api/v1/pods?",
                       "no complete answer within", "UPGRADE_TIMEOUT ran out",
                       "nothing was unloaded")
        assert took < CASE_S
        assert_failed_not_required(cluster)
        assert_untouched(before, arena.snapshot(), (*WORK_AREA, KERNEL_STATE, *OWN))

    @pytest.mark.parametrize(("body", "named"), [
        (b"<html><body>502 Bad Gateway</body></html>", "'<html><body>502 Bad Gateway"),
        (b'{"kind": "PodList", "items": {"train": {}}}', "items is a dict, not a list"),
        (b'{"kind": "PodList", "metadata": {}}', "items is missing, not a list"),
        (b'{"kind": "PodList", "items": [null]}', "an item of the answer is a NoneType"),
    ], ids=["html", "items-object", "no-items", "null-item"])
    def test_a_2xx_list_that_is_not_a_pod_list_is_an_error_not_no_pods(
            self, busy: tuple[Arena, Cluster], body: bytes, named: str) -> None:
        arena, cluster = busy
        cluster.faults[PODS] = [Reply(body=body)]
        with kubefake.serve(cluster) as api:
            refused_untouched(arena, lambda: upgrade(arena, api), UpgradeBlockedError.code,
                              "Kubernetes API: GET /api/v1/pods", named,
                              "fix: check what answers at the API server's address",
                              allowed=(*WORK_AREA, KERNEL_STATE, *OWN))
        assert_failed_not_required(cluster)


# --- label and Event writes; which proxy carries the calls ----------------------------------


@pytest.fixture
def settled(arena: Arena) -> Arena:
    settle(arena)
    return arena


def labelled(cluster: Cluster) -> bool:
    return "gpu-node-installer/driver-version" in cluster.node()["metadata"].get("labels", {})


class TestWrites:
    def test_429_and_503_on_labels_and_events_are_retried_then_succeed(
            self, settled: Arena) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)})
        cluster.faults[f"PATCH /api/v1/nodes/{NODE}"] = [429, 503]
        cluster.faults["POST /api/v1/namespaces/default/events"] = [503, 429]
        with kubefake.serve(cluster) as api:
            done = ok_on_node(settled, lambda: run_install(settled, api))  # a real install
        patches = [c for c in cluster.calls if c.method == "PATCH"]
        posts = [c for c in cluster.calls if c.method == "POST"]
        assert [c.status for c in patches] == [429, 503, 200]
        assert [c.status for c in posts] == [503, 429, 201]
        assert patches[1].at - patches[0].at >= 0.1  # a backoff, not a hammering loop
        assert labelled(cluster) and [e["reason"] for e in cluster.events] == ["DriverReady"]
        assert "could not" not in done.stderr  # no warning: every write got through


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (scripts/install-deps.sh installs it)")
    return self_signed(tmp_path_factory.mktemp("api-tls"))


class TestProxy:
    def test_https_proxy_is_not_used_for_the_api_server(
            self, settled: Arena, certificate: tuple[Path, Path]) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)})
        shutil.copy(certificate[0], account(settled) / "ca.crt")
        with Proxy() as proxy, kubefake.serve(cluster, tls=certificate) as api:
            every = dict.fromkeys(("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"),
                                  proxy.url)
            ok_on_node(settled, lambda: run_install(settled, api, every))
        assert proxy.seen == []
        assert labelled(cluster) and len(cluster.events) == 1

    def test_kube_api_proxy_carries_the_calls_through_connect(
            self, settled: Arena, certificate: tuple[Path, Path]) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)})
        shutil.copy(certificate[0], account(settled) / "ca.crt")
        with Proxy() as proxy, kubefake.serve(cluster, tls=certificate) as api:
            done = run_install(settled, api, {"KUBE_API_PROXY": proxy.url})
        assert_ok(done)
        authority = api.removeprefix("https://")
        assert proxy.seen and set(proxy.seen) == {f"CONNECT {authority} HTTP/1.1"}
        assert len(proxy.seen) == len(cluster.calls)  # every call, none around it
        assert labelled(cluster)

    def test_a_proxy_that_refuses_is_a_warning_naming_it(self, settled: Arena) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)})
        with Proxy() as proxy, kubefake.serve(cluster) as api:
            refused = api.replace("127.0.0.1", "localhost")  # the proxy relays 127.0.0.1 only
            done = run_install(settled, refused, {"KUBE_API_PROXY": proxy.url})
        assert_ok(done)  # the signal stage's labels are best effort
        assert cluster.calls == [] and proxy.seen
        warnings = [e for e in done.events if e.get("severity") == "WARNING"]
        assert warnings and all("HTTP 403" in str(e.get("detail")) for e in warnings), warnings
