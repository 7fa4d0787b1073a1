"""The partition stage: split GPUs into MIG instances as the node's config asks.

After verify, before signal: readiness is written only once the GPUs are as configured.
Without a config (`config.find` is None) it does nothing at all, no NVML call. Otherwise:
read every GPU through NVML, refuse a layout a GPU cannot take before anything changes,
apply only what differs. A GPU in use is never repartitioned: its holders are named
(exit 10) or, under UPGRADE_POLICY=evict|drain, freed by the pipeline's eviction callable.
A mode change that needs a reset (A100) gets one when nothing holds the GPU, as mig-parted
resets it (`gpureset`: `nvidia-smi -r` for that GPU with the driver loaded, the PCI sysfs
reset only without); if the mode still waits, MIG_REBOOT decides between refusing and a
node reboot, behind mig-manager's guards (`reboots`): never again after a reboot that left
the mode pending, never without the state recorded. The instances' capability device nodes
are made last; the Node's `mig.config.state` label follows it (pending, success, failed,
rebooting).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

from installer.compat import mignvml
from installer.compat.mig import mig_model
from installer.compat.nodelabels import MIG_STATE
from installer.context import Context
from installer.errors import InstallerError, MigInUseError, UpgradeBlockedError
from installer.installdir import migrecord
from installer.installdir.readiness import clear_readiness
from installer.node import gpureset, pci
from installer.node.holders import Holder, find_holders
from installer.stages.partition import caps, config, plan, reboots
from installer.stages.partition.plan import GpuChange, GpuNow

_MINOR_RE = re.compile(r"^Device Minor:\s*(\d+)", re.M)
# mig-manager's state label and values, pending, rebooting, success, failed (mig-parted
# pkg/mig/reconfigure/reconfigure.go @ bd7160f4: migConfigStateLabel, migState*), written
# too in the operator-compatible overlay's mode (DRIVER_ROOT_LAYOUT=true), where the
# operator's tools read it
OPERATOR_MIG_STATE = "nvidia.com/mig.config.state"


class MigRebootRefusedError(UpgradeBlockedError):
    """A MIG mode change waits for a reboot and MIG_REBOOT=refuse (exit 15)."""


class MigRebootFailedError(MigRebootRefusedError):
    """MIG_REBOOT=reboot, but a guard forbids this reboot: the mode stayed pending after one,
    this boot's limit is spent, or the `rebooting` state could not be recorded (exit 15)."""


class NodeRebootingError(MigRebootRefusedError):
    """MIG_REBOOT=reboot: the node reboots; this run ends without readiness (exit 15)."""


@dataclass(frozen=True)
class Hooks:
    """What the pipeline hands the stage (a stage imports no other stage nor the upgrade
    room): an NVML session, the device-node maker, the eviction of holders, the reboot."""

    nvml: Callable[[], AbstractContextManager[None]]
    make_nodes: Callable[[list[caps.CapNode]], object]
    # UPGRADE_POLICY evict|drain: evict the holders' pods, wait until the devices are free
    free: Callable[[list[Holder], list[str]], None] | None = None
    reboot: Callable[[], None] | None = None


@dataclass(frozen=True)
class PartitionResult:
    """What the stage found and did; `state` is the label's value (or `none`)."""

    source: str | None
    state: str
    gpus: tuple[dict[str, Any], ...] = ()
    changed: tuple[int, ...] = ()
    reset: tuple[int, ...] = ()
    cap_nodes: int = 0
    dry_run: bool = False
    planned: tuple[str, ...] = field(default=())

    def log_fields(self) -> dict[str, Any]:
        return {"mig": self.state, "changed": len(self.changed), "cap_nodes": self.cap_nodes}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_text(self) -> str:
        if self.source is None:
            return "MIG: not configured (nothing touched)"
        lines = [f"MIG source: {self.source}", f"MIG state:  {self.state}"]
        lines += [f"  would change: {line}" for line in self.planned]
        lines += [f"  GPU {g['index']} ({g['name']}): {migrecord.describe(g)}"
                  for g in self.gpus]
        if not self.dry_run:
            changed = ", ".join(map(str, self.changed)) or "none"
            lines.append(f"  changed GPUs: {changed}; capability nodes: {self.cap_nodes}")
        return "\n".join(lines)


def find(ctx: Context) -> config.Source | None:
    """The configured source; None (MIG not configured) also forgets an old record. Cheap:
    no NVML, and the API only for a mig-parted file without MIG_CONFIG."""
    source = config.find(ctx)
    if source is None:
        migrecord.forget(ctx.install_root)
        reboots.forget(ctx)
    return source


def run(ctx: Context, hooks: Hooks, *, dry_run: bool = False) -> PartitionResult:
    """Stage entry point (the `partition` command): nothing without a config."""
    source = config.find(ctx)
    if source is None:
        return PartitionResult(None, "none", dry_run=dry_run)
    return partition(ctx, source, hooks, dry_run=dry_run)


def partition(ctx: Context, source: config.Source, hooks: Hooks, *,
              dry_run: bool = False) -> PartitionResult:
    """Read the GPUs, refuse what cannot be, change what differs, make the cap nodes.

    Any failure withdraws readiness (the node is not as configured) and labels `failed`,
    except the reboot under way, labelled `rebooting`."""
    from installer.stages.partition import nvml  # pynvml only where MIG is configured

    if dry_run:
        with hooks.nvml():
            gpus, todo = _read_plan(ctx, source)
        return PartitionResult(source.origin, "pending" if todo else "success",
                               _gpu_rows(gpus), tuple(c.gpu.index for c in todo),
                               dry_run=True, planned=tuple(_planned(c) for c in todo))
    waiting: list[GpuChange] = []
    reset: tuple[int, ...] = ()
    try:
        with hooks.nvml():
            gpus, todo = _read_plan(ctx, source)
            if todo:  # the node is not ready while its GPUs are not as configured
                clear_readiness(ctx.config, ctx.host.roots)
                _set_state(ctx, "pending")
                waiting = _apply(ctx, hooks, todo)
        if todo:
            reset = _reset(ctx, hooks, waiting)  # NVML closed: no handle of ours left open
            with hooks.nvml():
                gpus = nvml.read_gpus()
        nodes = caps.plan(ctx.host)
        hooks.make_nodes(nodes)
    except InstallerError as exc:
        clear_readiness(ctx.config, ctx.host.roots)
        if not isinstance(exc, NodeRebootingError):
            _set_state(ctx, "failed")
        raise
    rows = _gpu_rows(gpus)
    migrecord.write(ctx.install_root, source.origin, list(rows))
    reboots.forget(ctx)  # the mode holds: a later change may reboot again
    _set_state(ctx, "success")
    return PartitionResult(source.origin, "success", rows, tuple(c.gpu.index for c in todo),
                           reset, len(nodes))


def _read_plan(ctx: Context, source: config.Source) -> tuple[list[GpuNow], list[GpuChange]]:
    """The GPUs now and what differs; a layout a GPU cannot take is refused here, before
    anything changes (exit 2 or 14)."""
    from installer.stages.partition import nvml

    gpus = nvml.read_gpus()
    _log_sources(ctx, gpus)

    def skip(gpu: GpuNow) -> None:
        ctx.log.warning("GPU skipped: it has no MIG (devices: all passes over it, as "
                        "mig-parted does)", gpu=gpu.index, name=gpu.name)

    want = source.layouts(gpus, config.pci_ids(ctx), skip)
    plan.validate(want, gpus)
    return gpus, plan.changes(want, gpus)


def _log_sources(ctx: Context, gpus: Sequence[GpuNow]) -> None:
    """Say, per GPU, where its plan comes from: NVML's answer, and how it differs from the
    table (a newer board), or the table where NVML gave no profiles."""
    for gpu in gpus:
        table = mig_model(gpu.name, gpu.memory_mib)
        if gpu.nvml_model is None:
            if table is not None:
                ctx.log.info("MIG profiles from the table (NVML answered none)",
                             gpu=gpu.index, model=table.name)
            continue
        differs = mignvml.differences(gpu.nvml_model, table)
        if differs:
            ctx.log.warning("MIG profiles from NVML differ from the table; planned from NVML",
                            gpu=gpu.index, name=gpu.name, differences="; ".join(differs))
        else:
            ctx.log.info("MIG profiles from NVML", gpu=gpu.index,
                         model=gpu.nvml_model.name)


def _apply(ctx: Context, hooks: Hooks, todo: list[GpuChange]) -> list[GpuChange]:
    """Free the GPUs that change and apply each change; the changes whose mode waits for
    a reset (A100) are returned."""
    devices = _device_paths(ctx, [c.gpu for c in todo])
    holders = _holders(ctx, devices)
    if holders:
        if hooks.free is None:
            raise MigInUseError(
                f"GPU(s) {', '.join(str(c.gpu.index) for c in todo)} must be repartitioned "
                f"but are held by {', '.join(h.describe() for h in holders)}; nothing "
                "changed",
                remedy="stop those processes or drain the GPU pods, or set "
                       "UPGRADE_POLICY=evict (or drain) to evict them, then rerun")
        hooks.free(holders, devices)
        if _holders(ctx, devices):
            raise MigInUseError("the GPUs are held again after the evictions; nothing "
                                "changed", remedy="rerun once the GPU pods are gone")
    from installer.stages.partition import nvml

    return [c for c in todo if nvml.apply(c)]


def _reset(ctx: Context, hooks: Hooks, waiting: list[GpuChange]) -> tuple[int, ...]:
    """Reset each GPU whose mode waits, as mig-parted does (`gpureset`: `nvidia-smi -r` for
    that GPU while the driver is loaded, the PCI sysfs reset only without it), then make its
    instances; a mode that still waits goes to MIG_REBOOT."""
    if not waiting:
        return ()
    if _holders(ctx, _device_paths(ctx, [c.gpu for c in waiting])):
        raise MigInUseError("a GPU needs a reset for its MIG mode but is held again",
                            remedy="rerun once the GPU's processes are gone")
    for change in waiting:
        done = gpureset.reset_gpu(ctx.host, change.gpu.pci_bus_id, ctx.install_root)
        if done.error is not None:  # the mode waits for a reboot
            ctx.log.warning("GPU reset failed", gpu=change.gpu.index, method=done.method,
                            detail=done.error)
        else:
            ctx.log.info("GPU reset", gpu=change.gpu.index, method=done.method)
    from installer.stages.partition import nvml

    with hooks.nvml():
        now = nvml.read_gpus()
        still = sorted(g.index for g in now if g.mode_pending)
        if still:
            _reboot(ctx, hooks, still)
        for change in plan.changes({c.gpu.index: c.want for c in waiting}, now):
            nvml.apply(change)  # the mode holds now: the instances
    return tuple(c.gpu.index for c in waiting)


def _reboot(ctx: Context, hooks: Hooks, pending: Sequence[int]) -> None:
    """The mode waits for a reboot: MIG_REBOOT=reboot reboots the node, else refuse."""
    named = ", ".join(map(str, pending))
    if ctx.config.mig_reboot != "reboot" or hooks.reboot is None:
        raise MigRebootRefusedError(
            f"the MIG mode of GPU(s) {named} changes only after a reboot (a GPU reset did "
            "not apply it); MIG_REBOOT=refuse",
            remedy="reboot the node (the next run creates the instances) or set "
                   "MIG_REBOOT=reboot")
    try:
        reboots.check(ctx, pending)
    except reboots.Refusal as exc:
        raise MigRebootFailedError(exc.message, remedy=exc.remedy) from None
    if not _set_state(ctx, "rebooting"):  # as mig-manager: no reboot without the state
        raise MigRebootFailedError(
            f"the MIG mode of GPU(s) {named} needs a reboot, but the Node's "
            "mig.config.state label could not be set to rebooting; no reboot",
            remedy="check the API server and the installer's RBAC (patch nodes), then "
                   "rerun")
    try:
        reboots.record(ctx, pending)
    except OSError as exc:
        raise MigRebootFailedError(
            f"the MIG mode of GPU(s) {named} needs a reboot, but its record "
            f"{reboots.shown(ctx)} could not be written ({exc.strerror or exc}); no reboot",
            remedy="free the install dir's filesystem, then rerun") from None
    ctx.log.warning("rebooting the node for the MIG mode", gpus=named)
    hooks.reboot()
    raise NodeRebootingError(f"the node reboots for the MIG mode of GPU(s) {named}",
                                remedy="nothing: the next run after the reboot goes on")


def _holders(ctx: Context, devices: list[str]) -> list[Holder]:
    """Who holds these GPUs' device files, this process (its own NVML session) aside."""
    return [h for h in find_holders(ctx.host, devices) if h.pid != os.getpid()]


def _device_paths(ctx: Context, gpus: Sequence[GpuNow]) -> list[str]:
    """`/dev/nvidia<minor>` of each GPU (its `Device Minor`; the index where unreadable)."""
    paths = []
    for gpu in gpus:
        info = ctx.host.read_text(ctx.host.roots.proc / "driver/nvidia/gpus"
                                  / _sysfs_address(gpu) / "information") or ""
        found = _MINOR_RE.search(info)
        paths.append(f"/dev/nvidia{found.group(1) if found else gpu.index}")
    return paths


def _sysfs_address(gpu: GpuNow) -> str:
    return pci.bus_key(gpu.pci_bus_id)


def _gpu_rows(gpus: Sequence[GpuNow]) -> tuple[dict[str, Any], ...]:
    return tuple({"index": g.index, "name": g.name, "uuid": g.uuid, "memory_mib": g.memory_mib,
                  "pci_bus_id": g.pci_bus_id, "mig_enabled": g.layout.mig_enabled,
                  "devices": [list(d) for d in g.layout.devices],
                  "mig_devices": [{**asdict(d), "attributes": dict(d.attributes)}
                                  for d in g.mig_devices]} for g in gpus)


def _planned(change: GpuChange) -> str:
    now = migrecord.describe(_gpu_rows([change.gpu])[0])
    want = migrecord.describe({"mig_enabled": change.want.mig_enabled,
                     "devices": [list(d) for d in change.want.devices]})
    return f"GPU {change.gpu.index} ({change.gpu.name}): {now} -> {want}"


def _set_state(ctx: Context, state: str) -> bool:
    """The Node's `mig.config.state` label (and nvidia.com's beside gpu-operator); False
    (and a warning) when the API is configured but the label was not set. Without an API
    there is no label: True."""
    node = ctx.config.node_name
    if not node:
        return True
    from installer.node import kube

    api = kube.connect(ctx.config, os.environ)
    if api is None:
        return True
    labels = {MIG_STATE: state}
    if ctx.config.driver_root_layout:  # beside gpu-operator: mig-manager's own key too
        labels[OPERATOR_MIG_STATE] = state
    try:
        kube.patch_node_labels(api, node, labels)
    except kube.KubeError as exc:
        ctx.log.warning("MIG state label not set", state=state, detail=str(exc))
        return False
    return True
