"""Which CUDA toolkit a GPU container carries, and whether the node's driver runs it.

The version comes from `--cuda`, else the env NVIDIA's CUDA images set
(`NVIDIA_REQUIRE_CUDA`'s `cuda>=X.Y`, `CUDA_VERSION`), else the image tag when it follows a
well-known pattern: NVIDIA's CUDA images (`nvidia/cuda:12.4.1-runtime-ubuntu22.04`), a
`cudaX.Y[.Z]` part (`vectoradd-cuda12.5.0`), PyTorch's `cuXYZ` (`2.3.0-cu121`). Anything
else is unknown and SKIPs: never a guess (an NGC `pytorch:24.05-py3` says no version).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from installer.compat.pods.gpus import Demand, claim_containers
from installer.compat.pods.rules import (
    FAIL,
    PASS,
    SKIP,
    NodeView,
    RuleResult,
    containers,
    resources,
)
from installer.compat.toolkit import CudaVerdict, check_cuda, minor_compat_major, parse_cuda
from installer.errors import ConfigError

_REQUIRE_CUDA = re.compile(r"cuda>=(\d+\.\d+(?:\.\d+)?)")
_CUDA_REPO = re.compile(r"(^|/)cuda$")
_LEADING = re.compile(r"^(\d+\.\d+(?:\.\d+)?)(?:-|$)")
_CUDA_PART = re.compile(r"(?:^|[^a-z])cuda[-_]?(\d+\.\d+(?:\.\d+)?)(?![\d.])", re.IGNORECASE)
_CU_PART = re.compile(r"(?:^|[^a-z])cu(\d)(\d{1,2})(?!\d)")


def split_image(image: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; the digest is dropped."""
    name = image.split("@", 1)[0]
    repo, _, tag = name.rpartition(":")
    if not repo or "/" in tag:
        return name, ""
    return repo, tag


def image_cuda(image: str) -> str | None:
    """The CUDA version an image's tag names, or None when no known pattern matches."""
    repo, tag = split_image(image)
    candidates = []
    leading = _LEADING.match(tag)
    if _CUDA_REPO.search(repo) and leading:
        candidates.append(leading.group(1))
    candidates += [m.group(1) for m in _CUDA_PART.finditer(tag)]
    cu = _CU_PART.search(tag)
    if cu:
        major, minor = (cu.group(1) + cu.group(2)[:-1], cu.group(2)[-1]) \
            if len(cu.group(2)) == 2 else (cu.group(1), cu.group(2))
        candidates.append(f"{int(major)}.{int(minor)}")
    for version in candidates:
        try:
            parse_cuda(version)
        except ConfigError:
            continue
        return version
    return None


def container_cuda(container: Mapping[str, Any]) -> tuple[str, str] | None:
    """(version, where it came from) a container declares: NVIDIA_REQUIRE_CUDA's
    `cuda>=X.Y`, CUDA_VERSION (what NVIDIA's CUDA images set), else its image tag."""
    found = container.get("env")
    env = {str(e.get("name")): e.get("value") for e in found if isinstance(e, dict)} \
        if isinstance(found, list) else {}
    required = env.get("NVIDIA_REQUIRE_CUDA")
    match = _REQUIRE_CUDA.search(required) if isinstance(required, str) else None
    if match:
        return match.group(1), "env NVIDIA_REQUIRE_CUDA"
    version = env.get("CUDA_VERSION")
    if isinstance(version, str) and version.strip():
        return version.strip(), "env CUDA_VERSION"
    image = container.get("image")
    tagged = image_cuda(image) if isinstance(image, str) else None
    return (tagged, f"the image tag {image}") if tagged else None


def gpu_containers(spec: Mapping[str, Any], demand: Demand) -> list[Mapping[str, Any]]:
    """Containers that get a GPU: a GPU resource in limits or requests, or a GPU claim."""
    claimed = claim_containers(spec, demand.claims)
    return [c for c in containers(spec)
            if any(n in resources(c, "limits") or n in resources(c, "requests")
                   for n in demand.names) or c.get("name") in claimed]


def cuda_rule(spec: Mapping[str, Any], demand: Demand, node: NodeView,
              cuda: str | None) -> RuleResult:
    """Each GPU container's CUDA toolkit runs on the node's driver (the `compat` rules)."""
    gpu = gpu_containers(spec, demand)
    if not gpu:
        return RuleResult("cuda", SKIP, "no container gets a GPU")
    if "nvidia" not in demand.vendors:
        return RuleResult("cuda", SKIP, "not an NVIDIA GPU: no NVIDIA driver to check")
    if node.driver is None:
        return RuleResult("cuda", SKIP, "no driver to check the CUDA toolkit against",
                          "give --driver VERSION, or --here on the node")
    passed, failed, unknown = _judge(gpu, node.driver, cuda)
    if failed:
        newest = failed[0][1].max_cuda or "an older toolkit"
        need = failed[0][1].minimum_driver or failed[0][1].minor_version_floor or "newer"
        major = minor_compat_major(node.driver)
        also = f" (or any {major}.x, through minor version compatibility)" if major else ""
        return RuleResult("cuda", FAIL, "; ".join(line for line, _ in failed),
                          f"run it on nodes with driver >= {need}, or build the image with "
                          f"CUDA {newest} or older{also}")
    if not passed:
        return RuleResult("cuda", SKIP, "; ".join(unknown),
                          "give --cuda X.Y, or set NVIDIA_REQUIRE_CUDA/CUDA_VERSION in the "
                          "container's env")
    return RuleResult("cuda", PASS, "; ".join([line for line, _ in passed] + unknown)
                      + f" (driver {node.driver})")


def _judge(gpu: Sequence[Mapping[str, Any]], driver: str, cuda: str | None) -> tuple[
        list[tuple[str, CudaVerdict]], list[tuple[str, CudaVerdict]], list[str]]:
    passed: list[tuple[str, CudaVerdict]] = []
    failed: list[tuple[str, CudaVerdict]] = []
    unknown: list[str] = []
    for container in gpu:
        found = (cuda, "--cuda") if cuda else container_cuda(container)
        if found is None:
            unknown.append(f"container {container['name']}: no CUDA version known (env or "
                           "image tag)")
            continue
        try:
            verdict = check_cuda(found[0], driver)
        except ConfigError as exc:
            unknown.append(f"container {container['name']}: {exc.message}")
            continue
        line = f"container {container['name']}: {verdict.reason} (CUDA from {found[1]})"
        (passed if verdict.compatible else failed).append((line, verdict))
    return passed, failed, unknown
