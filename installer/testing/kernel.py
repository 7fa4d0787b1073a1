"""Test helpers for the kernel side: a simulated kernel behind the host seam, module files,
and driver packages made from module files.

`FakeKernelHost` is a `RealHost` over a host tree (see `installer.testing.build_node`) whose
kernel calls are simulated: a load reads the module file's real `.modinfo`, enforces its
dependencies and signature policy like the kernel, and writes the results where the real
kernel shows them (/proc/modules, /sys/module, /proc/devices, /proc/driver/nvidia), so the
code under test reads state exactly as it does on a node.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from installer.node import kmod, modversions, syscalls
from installer.node.host import RealHost, Roots
from installer.packages.manifest import Package
from installer.packages.tree import read_tree
from installer.testing.kobject import module_object

# What loading each module makes appear: char devices (None = dynamic major) and procfs.
CHARDEVS: dict[str, dict[str, int | None]] = {
    "nvidia": {"nvidia-frontend": 195, "nvidia-caps": None},
    "nvidia_uvm": {"nvidia-uvm": None},
    # GDRCopy src/gdrdrv/gdrdrv.c: register_chrdev(0, "gdrdrv", ...) (dynamic major);
    # gds-nvidia-fs src/nvfs-core.c: register_chrdev(0, "nvidia-fs", ...)
    "gdrdrv": {"gdrdrv": None},
    "nvidia_fs": {"nvidia-fs": None},
}


def module_file_bytes(name: str, version: str | None = None, depends: Sequence[str] = (),
                      *, signed: bool = False, kernel_release: str = "6.1.0",
                      versions: Mapping[str, int] | None = None,
                      exports: Mapping[str, int] | None = None,
                      srcversion: str | None = None, build_id: bytes | None = None) -> bytes:
    """A minimal ELF64 relocatable object with a `.modinfo` section, like a real .ko (and
    its symbol versions: `installer.testing.kobject`)."""
    info = [f"name={name}", f"depends={','.join(depends)}",
            f"vermagic={kernel_release} SMP mod_unload"]
    if version:
        info.insert(0, f"version={version}")
    if srcversion:
        info.append(f"srcversion={srcversion}")
    body = module_object(info, versions=versions, exports=exports, build_id=build_id)
    return body + (b"\0" * 16 + kmod.SIGNATURE_MARKER if signed else b"")


def elf_with_modinfo(fields: Sequence[str]) -> bytes:
    """The smallest ELF64 x86_64 relocatable object whose `.modinfo` holds these fields."""
    return module_object(fields)


@dataclass
class FakeModule:
    """A module the fake kernel holds: version, what it depends on, its references."""

    version: str | None
    depends: tuple[str, ...]
    params: str
    open_files: int = 0
    majors: dict[str, int] = field(default_factory=dict)
    crcs: dict[str, int] = field(default_factory=dict)  # its exports' symbol versions
    srcversion: str | None = None


class FakeKernelHost(RealHost):
    """RealHost over a host tree, with simulated module loading and device nodes.

    `fail_next[name] = errno` makes the next load of that module fail like the kernel.
    `calls` records every kernel call, so a test can assert nothing was touched.
    """

    def __init__(self, roots: Roots, *, gpus: int = 1, decompresses: bool = False) -> None:
        super().__init__(roots)
        self.modules: dict[str, FakeModule] = {}
        self.fail_next: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []
        self.nodes: dict[Path, tuple[int, int, int]] = {}
        self.gpus = gpus
        self.decompresses = decompresses
        self._next_major = 511
        self._next_pid = 4242
        self._restore()
        self.write_state()

    SNAPSHOT = ".fake-kernel.json"

    def _restore(self) -> None:
        """Pick up the kernel state an earlier process left (the kernel outlives processes)."""
        try:
            data = json.loads((self.roots.proc / self.SNAPSHOT).read_text())
        except (OSError, ValueError):
            return
        self.modules = {name: FakeModule(m["version"], tuple(m["depends"]), m["params"],
                                         m["open_files"], dict(m["majors"]),
                                         dict(m.get("crcs", {})), m.get("srcversion"))
                        for name, m in data["modules"].items()}
        self.nodes = {Path(p): (n[0], n[1], n[2]) for p, n in data["nodes"].items()}
        self._next_major = data["next_major"]

    def _snapshot(self) -> None:
        data = {"modules": {name: {"version": m.version, "depends": list(m.depends),
                                   "params": m.params, "open_files": m.open_files,
                                   "majors": m.majors, "crcs": m.crcs,
                                   "srcversion": m.srcversion}
                            for name, m in self.modules.items()},
                "nodes": {str(p): list(n) for p, n in self.nodes.items()},
                "next_major": self._next_major}
        snapshot = self.roots.proc / self.SNAPSHOT  # atomic: the source of truth on restart
        tmp = snapshot.with_name(f"{snapshot.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, snapshot)

    # --- kernel calls -----------------------------------------------------------------
    def finit_module(self, path: Path, params: str, *, flags: int = 0) -> None:
        self.calls.append(("load", path.name))
        if not (self.roots.proc / "modules").exists():
            raise OSError(errno.ENOSYS, "Function not implemented")
        if flags & syscalls.MODULE_INIT_COMPRESSED_FILE and not self.decompresses:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        data = path.read_bytes()
        info = kmod.modinfo(data)
        name = kmod.normalize(info["name"][0])
        if name in self.fail_next:
            code = self.fail_next.pop(name)
            raise OSError(code, os.strerror(code))
        if name in self.modules:
            raise OSError(errno.EEXIST, "File exists")
        if self._enforcing() and not kmod.is_signed(data):
            raise OSError(errno.EKEYREJECTED, "Key was rejected by service")
        depends = kmod.modinfo_depends(data)
        if any(dep not in self.modules for dep in depends):
            raise OSError(errno.ENOENT, "No such file or directory")
        if self._disagrees(data):
            raise OSError(errno.EINVAL, "Invalid argument")
        version = info.get("version", [None])[0]
        module = FakeModule(version, depends, params, crcs=_exports(data),
                            srcversion=info.get("srcversion", [None])[0])
        for chardev, major in CHARDEVS.get(name, {}).items():
            module.majors[chardev] = major if major is not None else self._dynamic_major()
        self.modules[name] = module
        self.write_state()

    def delete_module(self, name: str) -> None:
        self.calls.append(("unload", name))
        self._restore()  # another process may have let go of the module since (the kernel
        # is shared: a holder's exit, simulated by `close_device`, shows here)
        name = kmod.normalize(name)
        if name not in self.modules:
            raise OSError(errno.ENOENT, "No such file or directory")
        if self.holders(name) or self.modules[name].open_files:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        del self.modules[name]
        self.write_state()

    def char_device(self, path: Path) -> tuple[int, int, int] | None:
        return self.nodes.get(path) if path.exists() else None

    def mknod_char(self, path: Path, major: int, minor: int, mode: int) -> None:
        self.calls.append(("mknod", path.name))
        real = self.roots.entry(path)  # confined as RealHost's
        real.parent.mkdir(parents=True, exist_ok=True)
        if real.is_symlink() or real.is_file():
            real.unlink()
        real.write_text(f"char {major}:{minor}\n")
        self.nodes[path] = (major, minor, mode)
        self.write_state()

    # --- helpers for tests ------------------------------------------------------------
    def open_device(self, module: str, device: str = "/dev/nvidiactl",
                    comm: str = "cuda-app", cgroup: str | None = None) -> int:
        """Pretend a process opened a device of `module`: a reference and a /proc/PID/fd
        (and /proc/PID/cgroup, when given: the pod it runs in)."""
        self.modules[module].open_files += 1
        pid = self._next_pid
        while (self.roots.proc / str(pid)).exists():
            pid += 1
        self._next_pid = pid + 1
        fd_dir = self.roots.proc / str(pid) / "fd"
        fd_dir.mkdir(parents=True)
        (fd_dir / "3").symlink_to(device)
        (self.roots.proc / str(pid) / "comm").write_text(comm + "\n")
        if cgroup is not None:
            (self.roots.proc / str(pid) / "cgroup").write_text(cgroup)
        self.write_state()
        return pid

    def close_device(self, pid: int, module: str = "nvidia") -> None:
        """The process of `open_device` exits: its /proc entry and its reference go."""
        shutil.rmtree(self.roots.proc / str(pid))
        if module in self.modules:
            self.modules[module].open_files = max(0, self.modules[module].open_files - 1)
        self.write_state()

    def holders(self, name: str) -> list[str]:
        return sorted(m for m, mod in self.modules.items() if name in mod.depends)

    def version_of(self, name: str) -> str | None:
        module = self.modules.get(kmod.normalize(name))
        return module.version if module else None

    def _disagrees(self, data: bytes) -> bool:
        """The kernel's check_version(): a recorded CRC that differs from the loaded
        exporter's ("disagrees about version of symbol"; kernel/module/version.c)."""
        try:
            imported = modversions.recorded(data)
        except modversions.ModversionsError:
            return False  # what the fake kernel never checked before: it loads as it did
        return any(modversions.mismatches(imported, m.crcs) for m in self.modules.values())

    def _enforcing(self) -> bool:
        param = self.roots.sys / "module" / "module" / "parameters" / "sig_enforce"
        return param.exists() and param.read_text().strip() == "Y"

    def _dynamic_major(self) -> int:
        self._next_major -= 1
        return self._next_major + 1

    # --- what the kernel shows ----------------------------------------------------------
    def write_state(self) -> None:
        """Rewrite /proc/modules, /sys/module/*, /proc/devices and /proc/driver/nvidia."""
        proc, sys_root = self.roots.proc, self.roots.sys
        if not (proc / "modules").exists():
            return  # a kernel without module support
        lines = []
        for name, module in self.modules.items():
            refs = len(self.holders(name)) + module.open_files
            users = ",".join(self.holders(name)) or "-"
            lines.append(f"{name} 16384 {refs} {users}, Live 0x0000000000000000")
            self._write_sys_module(sys_root / "module" / name, module, refs)
        (proc / "modules").write_text("".join(line + "\n" for line in lines))
        for stale in (sys_root / "module").glob("*"):
            if stale.name not in self.modules and (stale / "refcnt").exists():
                shutil.rmtree(stale)
        majors = sorted((major, dev) for m in self.modules.values()
                        for dev, major in m.majors.items())
        devices = "".join(f"{major:3d} {dev}\n" for major, dev in majors)
        (proc / "devices").write_text(f"Character devices:\n  1 mem\n  4 tty\n{devices}\n"
                                      "Block devices:\n  8 sd\n")
        self._write_driver_proc(proc / "driver" / "nvidia")
        self._snapshot()

    def _write_sys_module(self, base: Path, module: FakeModule, refs: int) -> None:
        if (base / "holders").exists():
            shutil.rmtree(base / "holders")
        (base / "holders").mkdir(parents=True)
        for holder in self.holders(base.name):
            (base / "holders" / holder).mkdir()
        (base / "refcnt").write_text(f"{refs}\n")
        (base / "initstate").write_text("live\n")
        if module.version:
            (base / "version").write_text(module.version + "\n")
        if module.srcversion:
            (base / "srcversion").write_text(module.srcversion + "\n")

    def _write_driver_proc(self, nvidia: Path) -> None:
        module = self.modules.get("nvidia")
        if nvidia.exists():  # the MIG instances' capability files (the NVML stand-in's) are
            for entry in nvidia.iterdir():  # the GPUs' state: kept while the module stays
                if module is not None and entry.name == "capabilities":
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if module is None:
            return
        (nvidia / "capabilities" / "mig").mkdir(parents=True, exist_ok=True)
        (nvidia / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {module.version}  Tue Jan  7 "
            "00:00:00 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
        for minor in range(self.gpus):
            gpu = nvidia / "gpus" / f"0000:00:{0x1e - minor:02x}.0"
            gpu.mkdir(parents=True)
            (gpu / "information").write_text(f"Model: \t\t Tesla T4\nDevice Minor: \t {minor}\n")
        for cap, minor, mode in (("config", 1, 256), ("monitor", 2, 292)):
            (nvidia / "capabilities" / "mig" / cap).write_text(
                f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")


def _exports(data: bytes) -> dict[str, int]:
    try:
        return modversions.exported(data)
    except modversions.ModversionsError:
        return {}


@dataclass(frozen=True)
class ModuleFile:
    """A module to put in a test package: its name, file, and manifest extras."""

    name: str
    source: Path
    depends: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)


def write_package(root: Path, modules: Sequence[ModuleFile], *, driver_version: str,
                  kernel_release: str, flavour: str = "proprietary",
                  extra_files: dict[str, tuple[bytes, str]] | None = None) -> Package:
    """Write a package tree (files + manifest.json) and open it as a verified Package."""
    files: list[dict[str, object]] = []
    entries: list[dict[str, object]] = []

    def add(relpath: str, data: bytes, kind: str) -> None:
        target = root / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        files.append({"path": relpath, "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "mode": 0o644, "kind": kind})

    for module in modules:
        relpath = f"kernel/{module.source.name}"
        add(relpath, module.source.read_bytes(), "module")
        entries.append({"name": module.name, "file": relpath, "depends": list(module.depends),
                        "params": dict(module.params)})
    for relpath, (data, kind) in (extra_files or {}).items():
        add(relpath, data, kind)
    manifest = {"schema_version": 1, "driver_version": driver_version,
                "kernel_release": kernel_release, "arch": "x86_64", "flavour": flavour,
                "os": None, "files": files, "modules": entries}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return read_tree(root)


def fake_module_set(directory: Path, version: str, *, signed: bool = False,
                    kernel_release: str = "6.1.0",
                    with_drm: bool = False) -> list[ModuleFile]:
    """nvidia, nvidia-uvm (and nvidia-modeset/-drm needing the host's drm) as fake .ko files."""
    directory.mkdir(parents=True, exist_ok=True)
    specs: list[tuple[str, str, tuple[str, ...]]] = [
        ("nvidia", "nvidia.ko", ()), ("nvidia_uvm", "nvidia-uvm.ko", ("nvidia",))]
    if with_drm:
        specs += [("nvidia_modeset", "nvidia-modeset.ko", ("nvidia",)),
                  ("nvidia_drm", "nvidia-drm.ko", ("nvidia_modeset", "drm", "drm_kms_helper"))]
    out = []
    for name, file_name, depends in specs:
        path = directory / file_name
        path.write_bytes(module_file_bytes(name, version, depends, signed=signed,
                                           kernel_release=kernel_release))
        out.append(ModuleFile(name, path, tuple(d for d in depends if d.startswith("nvidia"))))
    return out


def write_host_module(modules_root: Path, relpath: str, name: str, depends: Sequence[str] = (),
                      *, signed: bool = True, exports: Mapping[str, int] | None = None,
                      srcversion: str | None = None) -> None:
    """Put a (fake) module file into a node's /lib/modules/<release> tree."""
    target = modules_root / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(module_file_bytes(name, None, depends, signed=signed, exports=exports,
                                         srcversion=srcversion))
