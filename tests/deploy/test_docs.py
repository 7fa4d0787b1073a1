"""docs/deploy.md, docs/upgrading.md and docs/operating.md keep up with the code: the one-liner,
every overlay, the upgrade runbook and its snippet, every exit code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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
UPGRADING = (REPO / "docs" / "upgrading.md").read_text(encoding="utf-8")
OPERATING = (REPO / "docs" / "operating.md").read_text(encoding="utf-8")
DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_the_one_liner_is_documented_and_renders() -> None:
    assert "kubectl apply -k daemonset/overlays/gke-cos" in DOC
    assert render("overlays/gke-cos")


def test_every_overlay_is_described() -> None:
    for overlay in OVERLAYS:
        assert f"| `{overlay}` |" in DOC


def test_exit_code_table_covers_every_error_class() -> None:
    rows = dict(re.findall(r"^\| (\d+) \| `([a-z-]+)` \|", OPERATING, flags=re.MULTILINE))
    expected = {str(cls.code): cls.slug for cls in error_table()}
    assert rows == expected
    assert "(reference.md#exit-codes)" in OPERATING


def _yaml_blocks(doc: str) -> list[str]:
    """Every ```yaml block of a page, dedented (some sit in list items)."""
    return [textwrap.dedent(block) for block in
            re.findall(r"^[ ]*```yaml\n(.*?)^[ ]*```", doc, flags=re.MULTILINE | re.DOTALL)]


def _block(first_line: str, doc: str = DOC) -> dict:
    (block,) = [b for b in _yaml_blocks(doc) if b.lstrip().startswith(first_line)
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
    assert "kubectl apply -k daemonset/overlays/live-upgrade" in UPGRADING
    assert ("kubectl get nodes -L gpu-node-installer/upgrade-state,"
            "gpu-node-installer/driver-version") in UPGRADING
    for state in ("upgrade-required", "cordon-required", "pod-deletion-required",
                  "validation-required", "uncordon-required", "upgrade-done", "upgrade-failed"):
        assert f"| `{state}` |" in UPGRADING
    for rbac in ("pods/eviction", "`get`, `list`", "nodes `list`"):
        assert rbac in UPGRADING


def test_the_documented_live_upgrade_component_renders_in_another_overlay(
        tmp_path: Path) -> None:
    """The runbook's own-overlay snippet, laid out as the doc says: valid, rolling, and the
    component's binding names the service account in the overlay's namespace."""
    overlay = _block("# my-upgrading-cluster/kustomization.yaml", UPGRADING)
    docs = _render_beside_repo(tmp_path / "my-upgrading-cluster", overlay)
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
    overlay = _block("# my-cluster/kustomization.yaml")
    mirror = _block("# in your overlay's kustomization.yaml")
    params = _block("configMapGenerator:\n  - name: gpu-node-installer-module-params")
    _merge_generators(overlay["configMapGenerator"], mirror["configMapGenerator"])
    _merge_generators(overlay["configMapGenerator"], params["configMapGenerator"])
    overlay["patches"] = mirror["patches"]
    assert overlay["components"] == ["image"]  # what `make push` writes: the image by digest
    docs = _render_beside_repo(tmp_path / "my-cluster", overlay, {
        "ca.crt": "-----BEGIN CERTIFICATE-----\n",
        "module-params.conf": "nvidia.NVreg_EnableMSI=0\n",
        "image/kustomization.yaml": _pinned_component(tmp_path / "pushed")})
    namespaced = {d["metadata"].get("namespace") for d in docs
                  if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")}
    assert namespaced == {"kube-system"}
    daemonset = one(docs, "DaemonSet", "gpu-node-installer")
    (installer,) = pod_spec(daemonset)["initContainers"]
    assert installer["image"] == f"registry.example.internal/gpu/gpu-node-installer@{DIGEST}"
    env = container_env(installer, docs)
    assert env["NVIDIA_DRIVER_VERSION"] == "535.261.03"
    ca_dir = mounts_by_volume(installer)["mirror-ca"]
    assert env["DRIVER_CA_BUNDLE"] == f"{ca_dir}/ca.crt"
    assert set(env) <= installer_env_vars()
    params_cm = next(v["configMap"]["name"] for v in pod_spec(daemonset)["volumes"]
                     if v["name"] == "module-params")
    assert one(docs, "ConfigMap", params_cm)["data"] == {
        "module-params.conf": "nvidia.NVreg_EnableMSI=0\n"}


def _pinned_component(scratch: Path) -> str:
    """The `image/` component `make push OVERLAY=` writes (scripts/pin-image.py)."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "pin-image.py"),
                    "--overlay", str(scratch), "--digest", DIGEST,
                    "--repository", "registry.example.internal/gpu/gpu-node-installer"],
                   check=True, capture_output=True, timeout=30)
    return (scratch / "image" / "kustomization.yaml").read_text()


def _render_beside_repo(overlay_dir: Path, overlay: dict[str, Any],
                        files: dict[str, str] | None = None) -> tuple[dict[str, Any], ...]:
    """Lay the overlay out as the docs say (this repository beside it, as
    `gpu-node-installer/`), render it with kustomize and validate every object strictly."""
    shutil.copytree(REPO / "daemonset", overlay_dir.parent / "gpu-node-installer" / "daemonset",
                    dirs_exist_ok=True)
    overlay_dir.mkdir()
    (overlay_dir / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    for name, text in (files or {}).items():
        (overlay_dir / name).parent.mkdir(exist_ok=True)
        (overlay_dir / name).write_text(text)
    proc = subprocess.run([tool("kubectl"), "kustomize", str(overlay_dir)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.28.0", strict=True)
    return docs
