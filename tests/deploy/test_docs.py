"""docs/deploy.md keeps up with the code: the one-liner, every overlay, every exit code."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import kubernetes_validate
import yaml

from deploy.manifests import (
    OVERLAYS,
    REPO,
    container_env,
    installer_env_vars,
    mounts_by_volume,
    one,
    pod_spec,
    render,
    tool,
)
from installer.errors import error_table

DOC = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")


def test_the_one_liner_is_documented_and_renders() -> None:
    assert "kubectl apply -k daemonset/overlays/gke-cos" in DOC
    assert render("overlays/gke-cos")


def test_every_overlay_is_described() -> None:
    for overlay in OVERLAYS:
        assert f"| `{overlay}` |" in DOC


def test_exit_code_table_covers_every_error_class() -> None:
    rows = dict(re.findall(r"^\| (\d+) \| `([a-z-]+)` \|", DOC, flags=re.MULTILINE))
    expected = {str(cls.code): cls.slug for cls in error_table()}
    assert rows == expected
    assert "../README.md#exit-codes" in DOC


def _yaml_blocks() -> list[str]:
    """Every ```yaml block of the doc, dedented (some sit in list items)."""
    return [textwrap.dedent(block) for block in
            re.findall(r"^[ ]*```yaml\n(.*?)^[ ]*```", DOC, flags=re.MULTILINE | re.DOTALL)]


def _block(first_line: str) -> dict:
    (block,) = [b for b in _yaml_blocks() if b.lstrip().startswith(first_line)
                or b.startswith(first_line)]
    return yaml.safe_load(block)


def _merge_generators(into: list[dict], more: list[dict]) -> None:
    for generator in more:
        same = [g for g in into if g["name"] == generator["name"]]
        if same and generator.get("behavior") == "merge":
            same[0].setdefault("literals", []).extend(generator.get("literals", []))
        else:
            into.append(generator)


def test_the_live_upgrade_runbook_applies_and_watches_the_documented_labels() -> None:
    assert "kubectl apply -k daemonset/overlays/live-upgrade" in DOC
    assert ("kubectl get nodes -L gpu-node-installer/upgrade-state,"
            "gpu-node-installer/driver-version") in DOC
    for state in ("upgrade-required", "cordon-required", "pod-deletion-required",
                  "validation-required", "uncordon-required", "upgrade-done", "upgrade-failed"):
        assert f"| `{state}` |" in DOC
    for rbac in ("pods/eviction", "`get`, `list`", "nodes `list`"):
        assert rbac in DOC


def test_the_documented_live_upgrade_component_renders_in_another_overlay(
        tmp_path: Path) -> None:
    """The runbook's own-overlay snippet, laid out as the doc says: valid, rolling, and the
    component's binding names the service account in the overlay's namespace."""
    shutil.copytree(REPO / "daemonset", tmp_path / "gpu-node-installer" / "daemonset")
    overlay = _block("# my-upgrading-cluster/kustomization.yaml")
    my_cluster = tmp_path / "my-upgrading-cluster"
    my_cluster.mkdir()
    (my_cluster / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    proc = subprocess.run([tool("kubectl"), "kustomize", str(my_cluster)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.28.0", strict=True)
    daemonset = one(docs, "DaemonSet", "gpu-node-installer")
    assert daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    binding = one(docs, "ClusterRoleBinding", "gpu-node-installer-upgrade")
    assert binding["subjects"][0]["namespace"] == "gpu-node-installer"
    (installer,) = pod_spec(daemonset)["initContainers"]
    assert container_env(installer, docs)["UPGRADE_POLICY"] == "evict"


def test_the_documented_overlay_snippets_render_and_validate(tmp_path: Path) -> None:
    """'Your own overlay' plus the air-gapped mirror CA and the module parameters, laid out as
    the doc says (the repository beside `my-cluster/`): the result is valid, every namespaced
    object lands in one namespace, and the additions reach the installer container."""
    shutil.copytree(REPO / "daemonset", tmp_path / "gpu-node-installer" / "daemonset")
    overlay = _block("# my-cluster/kustomization.yaml")
    mirror = _block("# in your overlay's kustomization.yaml")
    params = _block("configMapGenerator:\n  - name: gpu-node-installer-module-params")
    _merge_generators(overlay["configMapGenerator"], mirror["configMapGenerator"])
    _merge_generators(overlay["configMapGenerator"], params["configMapGenerator"])
    overlay["patches"] = mirror["patches"]
    my_cluster = tmp_path / "my-cluster"
    my_cluster.mkdir()
    (my_cluster / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    (my_cluster / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (my_cluster / "module-params.conf").write_text("nvidia.NVreg_EnableMSI=0\n")
    proc = subprocess.run([tool("kubectl"), "kustomize", str(my_cluster)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.28.0", strict=True)
    namespaced = {d["metadata"].get("namespace") for d in docs
                  if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")}
    assert namespaced == {"kube-system"}
    daemonset = one(docs, "DaemonSet", "gpu-node-installer")
    (installer,) = pod_spec(daemonset)["initContainers"]
    assert installer["image"] == "registry.example.internal/gpu-node-installer:0.1.0"
    env = container_env(installer, docs)
    assert env["NVIDIA_DRIVER_VERSION"] == "535.261.03"
    ca_dir = mounts_by_volume(installer)["mirror-ca"]
    assert env["DRIVER_CA_BUNDLE"] == f"{ca_dir}/ca.crt"
    assert set(env) <= installer_env_vars()
    params_cm = next(v["configMap"]["name"] for v in pod_spec(daemonset)["volumes"]
                     if v["name"] == "module-params")
    assert one(docs, "ConfigMap", params_cm)["data"] == {
        "module-params.conf": "nvidia.NVreg_EnableMSI=0\n"}
