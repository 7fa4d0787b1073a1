"""Where the pod will run: the GPU taint each platform's GPU nodes carry, and whether its
admission adds the matching toleration, so `toleration` judges what the cluster really does.

- GKE taints GPU node pools `nvidia.com/gpu=present:NoSchedule` (when the cluster has other
  pools) and enables the ExtendedResourceToleration admission plugin, which adds a toleration
  keyed by each extended resource a pod requests: so `nvidia.com/gpu` pods are covered, pods
  asking for another name (`nvidia.com/mig-1g.5gb`) or a DRA claim are not.
- AKS does not taint GPU pools itself; its documentation's convention is
  `sku=gpu:NoSchedule`, and AKS runs no ExtendedResourceToleration (Azure/AKS#1449).
- EKS: managed node groups do not taint; Karpenter and EKS Auto Mode GPU NodePools carry
  `nvidia.com/gpu:NoSchedule` by convention; no admission adds tolerations.
- Elsewhere (kubeadm, the GPU operator, which taints nothing) `nvidia.com/gpu:NoSchedule` is
  the common convention, if the operator tainted the nodes at all.
Without a Node these are expectations (WARN); with one, its own taints decide (FAIL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from installer.compat.pods.gpus import GPU

NAMES = ("gke", "aks", "eks", "generic")
_PREFIXES = {
    "gke": ("cloud.google.com/gke-",),
    "aks": ("kubernetes.azure.com/",),
    "eks": ("eks.amazonaws.com/", "karpenter.k8s.aws/", "k8s.amazonaws.com/", "karpenter.sh/"),
}


@dataclass(frozen=True)
class Platform:
    """A platform's GPU node conventions, and how it was chosen."""

    name: str
    taint: Mapping[str, str]     # the NVIDIA GPU taint its GPU nodes usually carry
    admission: bool              # ExtendedResourceToleration adds tolerations
    source: str                  # "--platform", "the node's labels", ...

    def expected_taint(self, resource: str) -> dict[str, str]:
        """The taint a node offering `resource` usually carries: the platform's NVIDIA taint
        for NVIDIA's resources and DRA, the resource's own name for other vendors'."""
        if resource.startswith("nvidia.com/") or not resource:
            return dict(self.taint)
        return {"key": resource, "effect": "NoSchedule"}

    def adds_toleration(self, taint: Mapping[str, object], requested: Iterable[str]) -> bool:
        """Would admission add a toleration for this taint (a requested resource's name)?"""
        key = taint.get("key")  # a Node from a file: anything YAML allows
        return self.admission and taint.get("effect") == "NoSchedule" \
            and isinstance(key, str) and key in set(requested)

    def describe(self) -> str:
        shown = _taint_text(self.taint)
        admits = ("its admission adds a toleration for each extended resource a pod requests "
                  f"(so for {GPU}, not for MIG names or DRA claims)") if self.admission else \
            "nothing adds tolerations for you"
        return f"{self.name} (from {self.source}): GPU nodes usually tainted {shown}; {admits}"


def _taint_text(taint: Mapping[str, object]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def make(name: str, source: str) -> Platform:
    """The platform called `name` (one of NAMES)."""
    if name == "gke":
        return Platform("gke", {"key": GPU, "value": "present", "effect": "NoSchedule"},
                        admission=True, source=source)
    if name == "aks":
        return Platform("aks", {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
                        admission=False, source=source)
    return Platform(name, {"key": GPU, "effect": "NoSchedule"}, admission=False,
                    source=source)


def from_labels(labels: Mapping[str, str]) -> str | None:
    """gke, aks or eks when the node's labels say so; None otherwise."""
    for name, prefixes in _PREFIXES.items():
        if any(key.startswith(prefixes) for key in labels):
            return name
    return None


def choose(wanted: str, label_sets: Iterable[Mapping[str, str]],
           selector_keys: Iterable[str]) -> Platform:
    """`--platform`: a name, or `auto` from the nodes' labels, else from the workloads'
    node selectors (a GKE sample selects cloud.google.com/gke-accelerator), else generic."""
    if wanted != "auto":
        return make(wanted, "--platform")
    for labels in label_sets:
        found = from_labels(labels)
        if found:
            return make(found, "the node's labels")
    keyed = from_labels(dict.fromkeys(selector_keys, ""))
    if keyed:
        return make(keyed, "the workloads' node selectors")
    return make("generic", "no platform labels seen")
