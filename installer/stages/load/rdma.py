"""nvidia-peermem, right or not at all: the optional RDMA companion of the driver.

RDMA=auto loads it when the node has an RDMA stack (`ib_core` loaded and an RDMA device or
NIC, `installer.node.rdma`), on loads it whenever the package ships it (the node's own
`ib_core` loaded first from modules.dep), off never. It goes in after `nvidia` and
`ib_core`, and only once the symbol versions it recorded for `ib_core`'s exports (its
`__versions`) equal what the loaded `ib_core` exports: a module built against the inbox
`ib_core` and loaded beside MLNX_OFED's is refused by the kernel ("disagrees about version
of symbol"), and that refusal is predicted here, named in one line, instead.
When the check fails (or the package ships no peermem) and a `rebuild` is given
(BUILD_FALLBACK=auto: `installer.stages.load.rebuild`), nvidia-peermem is compiled on the node
against the loaded stack's headers, checked the same way, and loaded instead.
Nothing here fails the install: every outcome is an `RdmaVerdict` (the node condition
`gpu-node-installer/RDMAReady`), and the GPUs stay ready whatever it says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from installer.errors import InstallerError
from installer.node import kmod, modversions, rdma, syscalls
from installer.node.host import Host
from installer.node.rdma import RdmaStack, RdmaVerdict
from installer.packages.manifest import Package
from installer.packages.tree import verify_file
from installer.stages.load import failures
from installer.stages.load import plan as modplan

PEERMEM = "nvidia_peermem"
MAX_PEERMEM_BYTES = 16 * 1024 * 1024  # nvidia-peermem.ko is some 30 KiB
# ib_core's peer-memory API: MLNX_OFED/DOCA export it, the inbox ib_core does not
PEER_API = ("ib_register_peer_memory_client", "ib_unregister_peer_memory_client")
# the verdicts that refuse or fail (the others: RDMA off, no stack, nothing shipped)
REFUSALS = ("SymbolVersionMismatch", "SymbolVersionsUnknown", "PeerMemoryApiMissing",
            "PeermemInvalid", "PeermemLoadFailed", "RdmaStackUnreadable",
            "PeermemRebuildFailed", "PeerMemoryApiUnused")
# the refusals a build against the loaded stack can cure (BUILD_FALLBACK=auto)
REBUILT_FOR = ("SymbolVersionMismatch", "PeerMemoryApiUnused")
REMEDY = ("set BUILD_FALLBACK=auto to rebuild nvidia-peermem on the node against the loaded "
          "RDMA stack's headers, or use DMA-BUF (docs/rdma.md); the GPUs are ready without it")
READY = "; the GPUs are ready without it"
# builds nvidia-peermem on the node for the loaded stack and kernel release; returns the
# .ko, or raises rdma.RebuildFailed
Rebuild = Callable[[RdmaStack, str], Path]


def peermem_file(package: Package) -> str | None:
    """The package path of nvidia-peermem (shipped as a module file, not in `modules`)."""
    return next((f.path for f in package.manifest.files
                 if f.kind == "module" and kmod.module_name(f.path) == PEERMEM), None)


def load_peermem(host: Host, package: Package, mode: str,
                 rebuild: Rebuild | None = None) -> RdmaVerdict:
    """Decide, check and load (or rebuild, check and load); never raises for the node's
    or the package's state."""
    try:
        stack = rdma.read_stack(host)
    except InstallerError as exc:
        return _no(rdma.RdmaStack(False, "none", None, (), ()), mode, "RdmaStackUnreadable",
                   f"nvidia-peermem not loaded: the RDMA stack cannot be read: {exc.message}")
    try:
        return _decide(host, package, mode, stack, rebuild)
    except InstallerError as exc:
        return _no(stack, mode, "PeermemLoadFailed", f"nvidia-peermem not loaded: "
                   f"{exc.message}")
    except OSError as exc:
        return _no(stack, mode, "PeermemInvalid", f"nvidia-peermem not loaded: cannot read "
                   f"it: {exc.strerror or exc}")


def _no(stack: RdmaStack, mode: str, reason: str, message: str) -> RdmaVerdict:
    return RdmaVerdict(False, reason, message, stack, mode)


def _decide(host: Host, package: Package, mode: str, stack: RdmaStack,
            rebuild: Rebuild | None) -> RdmaVerdict:
    version = package.manifest.driver_version
    state = kmod.module_state(host, PEERMEM)
    if mode == "off":
        extra = " (it is loaded, not by the installer)" if state is not None else ""
        return _no(stack, mode, "RdmaDisabled", f"RDMA=off: nvidia-peermem is not loaded by "
                   f"the installer{extra}")
    relpath = peermem_file(package)
    if mode == "auto" and not stack.present:
        if relpath is None:
            return _no(stack, mode, "PeermemNotShipped", f"the driver package {version} "
                       "ships no nvidia-peermem")
        return _no(stack, mode, "NoRdmaStack", f"RDMA=auto and no RDMA stack: {stack.text}")
    if state is not None and state.version == version:
        return RdmaVerdict(True, "PeermemLoaded", f"nvidia-peermem {version} is loaded "
                           f"(RDMA stack: {stack.text})", stack, mode)
    if relpath is None:
        why = f"the driver package {version} ships no nvidia-peermem"
        if rebuild is None or not stack.ib_core_loaded:
            return _no(stack, mode, "PeermemNotShipped", why)
        return _rebuilt(host, package, stack, mode, rebuild, why)
    path = package.path_of(relpath)
    verify_file(path, package.manifest.file(relpath), f"package {package.source}",
                None if package.by_hash else package.root)
    data = _read(path)
    if data is None:
        return _no(stack, mode, "SymbolVersionsUnknown", f"nvidia-peermem not loaded: "
                   f"{relpath} is compressed or larger than {MAX_PEERMEM_BYTES} bytes, so "
                   "its symbol versions cannot be checked")
    depends = kmod.modinfo_depends(data)
    _load_host_dependencies(host, package, depends)
    if not stack.ib_core_loaded:
        stack = rdma.read_stack(host)
    built = f"nvidia-peermem {version} (built for kernel {package.manifest.kernel_release})"
    verdict = _check_and_load(host, path, data, stack, mode, built)
    if verdict.reason in REBUILT_FOR and rebuild is not None:
        return _rebuilt(host, package, stack, mode, rebuild,
                        verdict.message.removesuffix(f"; {REMEDY}"))
    return verdict


def _rebuilt(host: Host, package: Package, stack: RdmaStack, mode: str, rebuild: Rebuild,
             why: str) -> RdmaVerdict:
    """Build peermem on the node (BUILD_FALLBACK=auto), check it as any, and load it."""
    release = modplan.kernel_release(host)
    try:
        path = rebuild(stack, release)
    except (rdma.RebuildFailed, InstallerError, OSError) as exc:
        cause = exc.message if isinstance(exc, InstallerError) else str(exc)
        return _no(stack, mode, "PeermemRebuildFailed", f"{why}; rebuilding it on the node "
                   f"failed: {cause}{READY}")
    data = _read(path)
    if data is None:
        return _no(stack, mode, "PeermemRebuildFailed", f"{why}; the module rebuilt on the "
                   f"node is larger than {MAX_PEERMEM_BYTES} bytes{READY}")
    version = package.manifest.driver_version
    verdict = _check_and_load(host, path, data, stack, mode,
                              f"nvidia-peermem {version} rebuilt on the node for {release}",
                              rebuilt=True)
    if not verdict.ready:
        return _no(stack, mode, "PeermemRebuildFailed", verdict.message.removesuffix(
            f"; {REMEDY}") + READY)
    return RdmaVerdict(True, "PeermemRebuilt", f"{verdict.message}; the package's was not "
                       f"loadable: {why}", stack, mode)


def _check_and_load(host: Host, path: Path, data: bytes, stack: RdmaStack, mode: str,
                    built: str, *, rebuilt: bool = False) -> RdmaVerdict:
    """The CRC check, then the load. A module must use the peer-memory API when the loaded
    ib_core has one: NVIDIA's builds it in only when conftest finds OFED's Module.symvers,
    and without it nv_mem_client_init returns -EINVAL. `rebuilt`: one built here (any
    refusal is then PeermemRebuildFailed)."""
    try:
        imported = modversions.recorded(data)
    except modversions.ModversionsError as exc:
        return _no(stack, mode, "PeermemInvalid", f"{built} not loaded: its __versions "
                   f"section is refused: {exc}")
    release = modplan.kernel_release(host)
    try:
        exports, source = rdma.loaded_exports(host, stack, release)
    except rdma.ExportsUnknown as exc:
        return _no(stack, mode, "SymbolVersionsUnknown", f"{built} not loaded: the symbol "
                   f"versions of the loaded ib_core ({stack.text}) cannot be read: {exc}")
    loaded = f"the loaded {stack.text.split(';')[0]} (CRCs from {source})"
    missing = [name for name in PEER_API if name in imported and name not in exports]
    if missing:
        return _no(stack, mode, "PeerMemoryApiMissing", f"{built} not loaded: it needs "
                   f"{missing[0]}, which {loaded} does not export; {REMEDY}")
    if PEER_API[0] in exports and not any(name in imported for name in PEER_API):
        reason, fix = ("PeermemRebuildFailed", READY) if rebuilt else (
            "PeerMemoryApiUnused", f"; {REMEDY}")
        return _no(stack, mode, reason, f"{built} not loaded: it was built without the "
                   f"peer-memory API that {loaded} exports (NVIDIA's conftest found no "
                   f"OFED Module.symvers), so its init would fail with EINVAL{fix}")
    wrong = modversions.mismatches(imported, exports)
    if wrong:
        name, ours, theirs = wrong[0]
        more = f" (and {len(wrong) - 1} more symbols)" if len(wrong) > 1 else ""
        return _no(stack, mode, "SymbolVersionMismatch", f"{built} not loaded: it was built "
                   f"against an ib_core whose {name} has CRC {ours:#010x}, {loaded} exports "
                   f"{theirs:#010x}{more}; {REMEDY}")
    flags = syscalls.MODULE_INIT_COMPRESSED_FILE if kmod.is_compressed(path) else 0
    try:
        host.finit_module(path, "", flags=flags)
    except OSError as exc:
        error = failures.load_failure(exc, PEERMEM, compressed=bool(flags))
        return _no(stack, mode, "PeermemLoadFailed", f"{built} not loaded: {error.message}")
    return RdmaVerdict(True, "PeermemLoaded", f"{built} loaded after nvidia and ib_core "
                       f"({stack.text})", stack, mode)


def _read(path: Path) -> bytes | None:
    """The module's bytes when they can be checked here (uncompressed, bounded)."""
    if kmod.is_compressed(path):
        return None
    with path.open("rb") as handle:
        data = handle.read(MAX_PEERMEM_BYTES + 1)
    return None if len(data) > MAX_PEERMEM_BYTES else data


def _load_host_dependencies(host: Host, package: Package, depends: tuple[str, ...]) -> None:
    """The node's modules peermem needs (ib_core and what it needs), deepest first."""
    ours = {kmod.normalize(m.name) for m in package.manifest.modules}
    node = modplan.host_modules(host, modplan.kernel_release(host))
    planned: list[modplan.PlannedModule] = []
    for dep in depends:
        if dep not in ours:
            modplan.add_host_module(host, node, dep, planned, needed_by=PEERMEM)
    for module in planned:
        if kmod.module_state(host, module.name) is not None:
            continue
        try:
            host.finit_module(module.path, "", flags=syscalls.MODULE_INIT_COMPRESSED_FILE
                              if module.compressed else 0)
        except OSError as exc:
            raise failures.load_failure(exc, module.name,
                                        compressed=module.compressed) from exc
