"""Which GPUs a PodSpec asks for: extended resources of every GPU vendor, MIG slices and DRA
claims, and the signs of GPU intent in a pod that asks for none.

Kubernetes hands out GPUs through device plugins' extended resources (`nvidia.com/gpu`,
`amd.com/gpu`, `gpu.intel.com/i915`, NVIDIA's MIG and time-slicing names) or, since DRA,
through ResourceClaims whose device class names the driver (`gpu.nvidia.com`). A pod that
uses none of them but carries NVIDIA's env vars, a CUDA image or a GPU node selector was
meant to have one; a pod with none of these signs (a NIC driver DaemonSet) uses no GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from installer.compat import nodelabels
from installer.compat.pods.rules import containers, quantity, resources, selected_keys

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"  # the device plugin's time-slicing name with renameByDefault
MIG_PREFIX = "nvidia.com/mig-"
AMD = "amd.com/gpu"
INTEL_PREFIX = "gpu.intel.com/"
PARTITION = "cloud.google.com/gke-gpu-partition-size"
# DRA device classes of GPU drivers: NVIDIA's (`gpu.nvidia.com`, `mig.nvidia.com`), AMD's
# and Intel's (`gpu.amd.com`, `gpu.intel.com`)
_GPU_CLASS = re.compile(r"(^|\.)nvidia\.com$|^gpu\.(amd|intel)\.com$")
_GPU_DRIVER = re.compile(r"[\"'](gpu\.nvidia\.com|gpu\.amd\.com|gpu\.intel\.com)[\"']")
_CUDA_IMAGE = re.compile(r"(^|/)(cuda|cuda-[a-z]+)(:|$)|cuda|(?<![a-z])cu\d{2,3}(?!\d)",
                         re.IGNORECASE)
_NO_DEVICES = ("void", "none", "")


def vendor(resource: str) -> str:
    """`nvidia`, `amd`, `intel` or "" for a resource name or DRA device class."""
    if resource.startswith("nvidia.com/") or resource.endswith("nvidia.com"):
        return "nvidia"
    if resource.startswith("amd.com/") or resource.endswith("amd.com"):
        return "amd"
    if resource.startswith(INTEL_PREFIX) or resource.endswith("intel.com"):
        return "intel"
    return ""


def is_gpu_resource(name: str, extra: Sequence[str] = ()) -> bool:
    """A GPU device plugin's extended resource (or one given with --resource)."""
    return (name in extra or name in (GPU, SHARED, AMD) or name.startswith(MIG_PREFIX)
            or name.startswith(INTEL_PREFIX))


def mig_profile(resource: str) -> str | None:
    """`1g.10gb` for `nvidia.com/mig-1g.10gb`, else None."""
    return resource[len(MIG_PREFIX):] if resource.startswith(MIG_PREFIX) else None


@dataclass(frozen=True)
class Claim:
    """One DRA claim of the pod: its name there, the object it names, the device class."""

    name: str
    source: str             # "ResourceClaimTemplate/gpu-template" or "ResourceClaim/x"
    device_class: str | None  # None: the claim or template is not in this input
    is_gpu: bool = True

    def describe(self) -> str:
        what = f"device class {self.device_class}" if self.device_class else \
            "not in this input, assumed a GPU"
        return f"DRA claim {self.name} ({self.source}: {what})"


@dataclass(frozen=True)
class Demand:
    """What one PodSpec asks for: GPU resources (pod total, as the scheduler counts) and
    GPU claims; the GPU intent it shows."""

    resources: Mapping[str, Fraction]
    claims: tuple[Claim, ...]
    intent: tuple[str, ...]
    names: tuple[str, ...] = ()   # every GPU resource named, valid quantity or not

    @property
    def uses_gpu(self) -> bool:
        return bool(self.names) or bool(self.claims)

    @property
    def vendors(self) -> set[str]:
        found = {vendor(n) for n in self.names}
        found |= {vendor(c.device_class or "nvidia.com") for c in self.claims}
        return found - {""} or {"nvidia"}

    def mig_profiles(self) -> list[str]:
        return [p for p in map(mig_profile, self.names) if p]


def demand(spec: Mapping[str, Any], others: Iterable[Mapping[str, Any]],
           extra: Sequence[str] = ()) -> Demand:
    """The pod's GPU resources, GPU claims and intent."""
    named = {str(n) for c in containers(spec) for which in ("limits", "requests")
             for n in resources(c, which) if is_gpu_resource(str(n), extra)}
    return Demand(pod_totals(spec, extra), tuple(c for c in claims(spec, others) if c.is_gpu),
                  intent(spec), tuple(sorted(named)))


def pod_totals(spec: Mapping[str, Any], extra: Sequence[str] = ()) -> dict[str, Fraction]:
    """Per GPU resource, what the scheduler counts: the larger of the app containers' sum
    and any one init container (limits, else requests)."""
    totals: dict[str, Fraction] = {}
    init: dict[str, Fraction] = {}
    for field, into in (("containers", totals), ("initContainers", init)):
        found = spec.get(field)
        for container in found if isinstance(found, list) else ():
            if not isinstance(container, dict):
                continue
            asked = {**resources(container, "requests"), **resources(container, "limits")}
            for name, raw in asked.items():
                number = quantity(raw)
                if not is_gpu_resource(str(name), extra) or number is None:
                    continue
                into[str(name)] = (into.get(str(name), Fraction(0)) + number
                                   if field == "containers" else
                                   max(into.get(str(name), Fraction(0)), number))
    for name, number in init.items():
        totals[name] = max(totals.get(name, Fraction(0)), number)
    return totals


def claims(spec: Mapping[str, Any], others: Iterable[Mapping[str, Any]]) -> list[Claim]:
    """The pod's `resourceClaims`, each resolved to its device class where the claim or
    claim template is in the same input."""
    found = spec.get("resourceClaims")
    classes = _device_classes(others)
    gpu_classes = _gpu_device_classes(others)
    result = []
    for entry in found if isinstance(found, list) else ():
        if not isinstance(entry, dict):
            continue
        nested = entry.get("source")  # before Kubernetes 1.31 the names sat under source
        source: Mapping[str, Any] = nested if isinstance(nested, dict) else entry
        for field, kind in (("resourceClaimTemplateName", "ResourceClaimTemplate"),
                            ("resourceClaimName", "ResourceClaim")):
            target = source.get(field)
            if isinstance(target, str):
                device_class = classes.get((kind, target))
                result.append(Claim(str(entry.get("name")), f"{kind}/{target}", device_class,
                                    device_class is None or device_class in gpu_classes
                                    or bool(_GPU_CLASS.search(device_class))))
                break
    return result


def _device_classes(others: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(kind, name) -> the first device class a ResourceClaim(Template) requests."""
    found: dict[tuple[str, str], str] = {}
    for document in others:
        kind = document.get("kind")
        if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
            continue
        meta = document.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        spec: Any = document.get("spec")
        if kind == "ResourceClaimTemplate":
            spec = spec.get("spec") if isinstance(spec, dict) else None
        devices = spec.get("devices") if isinstance(spec, dict) else None
        requests = devices.get("requests") if isinstance(devices, dict) else None
        for request in requests if isinstance(requests, list) else ():
            device_class = _request_class(request)
            if isinstance(name, str) and device_class:
                found[(kind, name)] = device_class
                break
    return found


def _gpu_device_classes(others: Iterable[Mapping[str, Any]]) -> set[str]:
    """DeviceClasses in the input whose CEL selectors pick a GPU driver's devices (a class
    of any name whose `device.driver == "gpu.nvidia.com"`)."""
    found = set()
    for document in others:
        meta = document.get("metadata")
        spec = document.get("spec")
        if document.get("kind") != "DeviceClass" or not isinstance(meta, dict) \
                or not isinstance(spec, dict) or not isinstance(spec.get("selectors"), list):
            continue
        expressions = [str(s.get("cel", {}).get("expression", "")) for s in spec["selectors"]
                       if isinstance(s, dict) and isinstance(s.get("cel"), dict)]
        if any(_GPU_DRIVER.search(e) for e in expressions):
            found.add(str(meta.get("name")))
    return found


def _request_class(request: Any) -> str | None:
    """`deviceClassName` of a request (v1beta1), of `exactly` (v1) or its first subrequest."""
    if not isinstance(request, dict):
        return None
    for holder in (request, request.get("exactly")):
        if isinstance(holder, dict) and isinstance(holder.get("deviceClassName"), str):
            return str(holder["deviceClassName"])
    first = request.get("firstAvailable")
    if isinstance(first, list) and first:
        return _request_class(first[0])
    return None


def claim_containers(spec: Mapping[str, Any], gpu_claims: Sequence[Claim]) -> set[str]:
    """Names of the containers that use one of the GPU claims."""
    wanted = {c.name for c in gpu_claims}
    found = set()
    for container in containers(spec):
        raw = container.get("resources")
        used = raw.get("claims") if isinstance(raw, dict) else None
        if any(isinstance(u, dict) and u.get("name") in wanted
               for u in (used if isinstance(used, list) else ())):
            found.add(str(container.get("name")))
    return found


def intent(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """Signs that the pod means to use an NVIDIA GPU: NVIDIA env vars, a CUDA image, a GPU
    node selector (a MIG partition size too)."""
    signs = []
    for container in containers(spec):
        name = container.get("name")
        found = container.get("env")
        for entry in found if isinstance(found, list) else ():
            if not isinstance(entry, dict):
                continue
            key, value = str(entry.get("name")), entry.get("value")
            if key in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                       "NVIDIA_REQUIRE_CUDA") and str(value or "").lower() not in _NO_DEVICES:
                signs.append(f"container {name} sets {key}")
        image = container.get("image")
        if isinstance(image, str) and _CUDA_IMAGE.search(image.rsplit("@", 1)[0]):
            signs.append(f"container {name} runs the CUDA image {image}")
    signs += [f"selects nodes by {key}" for key in sorted(selected_keys(spec))
              if key not in MACHINE_KEYS and (is_gpu_type_key(key) or key == PARTITION)]
    return tuple(signs)


# GPU-type labels other than ours and gpu-feature-discovery's (nodelabels.type_keys)
TYPE_KEYS = (
    nodelabels.GKE_ACCELERATOR,
    "cloud.google.com/compute-class",          # GKE compute classes (Autopilot: Accelerator)
    "karpenter.k8s.aws/instance-gpu-name",     # Karpenter on EKS: a100, l4, h100
    "eks.amazonaws.com/instance-gpu-name",     # EKS Auto Mode
    "node.kubernetes.io/instance-type",        # the cloud's machine type: g5.xlarge, ...
    "beta.kubernetes.io/instance-type",
    "kubernetes.azure.com/accelerator",        # AKS GPU node pools
)


# keys that pick a GPU type only on GPU machines: selecting one shows no GPU intent
MACHINE_KEYS = ("cloud.google.com/compute-class", "node.kubernetes.io/instance-type",
                "beta.kubernetes.io/instance-type")


def is_gpu_type_key(key: str) -> bool:
    """Does a nodeSelector or affinity key pick a GPU type (or a machine that fixes one)?"""
    return key in TYPE_KEYS or nodelabels.names_gpu_type(key)
