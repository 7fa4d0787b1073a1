"""A Node's GPU model and architecture from its labels, for checks made off the node
(`preflight`): gpu-feature-discovery's (or our) `gpu.product` and `gpu.family`, else GKE's
`cloud.google.com/gke-accelerator`.

No table of its own: a product or accelerator name (`NVIDIA-A100-SXM4-40GB`,
`nvidia-tesla-t4`, `nvidia-h200-141gb`) is matched by its model word against the PCI id
table's marketing names (`node.gpus.DEVICES`), and a family against its architectures.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from installer.compat.nodelabels import GKE_ACCELERATOR, PREFIXES, sanitize
from installer.node.gpus import ARCHITECTURES, DEVICES

_NOISE = ("nvidia", "tesla", "geforce", "quadro")
_WORD = re.compile(r"[A-Za-z0-9]+")


def _model_word(name: str) -> str | None:
    """The model word of a product or marketing name: `A100`, `T4`, `GH200`."""
    words = [w.lower() for w in _WORD.findall(name)]
    kept = [w for w in words if w not in _NOISE]
    return kept[0] if kept else None


def _by_model() -> dict[str, str]:
    models: dict[str, str] = {}
    for name, arch in DEVICES.values():
        word = _model_word(name)
        if word is not None:
            models.setdefault(word, arch)
    return models


_MODELS = _by_model()
_FAMILIES = {sanitize(a.name.lower()): a.name for a in ARCHITECTURES.values()
             if a.name != "unknown" and not a.family}


def architecture_of(name: str) -> str | None:
    """The architecture a model, product, accelerator or architecture name stands for
    (`B200`, `NVIDIA-B200`, `nvidia-b200`, `blackwell`); None when unknown."""
    family = _FAMILIES.get(sanitize(name.lower()))
    if family is not None:
        return family
    for arch in ARCHITECTURES:
        if arch.lower() == name.strip().lower():
            return arch
    word = _model_word(name)
    return _MODELS.get(word) if word else None


def gpu_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(model as labelled, architecture) of a Node's GPUs, or None when no label names one
    (a `mixed` product falls back to the family)."""
    for prefix in PREFIXES:
        product = labels.get(f"{prefix}/gpu.product")
        if product and product != "mixed":
            arch = architecture_of(product)
            if arch is not None:
                return product, arch
        family = labels.get(f"{prefix}/gpu.family")
        if family and family != "mixed":
            arch = _FAMILIES.get(family.lower())
            if arch is not None:
                return product or family, arch
    accelerator = labels.get(GKE_ACCELERATOR)
    if accelerator:
        arch = architecture_of(accelerator)
        if arch is not None:
            return accelerator, arch
    return None
