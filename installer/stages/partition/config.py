"""Where the wanted MIG layout comes from, read into one `Source` before any NVML call.

In order, the first that is set wins:
1. GKE's `/etc/nvidia/gpu_config.json` on the node (`{"GPUPartitionSize": "1g.5gb"}`, what a
   node pool's `gpu-partition-size` writes): every GPU gets as many of that profile as fit;
2. a mig-parted file (MIG_CONFIG_FILE: `version: v1`, `mig-configs: {name: [entries]}`) with
   the config named by MIG_CONFIG or else the node's `nvidia.com/mig.config` label;
3. MIG_PROFILE: one profile for every GPU, as GKE's file would say it.
None of them: `find` returns None and the stage touches nothing (no NVML, no API call).
A malformed source is MigConfigError (exit 2) naming the file, the field and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from installer.context import Context
from installer.errors import MigConfigError
from installer.node.documents import quote, read_document, read_yaml
from installer.node.files import read_regular
from installer.stages.partition import plan
from installer.stages.partition.plan import GpuLayout, GpuNow

GKE_CONFIG = PurePosixPath("/etc/nvidia/gpu_config.json")
GKE_FIELD = "GPUPartitionSize"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
_MAX_BYTES = 1024 * 1024
_ENTRY_KEYS = frozenset({"devices", "device-filter", "mig-enabled", "mig-devices"})


@dataclass(frozen=True)
class Entry:
    """One entry of a mig-parted config: which GPUs, and what they become."""

    devices: tuple[int, ...] | None  # None: all
    device_filter: tuple[str, ...]  # PCI ids as `0xDDDDVVVV` (upper case); empty: any GPU
    layout: GpuLayout
    where: str = ""  # the entry in its file, for an error line


@dataclass(frozen=True)
class Source:
    """The wanted layout as configured: one profile for every GPU, or mig-parted entries."""

    origin: str  # what an operator reads: the file (and config) or the setting
    fill: str | None = None
    entries: tuple[Entry, ...] = ()

    def layouts(self, gpus: list[GpuNow], pci_id: Callable[[GpuNow], str | None],
                skip: Callable[[GpuNow], None] | None = None) -> dict[int, GpuLayout]:
        """The layout per GPU index; a GPU no entry names is left out (and left alone).

        As mig-parted does, `devices: all` passes over a GPU without MIG (`skip` is told
        of it) rather than refusing the node; naming that GPU by index still refuses."""
        if self.fill is not None:
            return {gpu.index: _filled(gpu, self.fill) for gpu in gpus}
        wanted: dict[int, GpuLayout] = {}
        skipped: set[int] = set()
        for entry in self.entries:
            _on_this_node(entry, gpus)
            for gpu in gpus:
                if entry.devices is not None and gpu.index not in entry.devices:
                    continue
                if entry.device_filter and not any(
                        _matches(f, pci_id(gpu) or "") for f in entry.device_filter):
                    continue
                if entry.devices is None and plan.model_of(gpu) is None:
                    if entry.layout.mig_enabled and skip and gpu.index not in skipped:
                        skip(gpu)
                    skipped.add(gpu.index)
                    continue
                wanted[gpu.index] = entry.layout  # a later entry wins, as in mig-parted
        return wanted


def _matches(wanted: str, hardware: str) -> bool:
    """mig-parted's device-filter match: `0xDDDDVVVV` matches the device and vendor;
    `0xDDDDVVVV:0xSSSSVVVV` also needs the subsystem device and vendor to match."""
    return wanted == hardware if ":" in wanted else wanted == hardware.split(":")[0]


def _on_this_node(entry: Entry, gpus: list[GpuNow]) -> None:
    """An entry naming a GPU index the node lacks is refused (as mig-parted's `devices`
    out of range), not quietly applied to the GPUs it does have."""
    have = sorted(gpu.index for gpu in gpus)
    lacking = sorted(set(entry.devices or ()) - set(have))
    if lacking:
        shown = f"{have[0]} to {have[-1]}" if have == list(range(have[0], have[-1] + 1)) \
            and len(have) > 2 else ", ".join(map(str, have)) or "none"
        raise MigConfigError(
            f"{entry.where}.devices names GPU {', '.join(map(str, lacking))}, which this node "
            f"lacks (it has {len(have)} GPU{'s' if len(have) != 1 else ''}: {shown})",
            remedy="name only the node's GPU indexes, or devices: all")


def _filled(gpu: GpuNow, profile: str) -> GpuLayout:
    """As many of `profile` as fit this GPU; one where the GPU lacks it, so that the plan's
    validation refuses it naming the sizes the GPU offers."""
    model = plan.model_of(gpu)
    count = model.fill(profile) if model is not None and profile in model.profiles else 1
    return GpuLayout(True, ((profile, count),))


def find(ctx: Context) -> Source | None:
    """The configured source, or None when MIG is not configured on this node."""
    gke = ctx.host.roots.node(GKE_CONFIG)
    text = _read(gke)
    if text is not None:
        return gke_source(text, GKE_CONFIG)
    config = ctx.config
    if config.mig_config_file is not None:
        name = config.mig_config or _label(ctx)
        text = _read(config.mig_config_file)
        if text is None:
            raise MigConfigError(f"MIG_CONFIG_FILE {config.mig_config_file} cannot be read",
                                 remedy="mount the mig-parted config there (a ConfigMap) or "
                                        "unset MIG_CONFIG_FILE")
        return mig_parted_source(text, str(config.mig_config_file), name)
    if config.mig_profile:
        return Source(f"MIG_PROFILE={config.mig_profile}", fill=config.mig_profile)
    return None


def _read(path: Path) -> str | None:
    """The file's text (None: absent); a directory, FIFO, unreadable or oversized file is
    refused naming it (opened non-blocking: a FIFO in its place cannot hang the run)."""
    data = read_regular(path, _MAX_BYTES, error=MigConfigError,
                        remedy="make it a regular, readable file, or remove it")
    return None if data is None else data.decode("utf-8", errors="replace")


def gke_source(text: str, path: PurePosixPath | str) -> Source | None:
    """GKE's file: `GPUPartitionSize` names one profile; empty or absent means none."""
    try:
        document = read_document(text.encode("utf-8", "replace"), name=str(path),
                                 limit=_MAX_BYTES, error=MigConfigError)
    except MigConfigError as exc:  # the bounded loader's line, with this file's remedy
        raise MigConfigError(exc.message,
                             remedy=f'write {{"{GKE_FIELD}": "1g.5gb"}} or remove the file'
                             ) from None
    if not isinstance(document, dict):
        raise MigConfigError(f"{path} is not a JSON object",
                             remedy=f'write {{"{GKE_FIELD}": "1g.5gb"}} or remove the file')
    size = document.get(GKE_FIELD)
    if size in (None, ""):
        return None  # GKE's own partitioner does nothing then, nor do we
    if not isinstance(size, str):
        raise MigConfigError(f"{path}: {GKE_FIELD} is {quote(size)}, not a profile name",
                             remedy=f"set {GKE_FIELD} to a size like 1g.5gb (the node pool's "
                                    "gpu-partition-size)")
    return Source(f"{path} ({GKE_FIELD}={size})", fill=size.strip())


def mig_parted_source(text: str, path: str, name: str | None) -> Source:
    """mig-parted's `version: v1` file, the config `name` of it."""
    import yaml  # type: ignore[import-untyped]

    try:
        documents = read_yaml(text, name=path, error=MigConfigError)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        what = ("is not YAML" if isinstance(exc, yaml.YAMLError)
                else f"holds a value YAML cannot build ({quote(str(exc), 60)})")
        raise MigConfigError(f"{path} {what}{line}",
                             remedy="fix the YAML (mig-parted's format: version: v1, "
                                    "mig-configs)") from None
    document = documents[0] if len(documents) == 1 else None
    if not isinstance(document, dict) or document.get("version") != "v1":
        raise MigConfigError(f"{path}: version is not v1",
                             remedy="start the file with `version: v1` (mig-parted's format)")
    unknown = sorted(str(key) for key in document if key not in ("version", "mig-configs"))
    if unknown:
        raise MigConfigError(f"{path} has unknown top-level field {quote(unknown[0])}",
                             remedy="use only version and mig-configs, as mig-parted does")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError(f"{path}: mig-configs is missing or not a mapping",
                             remedy="add `mig-configs:` with one named list of entries")
    if not name:
        raise MigConfigError(f"{path}: no config chosen (node label {MIG_CONFIG_LABEL} "
                             "absent and MIG_CONFIG unset)",
                             remedy=f"label the node {MIG_CONFIG_LABEL}=<one of "
                                    f"{_names(configs)}> or set MIG_CONFIG")
    if name not in configs:
        raise MigConfigError(f"{path}: mig-configs has no config {quote(name)}",
                             remedy=f"choose one of {_names(configs)}")
    entries = configs[name]
    if not isinstance(entries, list) or not entries:
        raise MigConfigError(f"{path}: mig-configs.{name} is not a list of entries",
                             remedy="give it entries with devices, mig-enabled, mig-devices")
    where = f"{path}: mig-configs.{name}"
    return Source(f"{path} (config {name})",
                  entries=tuple(_entry(e, f"{where}[{i}]") for i, e in enumerate(entries)))


def _names(configs: Mapping[Any, Any], most: int = 8) -> str:
    """The config names a remedy offers, each quoted and at most `most` of them."""
    shown = ", ".join(quote(str(name), 40) for name in list(configs)[:most])
    return shown + (f" (and {len(configs) - most} more)" if len(configs) > most else "")


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise MigConfigError(f"{where} is not a mapping",
                             remedy="each entry has devices, mig-enabled, mig-devices")
    unknown = sorted(set(map(str, raw)) - _ENTRY_KEYS)
    if unknown:
        raise MigConfigError(f"{where} has unknown field {quote(unknown[0])}",
                             remedy=f"use only {', '.join(sorted(_ENTRY_KEYS))}")
    enabled = raw.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{where}.mig-enabled is {quote(enabled)}",
                             remedy="set mig-enabled: true or false")
    devices = _devices(raw.get("devices"), where)
    device_filter = _filter(raw.get("device-filter"), where)
    if enabled and raw.get("mig-devices") is None:
        raise MigConfigError(f"{where} has mig-enabled true but no mig-devices",
                             remedy='add mig-devices (e.g. "1g.10gb": 7), or mig-devices: {} '
                                    "for MIG on with no instances")
    counts = _mig_devices(raw.get("mig-devices"), f"{where}.mig-devices", enabled=enabled)
    return Entry(devices, device_filter,
                 GpuLayout(enabled, tuple(sorted(counts.items()))), where)


_DEVICES_FIX = "set devices: all, or a list of GPU indexes like [0, 1]"
_EXAMPLE_ID = "0x20B010DE"
_MAX_GPUS = 64  # more GPUs than any node has: beyond it an index is a typo


def _devices(raw: Any, where: str) -> tuple[int, ...] | None:
    """mig-parted's `devices`: `all` or a list of GPU indexes (which of them this node has
    is checked against its GPUs, `_on_this_node`)."""
    if raw == "all":
        return None
    if not isinstance(raw, list) or not raw:
        raise MigConfigError(f"{where}.devices is {_shown(raw)}, not `all` or a list of GPU "
                             "indexes", remedy=_DEVICES_FIX)
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, int):
            raise MigConfigError(f"{where}.devices holds {_shown(item)}, not a GPU index",
                                 remedy=_DEVICES_FIX)
        if not 0 <= item < _MAX_GPUS:
            raise MigConfigError(f"{where}.devices holds {_shown(item)}: GPU indexes run from "
                                 f"0 to {_MAX_GPUS - 1} at most", remedy=_DEVICES_FIX)
    return tuple(sorted(set(raw)))


def _shown(value: Any) -> str:
    """A value of a config in an error line, bounded (a YAML number may be long)."""
    text = repr(value) if not isinstance(value, int) or len(str(value)) <= 40 else \
        f"a number of {len(str(value))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def _filter(raw: Any, where: str) -> tuple[str, ...]:
    """`device-filter`: one PCI id or a list of them, as `0x20B010DE` (device, vendor), or
    `0x20B210DE:0x147E10DE` (and the subsystem device and vendor, as mig-parted reads them
    since its commit 3882a4d6)."""
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str | int) and not isinstance(raw, bool) else raw
    if not isinstance(items, list) or not items:
        raise MigConfigError(f"{where}.device-filter is {_shown(raw)}",
                             remedy=f"give PCI ids as 0x<device><vendor>, e.g. {_EXAMPLE_ID}")
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 1 << 32:
            raise MigConfigError(  # YAML reads an unquoted 0x20B010DE as a number
                f"{where}.device-filter holds the number {item} (0x{item:08X} unquoted: "
                "YAML reads 0x... as a number)",
                remedy=f'quote each PCI id: device-filter: "0x{item:08X}"')
        if not isinstance(item, str) or _pci_id(item) is None:
            raise MigConfigError(f"{where}.device-filter holds {_shown(item)}, not a PCI id",
                                 remedy="give PCI ids as quoted 0x<device><vendor>, e.g. "
                                        f'"{_EXAMPLE_ID}"')
    return tuple(_pci_id(i) or "" for i in items)


def _pci_id(text: str) -> str | None:
    """`0xDDDDVVVV` or `0xDDDDVVVV:0xSSSSVVVV` in one spelling (upper case), else None."""
    parts = [_one_id(part) for part in text.split(":")]
    return None if len(parts) > 2 or None in parts else ":".join(map(str, parts))


def _one_id(text: str) -> str | None:
    body = text.strip().lower().removeprefix("0x")
    if len(body) != 8 or any(c not in "0123456789abcdef" for c in body):
        return None
    return "0x" + body.upper()


def _mig_devices(raw: Any, where: str, *, enabled: bool) -> dict[str, int]:
    if raw is None or raw == {}:
        return {}
    if not enabled:
        raise MigConfigError(f"{where} is set but mig-enabled is false",
                             remedy="remove mig-devices or set mig-enabled: true")
    if not isinstance(raw, Mapping):
        raise MigConfigError(f"{where} is not a mapping",
                             remedy='write profile: count pairs, e.g. "1g.10gb": 7')
    counts: dict[str, int] = {}
    for profile, count in raw.items():
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 7:
            raise MigConfigError(f"{where}.{str(profile)[:40]} is {quote(count)}",
                                 remedy="give a whole count from 0 to 7")
        if count:
            counts[str(profile)] = count
    if not counts:
        raise MigConfigError(f"{where} gives every profile a count of 0",
                             remedy="give at least one profile a count of 1 or more, or "
                                    "write mig-devices: {} for MIG on with no instances")
    return counts


def pci_ids(ctx: Context) -> Callable[[GpuNow], str | None]:
    """`0xDDDDVVVV:0xSSSSVVVV` of a GPU from sysfs (device, vendor, subsystem device and
    vendor: what mig-parted's device-filter matches); `0xDDDDVVVV` without a subsystem."""
    def read(gpu: GpuNow) -> str | None:
        domain, _, rest = gpu.pci_bus_id.strip().lower().partition(":")
        try:
            address = f"{int(domain, 16):04x}:{rest}"
        except ValueError:
            return None
        base = ctx.host.roots.sys / "bus" / "pci" / "devices" / address
        def pair(first: str, second: str) -> str | None:
            one = (ctx.host.read_text(base / first) or "").strip().removeprefix("0x")
            two = (ctx.host.read_text(base / second) or "").strip().removeprefix("0x")
            return _one_id(one + two)
        primary = pair("device", "vendor")
        subsystem = pair("subsystem_device", "subsystem_vendor")
        return primary and (f"{primary}:{subsystem}" if subsystem else primary)
    return read


def _label(ctx: Context) -> str | None:
    """The node's `nvidia.com/mig.config` label, through the Kubernetes API when set up."""
    node = ctx.config.node_name
    if not node:
        return None
    from installer.node import kube

    api = kube.connect(ctx.config, os.environ)
    if api is None:
        return None
    try:
        labels, _ = kube.node_metadata(api, node)
    except kube.KubeError as exc:
        raise MigConfigError(f"the node's {MIG_CONFIG_LABEL} label cannot be read: {exc}",
                             remedy="check the API server and the installer's RBAC "
                                    "(nodes get), or set MIG_CONFIG") from exc
    return labels.get(MIG_CONFIG_LABEL) or None
