"""The node's RDMA stack, read only: is `ib_core` loaded, whose is it, which devices use it.

Signs, in the kernel's own terms:
- an RDMA device is an entry of `/sys/class/infiniband` (every RDMA provider registers one
  there, InfiniBand, RoCE and the software `rdma_rxe` alike);
- an RDMA-capable NIC on PCI is class 0x0207 (PCI-SIG class code 02h "network controller",
  subclass 07h "InfiniBand controller"), or an Ethernet function (0x0200) of Mellanox/NVIDIA
  networking, vendor 0x15b3 (ConnectX, BlueField: RoCE);
- the stack is NVIDIA's MLNX_OFED/DOCA-OFED when its compat layer `mlx_compat` is loaded
  (every OFED module depends on it) or `/usr/src/ofa_kernel` exists; otherwise it is the
  kernel's inbox stack. Its version: `/sys/module/ib_core/version`, `mlx_compat`'s, or the
  `ofed_info` script's release name; inbox, the kernel release.
`loaded_exports` finds the CRCs the loaded `ib_core` exports (`installer.node.modversions`):
the kernel shows none in sysfs, so they are read from the module file that is loaded (its
`srcversion` equal to `/sys/module/ib_core/srcversion`, or its GNU build ID equal to the
loaded module's note in `/sys/module/ib_core/notes`), else from OFED's `Module.symvers`.
"""

from __future__ import annotations

import gzip
import io
import lzma
import re
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from installer.errors import InstallerError
from installer.node import elf, kmod, modversions
from installer.node.host import Host

IB_CORE = "ib_core"
OFED_COMPAT = "mlx_compat"
MELLANOX_VENDOR = 0x15B3
CLASS_INFINIBAND, CLASS_ETHERNET = 0x0207, 0x0200
MAX_MODULE_BYTES = 64 * 1024 * 1024  # ib_core.ko is about 1 MiB
MAX_SYMVERS_BYTES = 32 * 1024 * 1024
BUILD_ID = ".note.gnu.build-id"
OFED_SRC = Path("usr/src/ofa_kernel")
OFED_INFO = Path("usr/bin/ofed_info")
_OFED_RELEASE_RE = re.compile(r"\b((?:MLNX_OFED_LINUX|OFED-internal|DOCA[-_A-Za-z]*)"
                              r"-[0-9][0-9A-Za-z.\-]{0,40})")


class ExportsUnknown(Exception):
    """The loaded ib_core's CRCs cannot be established; the message says why."""


class RebuildFailed(Exception):
    """nvidia-peermem could not be rebuilt on the node; the message (one line) says why."""


@dataclass(frozen=True)
class RdmaStack:
    """What `detect` and `status` show, and what RDMA=auto decides on."""

    ib_core_loaded: bool
    kind: str  # "none", "inbox" or "ofed" (MLNX_OFED / DOCA-OFED)
    version: str | None
    devices: tuple[str, ...]  # /sys/class/infiniband entries
    nics: tuple[str, ...]  # RDMA-capable PCI functions
    srcversion: str | None = None

    @property
    def present(self) -> bool:
        """An RDMA stack to serve: ib_core loaded and an RDMA device or NIC present."""
        return self.ib_core_loaded and bool(self.devices or self.nics)

    @property
    def text(self) -> str:
        if not self.ib_core_loaded:
            found = f"{len(self.nics)} RDMA NIC(s), " if self.nics else ""
            return f"none ({found}ib_core not loaded)"
        name = {"inbox": "inbox", "ofed": "MLNX_OFED/DOCA"}.get(self.kind, self.kind)
        return (f"{name} ib_core {self.version or 'of unknown version'}; "
                f"{len(self.devices)} RDMA device(s), {len(self.nics)} RDMA NIC(s)")

    def to_dict(self) -> dict[str, object]:
        return {"ib_core_loaded": self.ib_core_loaded, "kind": self.kind,
                "version": self.version, "devices": list(self.devices),
                "nics": list(self.nics), "srcversion": self.srcversion}


def read_stack(host: Host) -> RdmaStack:
    """The stack as the node shows it now (read only; nothing here fails on odd files)."""
    sys_root = host.roots.sys
    devices = tuple(p.name for p in host.iterdir(sys_root / "class" / "infiniband"))
    nics = tuple(rdma_nics(host))
    state = kmod.module_state(host, IB_CORE)
    if state is None and not any(host.iterdir(sys_root / "module" / IB_CORE)):
        return RdmaStack(False, "none", None, devices, nics)
    ofed = (kmod.module_state(host, OFED_COMPAT) is not None
            or any(host.iterdir(host.roots.host / OFED_SRC)))
    version = _sys_text(host, IB_CORE, "version")
    if ofed:
        version = version or _sys_text(host, OFED_COMPAT, "version") or _ofed_release(host)
    else:
        version = version or _sys_text_path(host, host.roots.proc / "sys/kernel/osrelease")
    return RdmaStack(True, "ofed" if ofed else "inbox", version, devices, nics,
                     _sys_text(host, IB_CORE, "srcversion"))


def rdma_nics(host: Host) -> list[str]:
    """PCI functions of class InfiniBand, or Mellanox Ethernet (RoCE), by address."""
    found = []
    for device in host.iterdir(host.roots.sys / "bus" / "pci" / "devices"):
        klass = _hex(host.read_text(device / "class"))
        vendor = _hex(host.read_text(device / "vendor"))
        if klass is None:
            continue
        if klass >> 8 == CLASS_INFINIBAND or (
                klass >> 8 == CLASS_ETHERNET and vendor == MELLANOX_VENDOR):
            found.append(device.name)
    return found


def loaded_exports(host: Host, stack: RdmaStack, release: str) -> tuple[dict[str, int], str]:
    """(symbol -> CRC, where they were read) for the ib_core the kernel has loaded.

    Raises ExportsUnknown when no source can be shown to be the loaded module."""
    reasons = []
    for path in _ib_core_files(host, release):
        try:
            data = _module_bytes(host, path)
            info = kmod.modinfo(data)
        except (ValueError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            reasons.append(f"{path}: {exc}")
            continue
        except InstallerError as exc:  # not a regular file, not readable
            reasons.append(exc.message)
            continue
        other = _not_loaded_one(host, path, data, info, stack)
        if other is not None:
            reasons.append(other)
            continue
        try:
            return modversions.exported(data), str(path)
        except modversions.ModversionsError as exc:
            reasons.append(f"{path}: {exc}")
    if stack.kind == "ofed":
        for symvers in _ofed_symvers(host, release):
            try:
                text = host.read_bytes(symvers, MAX_SYMVERS_BYTES + 1)
            except InstallerError as exc:
                reasons.append(exc.message)
                continue
            if text is None:
                continue
            if len(text) > MAX_SYMVERS_BYTES:
                reasons.append(f"{symvers} is larger than {MAX_SYMVERS_BYTES} bytes")
                continue
            try:
                return modversions.parse_symvers(text.decode(errors="replace"),
                                                 IB_CORE), str(symvers)
            except modversions.ModversionsError as exc:
                reasons.append(f"{symvers}: {exc}")
    raise ExportsUnknown("; ".join(reasons) or "no ib_core module file or Module.symvers "
                         f"for kernel {release} on the node")


def _not_loaded_one(host: Host, path: Path, data: bytes, info: dict[str, list[str]],
                    stack: RdmaStack) -> str | None:
    """Why the file is not the loaded ib_core, or None: its `srcversion` (when the kernel
    shows one), else its GNU build ID against `/sys/module/ib_core/notes` (the kernel keeps
    each loaded module's note sections there; Debian builds without srcversion)."""
    if stack.srcversion:
        ours = (info.get("srcversion") or ["none"])[0]
        return None if ours == stack.srcversion else (
            f"{path} is not the loaded ib_core (srcversion {ours}, loaded {stack.srcversion})")
    loaded = host.read_bytes(host.roots.sys / "module" / IB_CORE / "notes" / BUILD_ID, 4096)
    if not loaded:
        return None
    try:
        ours_id = elf.section(data, BUILD_ID.encode())
    except elf.ElfError:
        ours_id = b""
    return None if ours_id == loaded else (
        f"{path} is not the loaded ib_core (its GNU build ID differs from the loaded one's)")


def _ib_core_files(host: Host, release: str) -> list[Path]:
    """ib_core's file as modules.dep names it (depmod prefers updates/ and extra/, where
    OFED installs its own), then the same under the other modules directory."""
    found = []
    for base in ("lib/modules", "usr/lib/modules"):
        root = host.roots.host / base / release
        text = host.read_text(root / "modules.dep") or ""
        for line in text.splitlines():
            target = line.partition(":")[0].strip()
            if target and kmod.module_name(target) == IB_CORE:
                path = host.roots.host / target.lstrip("/") if target.startswith("/") \
                    else root / target
                found.append(path)
                break
    return found


def _module_bytes(host: Host, path: Path) -> bytes:
    """The module file, decompressed when it is .ko.xz, .ko.gz or .ko.zst (Ubuntu's);
    bounded either way."""
    data = host.read_bytes(path, MAX_MODULE_BYTES + 1)
    if data is None:
        raise OSError(f"{path} is missing")
    if len(data) > MAX_MODULE_BYTES:
        raise OSError(f"larger than {MAX_MODULE_BYTES} bytes")
    if path.name.endswith(".xz"):
        decompressor = lzma.LZMADecompressor()
        data = decompressor.decompress(data, MAX_MODULE_BYTES + 1)
    elif path.name.endswith(".gz"):
        data = gzip.GzipFile(fileobj=io.BytesIO(data)).read(MAX_MODULE_BYTES + 1)
    elif path.name.endswith(".zst"):
        data = _zstd_bytes(data, MAX_MODULE_BYTES + 1)
    if len(data) > MAX_MODULE_BYTES:
        raise OSError(f"decompresses to more than {MAX_MODULE_BYTES} bytes")
    return data


def _zstd_bytes(data: bytes, limit: int) -> bytes:
    """At most `limit` bytes of a zstd stream, every frame of it (`zstd -T` writes several)."""
    import zstandard

    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
            while len(out) < limit and (chunk := reader.read(min(limit - len(out), 1 << 20))):
                out += chunk
    except zstandard.ZstdError as exc:
        raise OSError(f"not valid zstd data ({exc})") from None
    return bytes(out)


def _ofed_symvers(host: Host, release: str) -> list[Path]:
    base = host.roots.host / OFED_SRC
    return [*(arch / release / "Module.symvers" for arch in host.iterdir(base)
              if arch.name != "default"), base / "default" / "Module.symvers"]


def module_bytes(host: Host, path: Path) -> bytes:
    """A module file's bytes as the kernel would load them (decompressed, bounded); the
    nvidia-peermem rebuild reads the driver's nvidia.ko exports with it."""
    return _module_bytes(host, path)


def ofed_tree(host: Host, release: str) -> Path | None:
    """OFED's kernel tree for `release` (its Module.symvers and include/), resolved under
    the host root, in the order NVIDIA's nvidia-peermem.Kbuild looks: `<arch>/<release>`,
    `<release>`, `default` (a link to /etc/alternatives on MLNX_OFED nodes); None when the
    node has none."""
    base = PurePosixPath("/") / OFED_SRC
    arches = [a.name for a in host.iterdir(host.roots.host / OFED_SRC)
              if a.name not in ("default", release)]
    for candidate in (*(base / arch / release for arch in sorted(arches)), base / release,
                      base / "default"):
        try:
            tree = host.roots.node(candidate)
        except (OSError, ValueError):
            continue
        if (tree / "Module.symvers").is_file():
            return tree
    return None


def _ofed_release(host: Host) -> str | None:
    data = host.read_bytes(host.roots.host / OFED_INFO, 256 * 1024)
    match = _OFED_RELEASE_RE.search(data.decode(errors="replace")) if data else None
    return match.group(1) if match else None


def _sys_text(host: Host, module: str, name: str) -> str | None:
    return _sys_text_path(host, host.roots.sys / "module" / module / name)


def _sys_text_path(host: Host, path: Path) -> str | None:
    data = host.read_bytes(path, 4096)
    text = data.decode(errors="replace").strip() if data else ""
    return text[:80] if text and text.isprintable() else None


def _hex(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class RdmaVerdict:
    """The load stage's word on nvidia-peermem, for the node condition and `status`.

    `reason` is the condition's CamelCase reason; `message` one line naming the cause."""

    ready: bool
    reason: str
    message: str
    stack: RdmaStack
    mode: str = "auto"

    @property
    def concerns_node(self) -> bool:
        """Worth a node condition: RDMA=on, or the node has some RDMA (ib_core, a device or
        a NIC). A GPU node without any says nothing about RDMA."""
        stack = self.stack
        return self.mode == "on" or stack.ib_core_loaded or bool(stack.devices or stack.nics)

    def to_dict(self) -> dict[str, object]:
        return {"ready": self.ready, "reason": self.reason, "message": self.message,
                "mode": self.mode, "stack": self.stack.to_dict()}
