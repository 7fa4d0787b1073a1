"""Node labels that describe the GPUs, so pods can pick a GPU type with a nodeSelector.

Kubernetes counts `nvidia.com/gpu` but cannot tell an A100 from a T4; a label per GPU fact
lets a pod select one. Keys follow NVIDIA gpu-feature-discovery's names (`gpu.product`,
`gpu.count`, `gpu.memory`, `gpu.family`, `gpu.compute.major/minor`,
`cuda.driver.major/minor/rev`, `cuda.runtime.major/minor`) under our prefix, or under
`nvidia.com/` for clusters without gpu-feature-discovery. Keys of our own invention always
stay under our prefix. `check-pod` reads the same keys back, so both live here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from installer.compat.toolkit import max_cuda_for_driver, minor_compat_major
from installer.node.gpus import ARCHITECTURES

OWN_PREFIX = "gpu-node-installer"
NVIDIA_PREFIX = "nvidia.com"
PREFIXES = (OWN_PREFIX, NVIDIA_PREFIX)
MIXED = "mixed"
# The annotation that remembers which keys we wrote, so keys outside our own prefix
# (nvidia.com/...) are removed when stale and never confused with another writer's.
OWNED_ANNOTATION = f"{OWN_PREFIX}/labels"
# gpu-feature-discovery's names: they take the configured prefix
GFD_SUFFIXES = ("gpu.product", "gpu.count", "gpu.memory", "gpu.family", "gpu.compute.major",
                "gpu.compute.minor", "cuda.driver.major", "cuda.driver.minor",
                "cuda.driver.rev", "cuda.runtime.major", "cuda.runtime.minor")
# gpu-feature-discovery's labels of a MIG device's NVML attributes, after its resource
# (k8s-device-plugin internal/resource/nvml-mig-device.go @ 1b826acc, GetAttributes)
MIG_ATTRIBUTES = ("memory", "multiprocessors", "slices.gi", "slices.ci", "engines.copy",
                  "engines.decoder", "engines.encoder", "engines.jpeg", "engines.ofa")
# keys that name a GPU type, whatever their prefix (check-pod's "selects a GPU type")
TYPE_SUFFIXES = ("gpu.product", "gpu.family", "gpu.memory", "gpu.compute.major",
                 "gpu.compute.minor")
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
# The upgrade flow's keys: its progress, and the operator's opt-out. Not GPU
# facts, so the signal stage's stale-label cleanup leaves them alone.
UPGRADE_STATE = f"{OWN_PREFIX}/upgrade-state"
UPGRADE_SKIP = f"{OWN_PREFIX}/upgrade.skip"
# DRIVER_VERSION_MAP: the operator's per-node version (kept), and the rule that chose the
# version, written after each successful install while the map is in use (so removed as
# stale once it is not)
VERSION_OVERRIDE = f"{OWN_PREFIX}/driver-version.override"
VERSION_RULE = f"{OWN_PREFIX}/driver-version.rule"
UPGRADE_KEYS = (UPGRADE_STATE, UPGRADE_SKIP, VERSION_OVERRIDE)
# MIG: the partition stage's progress, as mig-parted's mig.config.state says it
MIG_STATE = f"{OWN_PREFIX}/mig.config.state"
MODEL_SUFFIX = "gpu.model."  # gpu-node-installer/gpu.model.<product>=<count>, one per model

_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# compute capability major -> gpu-feature-discovery's family name
FAMILIES = {3: "kepler", 5: "maxwell", 6: "pascal", 8: "ampere", 9: "hopper",
            10: "blackwell", 12: "blackwell"}


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as the labels need it (NVML's name, memory and capability; PCI's family)."""

    name: str
    memory_mib: int | None = None
    compute_capability: str | None = None  # "8.0"
    architecture: str | None = None  # detect's name, used when the capability is unknown


def sanitize(value: str) -> str:
    """A Kubernetes label value: runs of other characters become `-`, at most 63
    characters, starting and ending with a letter or digit (spaces -> `-`, as GFD does)."""
    text = _VALUE_BAD.sub("-", value.strip())[:63]
    return text.strip("-_.")


def valid_value(value: str) -> bool:
    """Kubernetes' label-value syntax."""
    return len(value) <= 63 and bool(_VALUE_RE.match(value))


def valid_key(key: str) -> bool:
    """Kubernetes' label-key syntax: an optional DNS-subdomain prefix, a name of <= 63."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not re.fullmatch(
            r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", prefix)):
        return False
    return len(name) <= 63 and bool(_NAME_RE.match(name))


def family(capability: str | None, architecture: str | None) -> str | None:
    """GFD's family for a compute capability (7.0-7.2 volta, 7.5 turing, 8.9 ada-lovelace),
    else detect's architecture in the same spelling."""
    if capability:
        major, _, minor = capability.partition(".")
        if major.isdigit() and minor.isdigit():
            if int(major) == 7:
                return "volta" if int(minor) < 5 else "turing"
            if int(major) == 8 and int(minor) == 9:
                return "ada-lovelace"
            if int(major) in FAMILIES:
                return FAMILIES[int(major)]
    if architecture and architecture != "unknown":
        known = ARCHITECTURES.get(architecture)
        return sanitize((known.generation if known else architecture).lower())
    return None


def _capability_key(capability: str) -> tuple[int, int]:
    major, _, minor = capability.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (0, 0)


def gpu_labels(gpus: Sequence[GpuFacts], *, driver: str, cuda: str, flavour: str | None,
               prefix: str = OWN_PREFIX) -> dict[str, str]:
    """The GPU labels of a node. A mixed node (more than one model) says `mixed` for the
    product (a pod asking for one model must not land where the device plugin may hand it
    the other), the smallest memory and lowest compute capability (what every GPU there
    offers), `mixed` for the family when families differ, and one
    `gpu-node-installer/gpu.model.<product>=<count>` label per model on every node."""
    labels: dict[str, str] = {}

    def put(key: str, value: object) -> None:
        text = sanitize(str(value))
        if text:
            labels[key] = text

    gfd = f"{prefix}/"
    own = f"{OWN_PREFIX}/"
    models = Counter(sanitize(g.name) or "unknown" for g in gpus)
    put(gfd + "gpu.count", len(gpus))
    if gpus:
        put(gfd + "gpu.product", next(iter(models)) if len(models) == 1 else MIXED)
        memories = [g.memory_mib for g in gpus if g.memory_mib]
        if memories and len(memories) == len(gpus):
            put(gfd + "gpu.memory", min(memories))
        capabilities = [g.compute_capability for g in gpus if g.compute_capability]
        if capabilities and len(capabilities) == len(gpus):
            major, minor = min(_capability_key(c) for c in capabilities)
            put(gfd + "gpu.compute.major", major)
            put(gfd + "gpu.compute.minor", minor)
        families = {family(g.compute_capability, g.architecture) for g in gpus}
        if None not in families:
            put(gfd + "gpu.family", families.pop() if len(families) == 1 else MIXED)
        for model, count in models.items():
            put(own + (MODEL_SUFFIX + model)[:63].rstrip("-_."), count)
    parts = driver.split(".")
    for name, part in zip(("major", "minor", "rev"), parts, strict=False):
        put(gfd + f"cuda.driver.{name}", part)
    runtime = cuda.split(".")
    if len(runtime) >= 2:
        put(gfd + "cuda.runtime.major", runtime[0])
        put(gfd + "cuda.runtime.minor", runtime[1])
    newest, compat_major = max_cuda_for_driver(driver), minor_compat_major(driver)
    if newest:
        put(own + "cuda.toolkit.max", newest)
    if compat_major is not None:
        put(own + "cuda.compat.major", compat_major)
    if flavour:
        put(own + "driver.flavour", flavour)
    return labels


@dataclass(frozen=True)
class MigFacts:
    """One GPU's MIG layout as the labels need it (the partition stage's record)."""

    name: str
    memory_mib: int
    mig_enabled: bool
    devices: tuple[tuple[str, int], ...]  # (profile, count)
    # profile -> NVML's figures of one of its MIG devices (nvmlDeviceGetAttributes) under
    # gpu-feature-discovery's names (`memory`, `multiprocessors`, `engines.copy`, ...)
    attributes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def _slice_facts(gpus: Sequence[MigFacts]) -> dict[str, dict[str, int]]:
    """Per profile, the labels' figures: NVML's own where the record has them (as GFD
    labels a MIG device: k8s-device-plugin internal/lm/resource.go @ 1b826acc,
    newMigAttributeLabels), else the table's nominal memory and slices."""
    from installer.compat.mig import mig_model

    facts: dict[str, dict[str, int]] = {}
    for gpu in gpus:
        model = mig_model(gpu.name, gpu.memory_mib)
        for profile, _ in gpu.devices if gpu.mig_enabled else ():
            if gpu.attributes.get(profile):
                facts[profile] = dict(gpu.attributes[profile])
                continue
            known = model.profiles.get(profile) if model is not None else None
            if known is not None and profile not in facts:
                facts[profile] = {"memory": int(known.memory_gib * 1024),
                                  "slices.gi": known.slices, "slices.ci": known.slices}
    return facts


def mig_labels(gpus: Sequence[MigFacts], *, strategy: str, prefix: str = OWN_PREFIX
               ) -> dict[str, str]:
    """gpu-feature-discovery's MIG labels. `single` (every GPU in MIG mode with one
    profile): the slice is the GPU, `gpu.product=<model>-MIG-<profile>`, `gpu.count` the
    slices, `gpu.memory` a slice's MiB; otherwise (or `mixed`) `mig-<profile>.count` and
    friends beside the full GPUs' labels. None when no GPU is in MIG mode."""
    if not any(g.mig_enabled for g in gpus):
        return {}
    counts: Counter[str] = Counter()
    for gpu in gpus:
        for profile, count in gpu.devices if gpu.mig_enabled else ():
            counts[profile] += count
    facts = _slice_facts(gpus)
    names = {sanitize(g.name) for g in gpus}
    uniform = (all(g.mig_enabled for g in gpus) and len(counts) == 1 and len(names) == 1)
    p = f"{prefix}/"
    if strategy == "single" and uniform:
        (profile, count), = counts.items()
        labels = {p + "mig.strategy": "single", p + "gpu.count": str(count),
                  p + "gpu.product": sanitize(f"{names.pop()}-MIG-{profile}")}
        labels |= {p + f"gpu.{k}": str(v) for k, v in facts.get(profile, {}).items()}
        return labels
    labels = {p + "mig.strategy": "mixed"}
    for profile, count in sorted(counts.items()):
        key = p + f"mig-{sanitize(profile)}"
        labels[key + ".count"] = str(count)
        labels |= {key + f".{k}": str(v) for k, v in facts.get(profile, {}).items()}
    return labels


def is_ours(key: str, owned: Iterable[str] = ()) -> bool:
    """Our prefix is ours alone; another prefix's key only when we recorded writing it."""
    return key.startswith(f"{OWN_PREFIX}/") or key in set(owned)


def owned_keys(annotations: Mapping[str, str] | None) -> tuple[str, ...]:
    """The keys our annotation says we wrote last time."""
    text = (annotations or {}).get(OWNED_ANNOTATION, "")
    return tuple(k for k in text.split(",") if k)


def label_patch(current: Mapping[str, str], annotations: Mapping[str, str] | None,
                labels: Mapping[str, str]) -> dict[str, object]:
    """A merge patch setting `labels` and removing (null) our keys that are no longer
    true; labels of others are never touched."""
    owned = owned_keys(annotations)
    body: dict[str, str | None] = {key: None for key in sorted(current)
                                   if key not in labels
                                   and key not in (*UPGRADE_KEYS, MIG_STATE)
                                   and is_ours(key, owned)}
    body.update(labels)
    foreign = ",".join(sorted(k for k in labels if not k.startswith(f"{OWN_PREFIX}/")))
    return {"metadata": {"labels": body, "annotations": {OWNED_ANNOTATION: foreign or None}}}


def type_keys(prefixes: Sequence[str] = PREFIXES) -> frozenset[str]:
    """Label keys that name a GPU type (for `check-pod`)."""
    return frozenset({GKE_ACCELERATOR} | {f"{p}/{s}" for p in prefixes for s in TYPE_SUFFIXES})


def names_gpu_type(key: str) -> bool:
    """Does a nodeSelector or affinity key pick a GPU type?"""
    return key in type_keys() or key.startswith(f"{OWN_PREFIX}/{MODEL_SUFFIX}")
