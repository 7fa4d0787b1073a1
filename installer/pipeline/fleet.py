"""What `preflight` checks: (kernel, arch, pool) targets from `--kernel` flags, a Node list
(`kubectl get nodes -o yaml|json`, or the API's) and `--cos-build`.

Nodes that share kernel, arch, pool, OS image, GPU and the labels DRIVER_VERSION_MAP reads
are one target; every value is checked (a kernel release, an arch we build for, labels
that are label-shaped) before anything is asked of a mirror, and a bad one is one
ConfigError naming the node and the field.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from installer.compat import gpulabels
from installer.compat.nodelabels import valid_key, valid_value
from installer.errors import ConfigError
from installer.node import arches
from installer.node.documents import quote, read_yaml
from installer.packages.cos.layout import BOARD_RE, BUILD_ID_RE
from installer.packages.manifest import KERNEL_RELEASE_RE

# the node-pool label of each platform, first found wins (GKE, EKS, AKS, Karpenter)
POOL_LABELS = ("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup",
               "kubernetes.azure.com/agentpool", "karpenter.sh/nodepool")
MAX_NODES = 50_000
MAX_LABELS = 400
NODES_REMEDY = ("give --nodes the output of `kubectl get nodes -o yaml` (or -o json): a List "
                "of Nodes, each with status.nodeInfo.kernelVersion and architecture")
KERNEL_REMEDY = "give --kernel RELEASE[,ARCH], e.g. --kernel 6.1.0-42-cloud-amd64,x86_64"
NO_POOL = "-"


@dataclass(frozen=True)
class Target:
    """One thing to check: a kernel on an arch in a pool (with its nodes' labels), or a COS
    build's artifacts."""

    kernel: str
    arch: str
    pool: str = NO_POOL
    labels: tuple[tuple[str, str], ...] = ()
    os_image: str = ""
    gpu: tuple[str, str] | None = None  # (model as named, architecture)
    nodes: tuple[str, ...] = ()
    cos_build: str | None = None
    cos_board: str | None = None

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(frozen=True)
class Flags:
    """The targets the flags name, checked: `--kernel` and `--cos-build` targets, the
    `--gpu` they drive, and `--roll-out`'s kernel per arch."""

    targets: tuple[Target, ...]
    gpu: tuple[str, str] | None
    rollout: dict[str, str]
    cos_build: str | None  # the first --cos-build, for the COS nodes of a Node list

    @classmethod
    def parse(cls, kernels: Iterable[str], cos_builds: Iterable[str], gpus: Iterable[str],
              rollout: Iterable[str]) -> Flags:
        gpu = gpu_option(gpus)
        cos = [cos_target(value, gpu) for value in cos_builds]
        return cls((*kernel_targets(kernels, gpu), *cos), gpu, roll_out(rollout),
                   cos[0].cos_build if cos else None)


@dataclass
class _Group:
    first: Target
    nodes: list[str] = field(default_factory=list)


def machine_arch() -> str:
    """This machine's arch as the product names it (x86_64, aarch64)."""
    return arches.canonical(platform.machine()) or "x86_64"


def gpu_option(names: Iterable[str]) -> tuple[str, str] | None:
    """`--gpu MODEL`: (the name, its architecture); an unknown name is a ConfigError."""
    found = None
    for name in names:
        arch = gpulabels.architecture_of(name) if name.isascii() and name.isprintable() \
            else None
        if arch is None:
            raise ConfigError(f"--gpu {quote(name, 60)} names no GPU model or architecture "
                              "this installer knows", remedy="give a model like A100, H100, "
                              "B200 or T4, a GKE accelerator, or an architecture like hopper")
        found = (name, arch)
    return found


def kernel_targets(values: Iterable[str], gpu: tuple[str, str] | None, *,
                   flag: str = "--kernel") -> list[Target]:
    """One target per `--kernel RELEASE[,ARCH]`."""
    targets = []
    remedy = KERNEL_REMEDY.replace("--kernel", flag)
    for value in values:
        release, _, arch_text = value.partition(",")
        release = release.strip()
        if not KERNEL_RELEASE_RE.match(release):
            raise ConfigError(f"{flag} {quote(value, 80)}: {quote(release, 80)} is not a "
                              "kernel release", remedy=remedy)
        arch = arches.canonical(arch_text) if arch_text else machine_arch()
        if arch is None:
            raise ConfigError(f"{flag} {quote(value, 80)}: arch {quote(arch_text, 40)} is "
                              f"not one of {', '.join(arches.ARCHES)}", remedy=remedy)
        targets.append(Target(release, arch, gpu=gpu))
    return targets


def cos_target(value: str, gpu: tuple[str, str] | None) -> Target:
    """`--cos-build BUILD_ID[/BOARD][,ARCH]`: a COS build's published GPU artifacts."""
    spec, _, arch_text = value.partition(",")
    build, _, board = spec.partition("/")
    arch = arches.canonical(arch_text) if arch_text else "x86_64"
    if not BUILD_ID_RE.match(build) or (board and not BOARD_RE.match(board)) or arch is None:
        raise ConfigError(f"--cos-build {quote(value, 80)} is not BUILD_ID[/BOARD][,ARCH]",
                          remedy="give a COS build id like 18244.151.14 (as /etc/os-release's "
                                 "BUILD_ID), optionally /lakitu and ,x86_64")
    return Target("-", arch, gpu=gpu, cos_build=build,
                  cos_board=board or ("lakitu" if arch == "x86_64" else None))


def parse_nodes(data: bytes, source: str) -> list[dict[str, Any]]:
    """The Node objects of a `kubectl get nodes` output (a List, a NodeList or one Node)."""
    import yaml  # type: ignore[import-untyped]

    name = f"--nodes {source}"
    try:
        documents = _json(data, name) if data.lstrip()[:1] == b"{" else read_yaml(
            data, name=name, error=ConfigError)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{name} is not valid YAML or JSON: {quote(problem, 120)}",
                          remedy=NODES_REMEDY) from None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ConfigError(f"{name} is not one List of Nodes", remedy=NODES_REMEDY)
    document = documents[0]
    if document.get("kind") == "Node":
        return [document]
    items = document.get("items")
    if document.get("kind") not in ("List", "NodeList") or not isinstance(items, list):
        kind = document.get("kind")
        what = f"a {quote(kind, 40)}" if kind else "a document without a kind"
        raise ConfigError(f"{name} is {what}, not a List of Nodes", remedy=NODES_REMEDY)
    if len(items) > MAX_NODES:
        raise ConfigError(f"{name} lists {len(items)} items, more than {MAX_NODES}",
                          remedy=NODES_REMEDY)
    for number, item in enumerate(items, 1):
        if not isinstance(item, dict) or item.get("kind", "Node") != "Node":
            raise ConfigError(f"{name} item {number} is not a Node", remedy=NODES_REMEDY)
    return items


def roll_out(values: Iterable[str]) -> dict[str, str]:
    """`--roll-out RELEASE[,ARCH]`: arch -> the kernel a new node image boots."""
    return {t.arch: t.kernel for t in kernel_targets(
        (value for value in values), None, flag="--roll-out")}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json(data: bytes, name: str) -> list[Any]:
    """`kubectl get nodes -o json`: read by the standard library's parser (the YAML loader
    takes seconds on thousands of Nodes); NaN and Infinity refused, nesting bounded by the
    parser's recursion limit, the size by the caller."""
    try:
        return [json.loads(data, parse_constant=_refuse_constant)]
    except RecursionError:
        raise ConfigError(f"{name} is nested too deep", remedy=NODES_REMEDY) from None


def node_targets(nodes: list[dict[str, Any]], source: str, *, cos_build: str | None,
                 choose: Any, rollout: Mapping[str, str] | None = None) -> list[Target]:
    """Targets from Nodes, grouped; `choose(labels)` is the per-pool version rule, whose
    answer joins the group key so nodes given different versions stay apart. `rollout`
    (arch -> kernel) checks each node as if it booted that kernel."""
    groups: dict[tuple[Any, ...], _Group] = {}
    for number, node in enumerate(nodes, 1):
        target, name = _node_target(node, f"--nodes {source} item {number}", cos_build)
        if rollout and target.arch in rollout:
            target = replace(target, kernel=rollout[target.arch])
        key = (target.kernel, target.arch, target.pool, target.os_image, target.gpu,
               choose(target.label_map, name), target.cos_build)
        groups.setdefault(key, _Group(target)).nodes.append(name)
    return [_with_nodes(g.first, g.nodes) for g in groups.values()]


def _with_nodes(target: Target, nodes: list[str]) -> Target:
    return replace(target, nodes=tuple(nodes))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _node_target(node: Mapping[str, Any], where: str, cos_build: str | None
                 ) -> tuple[Target, str]:
    metadata = _mapping(node.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}: metadata.name {quote(name, 60)} is not a node name",
                          remedy=NODES_REMEDY)
    where = f"{where} (node {name})"
    info = _mapping(_mapping(node.get("status")).get("nodeInfo"))
    kernel = info.get("kernelVersion")
    if not isinstance(kernel, str) or not KERNEL_RELEASE_RE.match(kernel):
        raise ConfigError(f"{where}: status.nodeInfo.kernelVersion {quote(kernel, 80)} is not "
                          "a kernel release", remedy=NODES_REMEDY)
    arch_name = info.get("architecture")
    arch = arches.canonical(arch_name) if isinstance(arch_name, str) else None
    if arch is None:
        raise ConfigError(f"{where}: status.nodeInfo.architecture {quote(arch_name, 40)} is "
                          f"not one of {', '.join(arches.DEBIAN_ARCHES)}", remedy=NODES_REMEDY)
    labels = _labels(metadata.get("labels"), where)
    os_image = info.get("osImage")
    os_image = os_image[:200] if isinstance(os_image, str) and os_image.isprintable() else ""
    pool = next((labels[k] for k in POOL_LABELS if k in labels), NO_POOL)
    on_cos = cos_build is not None and "container-optimized os" in os_image.lower()
    return Target(kernel, arch, pool, tuple(sorted(labels.items())), os_image,
                  gpulabels.gpu_of(labels), cos_build=cos_build if on_cos else None,
                  cos_board=("lakitu" if arch == "x86_64" else None) if on_cos else None
                  ), name


def _labels(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_LABELS:
        raise ConfigError(f"{where}: metadata.labels is not a mapping of at most {MAX_LABELS} "
                          "labels", remedy=NODES_REMEDY)
    for key, text in value.items():
        if not isinstance(key, str) or not valid_key(key) or not isinstance(text, str) \
                or not valid_value(text):
            raise ConfigError(f"{where}: label {quote(key, 80)}={quote(text, 80)} is not a "
                              "Kubernetes label", remedy=NODES_REMEDY)
    return dict(value)
