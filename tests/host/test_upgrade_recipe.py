"""docs/upgrading.md's manual recipe ("Upgrade node by node"), followed step by step on a GKE
node against the strict fake API (tests/kubefake.py): the page's overlay is rendered with
`kubectl kustomize` and its ConfigMap's UPGRADE_* settings (what the recipe is about) are
the installer's; the page's shell snippet is run line by line by a stand-in for the kubectl
verbs it uses (cordon, drain --ignore-daemonsets, delete the installer pod: the new pod's
install run, wait, uncordon). Any other command in the snippet fails the test, so the page
cannot drift from what runs.

The node serves V1 to a training pod and to GKE's device plugin (a DaemonSet pod that drain
leaves, holding /dev/nvidiactl, recreated at once and polling its device-file gate: the
stand-in of tests/host/test_upgrade_daemonsets.py). Following the recipe must end with V2
loaded, the plugin's replacement opening V2 only, and the node uncordoned, not exit 10.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import kubefake
import yaml
from e2e import Scene, run_cli, standin_env
from host import test_upgrade as shared
from host.test_upgrade import NODE, UID, V2, account, loaded
from host.test_upgrade_daemonsets import GkeDevicePlugin, Kubelet, plugin_cluster
from kubefake import pod_doc

from installer.node import kube

repo, scene = shared.repo, shared.scene  # the fixtures: V1 serving, V1+V2 mirror
REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "upgrading.md").read_text(encoding="utf-8")
INSTALLER = "app.kubernetes.io/name=gpu-node-installer"


def recipe_overlay() -> str:
    (block,) = [textwrap.dedent(b) for b in re.findall(
        r"^[ ]*```yaml\n(.*?)^[ ]*```", PAGE, flags=re.MULTILINE | re.DOTALL)
        if "the manual recipe" in b]
    return block


def recipe_commands() -> list[list[str]]:
    """The snippet's commands, continuation lines joined, comments dropped."""
    (block,) = [textwrap.dedent(b) for b in re.findall(
        r"^[ ]*```sh\n(.*?)^[ ]*```", PAGE, flags=re.MULTILINE | re.DOTALL)
        if "kubectl cordon" in b and "kubectl uncordon" in b]
    return [shlex.split(line, comments=True)
            for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def rendered(tmp: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize my-cluster`, the overlay beside a copy of daemonset/."""
    shutil.copytree(REPO / "daemonset", tmp / "daemonset")
    (tmp / "my-cluster").mkdir()
    (tmp / "my-cluster" / "kustomization.yaml").write_text(recipe_overlay())
    out = subprocess.run(["kubectl", "kustomize", str(tmp / "my-cluster")], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


class Kubectl:
    """The kubectl verbs the recipe uses, on the fake API; `delete` of the installer pod
    runs the new pod's install with the rendered settings, `wait` checks it ended Ready."""

    def __init__(self, node: Scene, mirror: str, url: str, settings: dict[str, str]) -> None:
        self.node, self.mirror, self.settings = node, mirror, settings
        self.api = kube.ApiServer(url, account(node) / "token", None)
        self.url = url
        self.variables: dict[str, str] = {}
        self.run: subprocess.CompletedProcess[str] | None = None

    def __call__(self, argv: list[str]) -> None:
        if len(argv) == 1 and "=" in argv[0]:  # NODE=...: the fake's node stands for it
            name = argv[0].split("=", 1)[0]
            self.variables[name] = NODE
            return
        assert argv[0] == "kubectl", argv
        args = [a.replace("$NODE", NODE) for a in argv[1:]]
        if args[:2] == ["-n", "kube-system"]:
            args = args[2:]
        verb = args[0]
        getattr(self, f"_{verb}")(args[1:])

    def _cordon(self, args: list[str]) -> None:
        assert args == [NODE], args
        kube.patch_node(self.api, NODE, {"spec": {"unschedulable": True}})

    def _uncordon(self, args: list[str]) -> None:
        assert args == [NODE], args
        kube.patch_node(self.api, NODE, {"spec": {"unschedulable": None}})

    def _drain(self, args: list[str]) -> None:
        """kubectl drain --ignore-daemonsets --delete-emptydir-data: every pod but the
        DaemonSets' and mirror pods evicted (the cordon was the previous step)."""
        assert args[0] == NODE and set(args[1:]) == {"--ignore-daemonsets",
                                                      "--delete-emptydir-data"}, args
        for pod in kube.pods_on_node(self.api, NODE):
            meta = pod["metadata"]
            kinds = {o["kind"] for o in meta.get("ownerReferences", [])}
            if kinds & {"DaemonSet", "Node"}:
                continue
            assert kube.evict(self.api, meta["namespace"], meta["name"], meta["uid"],
                              None) == "evicted"

    def _delete(self, args: list[str]) -> None:
        assert args[:3] == ["pod", "-l", INSTALLER], args
        assert args[3:] == ["--field-selector", f"spec.nodeName={NODE}"], args
        # the rendered upgrade settings; the version is the test mirror's V2, and the
        # ConfigMap's paths are the pod's mounts, which the scene's arguments stand for
        env = standin_env(V2) | {k: v for k, v in self.settings.items()
                                 if k.startswith("UPGRADE_")}
        self.run = run_cli(["install", *self.node.args(
            "--mirror", self.mirror, "--driver-version", V2, "--allow-http",
            "--node-name", NODE, "--kube-api", self.url,
            "--service-account-dir", str(account(self.node)), "--output", "json")], env)

    def _wait(self, args: list[str]) -> None:
        assert "--for=condition=Ready" in args, args
        assert self.run is not None and self.run.returncode == 0, (
            self.run and self.run.stderr)


def test_the_manual_recipe_frees_the_gke_device_plugin_and_upgrades(
        scene: tuple[Scene, str], tmp_path: Path) -> None:
    node, mirror = scene
    objects = rendered(tmp_path)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}  # still manual
    (settings,) = [o["data"] for o in objects if o["kind"] == "ConfigMap"
                   and o["metadata"]["name"].startswith("gpu-node-installer-settings")]
    kubelet = Kubelet(node)
    plugin = GkeDevicePlugin(kubelet)
    cluster, plugin_ds = plugin_cluster(node, kubelet, plugin.start)
    train = pod_doc("train", UID, NODE, limits={"nvidia.com/gpu": "1"})
    cluster.pods["default/train"] = train
    kubelet.run(train, "python3")
    with kubefake.serve(cluster) as url:
        kubectl = Kubectl(node, mirror, url, settings)
        try:
            for command in recipe_commands():
                kubectl(command)
        finally:
            plugin.installer_done.set()
        deadline = time.monotonic() + 30
        while not plugin.saw and time.monotonic() < deadline:
            time.sleep(0.05)
    plugin.join()
    assert kubectl.run is not None
    assert loaded(node) == V2
    assert "default/train" not in cluster.pods  # the drain evicted it
    deleted = [s for s in cluster.steps() if s.startswith("delete:")]
    assert deleted == [f"delete:{plugin_ds.made[0]}:200"]  # the plugin, by the installer
    # its replacement came at once but opened the driver only once V2 was verified
    assert plugin.saw == [{"pod": plugin_ds.made[1], "driver": V2, "ready": V2}]
    assert cluster.node()["spec"].get("unschedulable") is None  # the recipe's uncordon
    assert cluster.states()[-1] == "upgrade-done"
    assert cluster.errors == []


def test_without_the_component_the_page_says_it_ends_in_exit_10() -> None:
    """The page's own account of the refuse path matches the code's exit code and label."""
    assert "(`UPGRADE_POLICY=refuse`) the device plugin still holds the driver: the pod " \
           "exits 10" in " ".join(PAGE.split())
    assert "`upgrade-required`" in PAGE
