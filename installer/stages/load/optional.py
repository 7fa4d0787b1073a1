"""The package's optional modules (GDRCopy's gdrdrv, GPUDirect Storage's nvidia-fs), loaded last.

They go in after the driver's own modules (and nvidia-peermem), each after what it needs:
its manifest `depends` and its file's modpost `depends=` (nvidia; nvidia-fs also names
the node's own modules it was built against, loaded from modules.dep like the driver's).
Neither makes its device nodes in a container without udev, so they are made here, as
their upstream scripts do:
- gdrdrv: `/dev/gdrdrv`, major of "gdrdrv" in /proc/devices, minor 0, mode 0666
  (GDRCopy `insmod.sh` and src/gdrdrv/gdrdrv.c `register_chrdev(gdrdrv_major, DEVNAME
  ...)` with DEVNAME "gdrdrv", minors >= 1 refused in `gdrdrv_open`; github.com/NVIDIA/
  gdrcopy at fcec3ce0bb40a97a6cc45dd4afeec4bccb509712);
- nvidia-fs: `/dev/nvidia-fs<N>` for N below its `max_devices` parameter (16 by default,
  at most 16), major of "nvidia-fs", minor N, mode 0666 (gds-nvidia-fs src/nvfs-core.c
  `register_chrdev(0, DEVICE_NAME, ...)`, `device_create(... DEVICE_NAME"%d", i)`,
  `nvfs_devnode` mode 0666, MAX_NVFS_DEVICES 16; github.com/NVIDIA/gds-nvidia-fs at
  06eb38e9de010456812751ee78d709daae993f60).
Nothing here fails the install: each outcome is an `OptionalVerdict`, its own node condition.
"""

from __future__ import annotations

from pathlib import Path

from installer.errors import InstallerError
from installer.node import kmod, syscalls
from installer.node.host import Host
from installer.node.optionalmods import OptionalVerdict
from installer.packages.manifest import ModuleEntry, Package
from installer.packages.tree import verify_file
from installer.stages.load import devnodes, failures
from installer.stages.load import plan as modplan

NVFS_MAX_DEVICES = 16  # nvfs-core.c MAX_NVFS_DEVICES
MAX_MODULE_BYTES = 64 * 1024 * 1024
_CHARDEV = {"gdrdrv": "gdrdrv", "nvidia_fs": "nvidia-fs"}


def load_optional(host: Host, package: Package, record: Path | None) -> list[OptionalVerdict]:
    """Each optional module of the package, in manifest order; never raises for it."""
    return [_load_one(host, package, entry, record)
            for entry in package.manifest.optional_modules]


def _load_one(host: Host, package: Package, entry: ModuleEntry,
              record: Path | None) -> OptionalVerdict:
    name = kmod.normalize(entry.name)
    try:
        loaded_now = _load(host, package, entry, name)
        nodes = device_nodes(host, name)
    except InstallerError as exc:
        return OptionalVerdict(name, False, "LoadFailed", f"{entry.name} not loaded: "
                               f"{exc.message}; the GPUs are ready without it")
    except OSError as exc:
        return OptionalVerdict(name, False, "ModuleUnreadable", f"{entry.name} not loaded: "
                               f"cannot read {entry.file}: {exc.strerror or exc}")
    if nodes is None:
        return OptionalVerdict(name, False, "NoDevice", f"{entry.name} is loaded but "
                               f"registered no \"{_CHARDEV.get(name, name)}\" char device in "
                               "/proc/devices, so no device node was made", loaded_now=loaded_now)
    try:
        message = _made(host, package, entry, nodes, record, loaded_now)
    except InstallerError as exc:
        return _no_node(entry, exc.message, loaded_now)
    except OSError as exc:
        return _no_node(entry, str(exc.strerror or exc), loaded_now)
    return OptionalVerdict(name, True, "Loaded", message,
                           tuple(f"/dev/{n.name}" for n in nodes), loaded_now)


def _no_node(entry: ModuleEntry, why: str, loaded_now: bool) -> OptionalVerdict:
    return OptionalVerdict(kmod.normalize(entry.name), False, "DeviceNodeFailed",
                           f"{entry.name} is loaded but its device node could not be made: "
                           f"{why}", loaded_now=loaded_now)


def _made(host: Host, package: Package, entry: ModuleEntry, nodes: list[devnodes.DeviceNode],
          record: Path | None, loaded_now: bool) -> str:
    """Make the nodes; the verdict's message says what is loaded after what, and where."""
    made = devnodes.ensure_nodes(host, nodes, record=record)
    state = kmod.module_state(host, kmod.normalize(entry.name))
    what = " ".join(filter(None, (entry.name, state.version if state else None)))
    after = ", ".join(_depends(package, entry)) or "the driver"
    names = [f"/dev/{n.name}" for n in nodes]
    shown = ", ".join(names[:2]) + (f" ... ({len(names)} nodes)" if len(names) > 2 else "")
    return (f"{what} {'loaded' if loaded_now else 'already loaded'} after {after}"
            + (f"; {shown}" if shown else "")
            + (" made" if made.created or made.replaced else ""))


def _depends(package: Package, entry: ModuleEntry) -> tuple[str, ...]:
    """What it needs first: the manifest's word and the file's modpost `depends=`."""
    declared = tuple(kmod.normalize(d) for d in entry.depends)
    path = package.path_of(entry.file)
    if entry.file.endswith(kmod.COMPRESSED_SUFFIXES):
        return declared
    with path.open("rb") as handle:
        data = handle.read(MAX_MODULE_BYTES)
    return tuple(dict.fromkeys(declared + kmod.modinfo_depends(data)))


def _load(host: Host, package: Package, entry: ModuleEntry, name: str) -> bool:
    """Load it after its dependencies; False when it was loaded already."""
    if kmod.module_state(host, name) is not None:
        return False
    path = package.path_of(entry.file)
    verify_file(path, package.manifest.file(entry.file), f"package {package.source}",
                None if package.by_hash else package.root)
    depends = _depends(package, entry)
    ours = {kmod.normalize(m.name) for m in package.manifest.modules}
    node = modplan.host_modules(host, modplan.kernel_release(host))
    planned: list[modplan.PlannedModule] = []
    for dep in depends:
        if dep not in ours and kmod.module_state(host, dep) is None:
            modplan.add_host_module(host, node, dep, planned, needed_by=name)
    for module in planned:
        if kmod.module_state(host, module.name) is None:
            _insert(host, module.path, module.name, "", module.compressed, ())
    missing = tuple(d for d in depends if kmod.module_state(host, d) is None)
    params = " ".join(f"{key}={value}" for key, value in entry.params.items())
    _insert(host, path, name, params, entry.file.endswith(kmod.COMPRESSED_SUFFIXES), missing)
    return True


def _insert(host: Host, path: Path, name: str, params: str, compressed: bool,
            missing: tuple[str, ...]) -> None:
    flags = syscalls.MODULE_INIT_COMPRESSED_FILE if compressed else 0
    try:
        host.finit_module(path, params, flags=flags)
    except OSError as exc:
        raise failures.load_failure(exc, name, missing=missing, compressed=compressed) from exc


def device_nodes(host: Host, name: str) -> list[devnodes.DeviceNode] | None:
    """The nodes the loaded module calls for ([] for a module that has none), or None when
    its char device is not registered."""
    chardev = _CHARDEV.get(name)
    if chardev is None:
        return []
    major = kmod.char_majors(host).get(chardev)
    if major is None:
        return None
    if name == "gdrdrv":
        return [devnodes.DeviceNode("gdrdrv", major, 0, 0o666)]
    count = _max_devices(host)
    return [devnodes.DeviceNode(f"nvidia-fs{i}", major, i, 0o666) for i in range(count)]


def _max_devices(host: Host) -> int:
    """nvidia-fs's `max_devices` parameter (readable by all), clamped as the module does."""
    text = host.read_text(host.roots.sys / "module" / "nvidia_fs" / "parameters" /
                          "max_devices") or ""
    value = text.strip()
    if not value.isdigit():
        return NVFS_MAX_DEVICES
    return max(0, min(int(value), NVFS_MAX_DEVICES))
