"""The load stage: the package's kernel modules into the running kernel, then the device nodes.

Order of work, so that a refusal never leaves the node worse off: plan (load order, host
dependencies from modules.dep, parameters), preflight (files verified, signature
enforcement, GPUs claimed by other drivers, kernel match), only then unload another version
(if nothing holds it) and load. A failed load unloads what this run loaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from installer.context import Context
from installer.errors import (
    InstallerError,
    KernelWithoutModulesError,
    ModuleAlreadyLoadedError,
    ModuleInUseError,
    PackageNotFoundError,
)
from installer.installdir import ownership
from installer.installdir.layout import DEVNODES_FILE
from installer.installdir.readiness import clear_readiness
from installer.node import interrupts, kmod, syscalls
from installer.node.holders import processes_using_nvidia as processes_using_nvidia
from installer.node.host import Host
from installer.node.optionalmods import NAMES as OPTIONAL_NAMES
from installer.node.optionalmods import OptionalVerdict
from installer.node.rdma import RdmaVerdict
from installer.packages.manifest import Package
from installer.stages.load import devnodes, failures, optional, rdma, rebuild
from installer.stages.load import plan as modplan
from installer.stages.load.plan import PlannedModule

# NVIDIA's modules, holders first: what `unload` takes out and a version change replaces.
NVIDIA_MODULES = ("nvidia_peermem", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia")
FIRMWARE_PARAM = ("module", "firmware_class", "parameters", "path")


@dataclass
class LoadResult:
    """What the stage found and did; `changed` is False on a second identical run."""

    driver_version: str
    loaded: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    host_modules: list[str] = field(default_factory=list)
    nodes: devnodes.NodesResult = field(default_factory=devnodes.NodesResult)
    firmware_path: str | None = None
    warnings: list[str] = field(default_factory=list)
    rdma: RdmaVerdict | None = None  # nvidia-peermem's verdict (None: not considered)
    optional: list[OptionalVerdict] = field(default_factory=list)  # gdrdrv, nvidia-fs

    @property
    def changed(self) -> bool:
        return bool(self.loaded or self.unloaded or self.nodes.changed)

    def log_fields(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "loaded": self.loaded,
                "kept": self.kept, "unloaded": self.unloaded, "changed": self.changed}

    def to_dict(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "loaded": self.loaded,
                "kept": self.kept, "unloaded": self.unloaded,
                "host_modules": self.host_modules, "changed": self.changed,
                "device_nodes": {"created": self.nodes.created,
                                 "replaced": self.nodes.replaced, "kept": self.nodes.kept},
                "firmware_path": self.firmware_path, "warnings": self.warnings,
                "rdma": self.rdma.to_dict() if self.rdma else None,
                "optional_modules": [v.to_dict() for v in self.optional]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        none = "none"
        lines = [f"Driver:          {self.driver_version}",
                 f"Loaded:          {', '.join(self.loaded) or none}",
                 f"Already loaded:  {', '.join(self.kept) or none}",
                 f"Unloaded:        {', '.join(self.unloaded) or none}",
                 f"Device nodes:    {len(self.nodes.created)} created, "
                 f"{len(self.nodes.replaced)} replaced, {len(self.nodes.kept)} kept"]
        if self.firmware_path:
            lines.append(f"Firmware path:   {self.firmware_path}")
        if self.rdma is not None:
            lines.append(f"RDMA:            {self.rdma.stack.text}")
            lines.append(f"nvidia-peermem:  {'loaded' if self.rdma.ready else 'not loaded'} "
                         f"({self.rdma.reason}: {self.rdma.message})")
        lines += [f"Optional:        {v.module.replace('_', '-')} "
                  f"{'loaded' if v.ready else 'not loaded'} ({v.reason}: {v.message})"
                  for v in self.optional]
        lines += [f"Warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


@dataclass(frozen=True)
class UnloadResult:
    """What `unload` took out of the kernel."""

    unloaded: list[str]
    removed_nodes: list[str]

    def log_fields(self) -> dict[str, Any]:
        return {"unloaded": self.unloaded}

    def to_json(self) -> str:
        return json.dumps({"unloaded": self.unloaded, "removed_nodes": self.removed_nodes},
                          indent=2)

    def to_text(self) -> str:
        return f"Unloaded:        {', '.join(self.unloaded) or 'nothing was loaded'}"


def run(ctx: Context) -> LoadResult:
    """Stage entry point: consumes the fetch stage's verified Package."""
    package = ctx.package
    if package is None:
        raise PackageNotFoundError("no driver package to load (the fetch stage did not run)",
                                   remedy="run `install`, or `load` which fetches first")
    return load_package(ctx.host, package, params=modplan.operator_params(ctx.config),
                        force=ctx.config.force_load,
                        firmware_dir=f"{ctx.config.install_dir}/firmware", log=ctx.log,
                        withdraw=lambda: clear_readiness(ctx.config, ctx.host.roots),
                        hold=ctx.held_device_nodes, record=node_record(ctx),
                        rdma_mode=ctx.config.rdma, imex_channel=ctx.config.imex == "host",
                        peermem_rebuild=rebuild.rebuilder(ctx))


def node_record(ctx: Context) -> Path | None:
    """Where the device nodes we make are recorded: in the install dir, once it is ours
    (a `load` into a directory not yet marked records nothing, so nothing counts as ours)."""
    root = ctx.install_root
    return root / DEVNODES_FILE if root.is_dir() and ownership.ours(root) else None


def hold_gate(ctx: Context) -> list[str]:
    """Withdraw the device nodes GKE's device plugin waits for, those we made only, and
    hold them back in this run's load until `release_gate` (after verification)."""
    record = node_record(ctx)
    withdrawn = devnodes.withdraw(ctx.host, record) if record is not None else []
    ctx.held_device_nodes = (*ctx.held_device_nodes, *withdrawn)
    return withdrawn


def release_gate(ctx: Context) -> list[str]:
    """Make the held nodes for the driver loaded now (none when no driver is loaded)."""
    held, ctx.held_device_nodes = ctx.held_device_nodes, ()
    nodes = [n for n in devnodes.plan(ctx.host) if n.name in held]
    result = devnodes.ensure_nodes(ctx.host, nodes, record=node_record(ctx))
    return result.created + result.replaced


def load_package(host: Host, package: Package, *, params: modplan.Params = (),
                 force: bool = False, firmware_dir: str | None = None,
                 log: Any = None, withdraw: Callable[[], None] = lambda: None,
                 hold: Collection[str] = (), record: Path | None = None,
                 rdma_mode: str | None = None, imex_channel: bool = False,
                 peermem_rebuild: rdma.Rebuild | None = None) -> LoadResult:
    """Plan, preflight, replace another version if free, load, make device nodes (but
    not those in `hold` while they are absent; `record`: see devnodes).

    `withdraw` (readiness) runs once the kernel's driver is about to change (another version
    unloaded, or modules loaded), never before a refusal: a same-version run and a driver in
    use keep what serves declared ready. `rdma_mode` (auto, on, off) decides nvidia-peermem
    last (`rdma`): whatever it decides, the driver loaded stays loaded. `imex_channel`:
    IMEX's default channel node too (devnodes.plan). `peermem_rebuild`: BUILD_FALLBACK=auto's
    build of nvidia-peermem on the node when the package's does not fit (rebuild.py)."""
    require_module_support(host)
    plan = modplan.plan(host, package, params)
    result = LoadResult(package.manifest.driver_version)
    result.warnings += modplan.preflight(host, package, plan, force=force)
    for warning in result.warnings:
        if log is not None:
            log.warning("preflight", detail=warning)
    with interrupts.deferred():  # SIGTERM never leaves the old driver out, the new half in
        other = other_version(host, package)
        if other is not None:
            check_free(host, *other)  # a refusal withdraws nothing
        version = package.manifest.driver_version
        if other is not None or not all(_already_loaded(host, m, version) for m in plan):
            withdraw()
        result.unloaded = replace_other_version(host, package)
        has_firmware = any(entry.kind == "firmware" for entry in package.manifest.files)
        if has_firmware and firmware_dir:
            result.firmware_path = point_firmware_path(host, firmware_dir, result.warnings)
        load_plan(host, plan, package.manifest.driver_version, result)
    result.nodes = devnodes.ensure_nodes(host, devnodes.plan(host, imex_channel=imex_channel),
                                         hold=hold, record=record)
    if rdma_mode is not None:
        was_loaded = kmod.module_state(host, rdma.PEERMEM) is not None
        result.rdma = rdma.load_peermem(host, package, rdma_mode, peermem_rebuild)
        if result.rdma.ready:
            (result.kept if was_loaded else result.loaded).append(rdma.PEERMEM)
        elif not result.rdma.ready and result.rdma.reason in rdma.REFUSALS:
            result.warnings.append(result.rdma.message)
            if log is not None:
                log.warning("nvidia-peermem refused", reason=result.rdma.reason,
                            detail=result.rdma.message)
    _load_optional(host, package, record, result, log)
    return result


def _load_optional(host: Host, package: Package, record: Path | None, result: LoadResult,
                   log: Any) -> None:
    """gdrdrv, nvidia-fs (`optional`): last, each failing alone, the driver untouched."""
    result.optional = optional.load_optional(host, package, record)
    for verdict in result.optional:
        if verdict.loaded_now:
            result.loaded.append(verdict.module)
        elif verdict.ready:
            result.kept.append(verdict.module)
        else:
            result.warnings.append(verdict.message)
            if log is not None:
                log.warning("optional module not loaded", module=verdict.module,
                            reason=verdict.reason, detail=verdict.message)


def require_module_support(host: Host) -> None:
    """No /proc/modules means a kernel without loadable modules: say so before anything."""
    if kmod.loaded_modules(host) is None:
        raise KernelWithoutModulesError(
            "this kernel cannot load modules (no /proc/modules)",
            remedy="use a kernel built with CONFIG_MODULES, or check --proc-root")


def load_plan(host: Host, plan: list[PlannedModule], version: str, result: LoadResult) -> None:
    """Load what is not loaded yet, in order; on failure unload what this run loaded."""
    for module in plan:
        if _already_loaded(host, module, version):
            result.kept.append(module.name)
            continue
        try:
            load_one(host, module)
        except ModuleAlreadyLoadedError:
            if _already_loaded(host, module, version):  # a concurrent load won the race
                result.kept.append(module.name)
                continue
            raise
        except InstallerError:
            rollback(host, result.loaded)
            result.loaded.clear()
            raise
        result.loaded.append(module.name)
        if module.from_host:
            result.host_modules.append(module.name)


def _already_loaded(host: Host, module: PlannedModule, version: str) -> bool:
    """A host module counts in any version; a package module only in the package's."""
    state = kmod.module_state(host, module.name)
    return state is not None and (module.from_host or state.version == version)


def load_one(host: Host, module: PlannedModule) -> None:
    """finit_module with the module's parameters; errno mapped to a specific error."""
    flags = syscalls.MODULE_INIT_COMPRESSED_FILE if module.compressed else 0
    try:
        host.finit_module(module.path, module.param_string, flags=flags)
    except OSError as exc:
        missing = tuple(d for d in module.depends if kmod.module_state(host, d) is None)
        raise failures.load_failure(exc, module.name, missing=missing,
                                compressed=module.compressed) from exc


def rollback(host: Host, loaded: list[str]) -> None:
    """Leave the kernel as this run found it: unload, newest first, what it loaded."""
    for name in reversed(loaded):
        try:
            host.delete_module(name)
        except OSError:
            continue


def replace_other_version(host: Host, package: Package) -> list[str]:
    """Unload NVIDIA modules of another version, only if nothing but they hold each other."""
    other = other_version(host, package)
    if other is None:
        return []
    states, names = other
    check_free(host, states, names)
    devnodes.remove_uvm_nodes(host)
    return unload_all(host, states)


OtherVersion = tuple[dict[str, kmod.ModuleState], set[str]]


def other_version(host: Host, package: Package) -> OtherVersion | None:
    """The loaded NVIDIA modules and our module names, when another version or flavour
    than the package's is loaded (what a load would have to unload first), else None."""
    version = package.manifest.driver_version
    # the optional modules the package ships count as ours (they hold nvidia); one it does
    # not ship, loaded by someone else, holds the driver like any foreign module
    optional = {kmod.normalize(m.name) for m in package.manifest.optional_modules}
    names = set(NVIDIA_MODULES) | optional | {kmod.normalize(m.name)
                                              for m in package.manifest.modules}
    states = {n: s for n in names if (s := kmod.module_state(host, n)) is not None}
    driver = kmod.loaded_driver(host) if states else None
    other_flavour = driver is not None and driver.flavour not in (None,
                                                                  package.manifest.flavour)
    if not other_flavour and not any(s.version != version for n, s in states.items()
                                     if n not in optional):
        return None
    return states, names


def in_use(states: dict[str, kmod.ModuleState], ours: set[str]
           ) -> tuple[list[str], list[str]]:
    """(foreign modules holding ours, our modules with users outside modules)."""
    foreign = sorted({f"{h} (holds {n})" for n, s in states.items() for h in s.holders
                      if kmod.normalize(h) not in ours})
    busy = sorted(n for n, s in states.items() if s.users_outside_modules > 0)
    return foreign, busy


def check_free(host: Host, states: dict[str, kmod.ModuleState], ours: set[str]) -> None:
    """Refuse (before unloading anything) when a process or a foreign module holds one."""
    foreign, busy = in_use(states, ours)
    if not foreign and not busy:
        return
    pids = processes_using_nvidia(host)
    users = ", ".join(f"{pid} ({comm})" for pid, comm in pids) or "none found in /proc"
    detail = "; ".join(filter(None, [
        f"in use: {', '.join(busy)}" if busy else "",
        f"held by modules {', '.join(foreign)}" if foreign else ""]))
    loaded = next((s.version for n, s in states.items() if n == "nvidia"), None)
    raise ModuleInUseError(
        f"NVIDIA driver {loaded or 'of another version'} is loaded and in use ({detail}); "
        f"processes with /dev/nvidia* open: {users}; nothing was unloaded",
        remedy="drain GPU pods from the node (or stop those processes / reboot), then rerun")


def preflight(ctx: Context, package: Package) -> list[str]:
    """The load's checks alone (module support, plan, preflight), touching nothing: what an
    upgrade runs before it cordons or evicts anything. Returns the warnings."""
    require_module_support(ctx.host)
    plan = modplan.plan(ctx.host, package, modplan.operator_params(ctx.config))
    return modplan.preflight(ctx.host, package, plan, force=ctx.config.force_load)


def unload_all(host: Host, states: dict[str, kmod.ModuleState]) -> list[str]:
    """Unload holders before what they hold (the /sys/module holders graph)."""
    remaining = dict(states)
    unloaded: list[str] = []
    while remaining:
        ready = sorted(n for n, s in remaining.items()
                       if not any(kmod.normalize(h) in remaining for h in s.holders))
        if not ready:
            raise ModuleInUseError(f"cannot order the unload of {', '.join(remaining)}")
        for name in ready:
            try:
                host.delete_module(name)
            except FileNotFoundError:
                pass  # already gone
            except OSError as exc:
                raise failures.unload_failure(exc, name) from exc
            unloaded.append(name)
            del remaining[name]
    return unloaded


def point_firmware_path(host: Host, firmware_dir: str, warnings: list[str]) -> str | None:
    """Make the kernel look for GSP firmware in the install dir (a path on the node)."""
    param = host.roots.sys.joinpath(*FIRMWARE_PARAM)
    current = (host.read_text(param) or "").strip()
    if current == firmware_dir:
        return firmware_dir
    if not param.exists():
        warnings.append(f"{param} is missing: the kernel cannot be pointed at the firmware")
        return None
    if current:
        warnings.append(f"firmware search path was {current}; now {firmware_dir}")
    host.write_sysfs(param, firmware_dir)
    return firmware_dir


def unload(host: Host) -> UnloadResult:
    """`unload`: take every NVIDIA module out if nothing holds it, uvm nodes first; gdrdrv
    and nvidia-fs too (they hold nvidia and are nothing without it), unless in use."""
    require_module_support(host)
    names = set(NVIDIA_MODULES) | set(OPTIONAL_NAMES)
    states = {n: s for n in names if (s := kmod.module_state(host, n)) is not None}
    if not states:
        return UnloadResult([], [])
    check_free(host, states, names)
    removed = devnodes.remove_uvm_nodes(host)
    return UnloadResult(unload_all(host, states), removed)

