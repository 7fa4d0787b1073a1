"""What the load stage will load and whether the kernel will take it: plan and preflight.

The plan is the package's modules in manifest order, each preceded by the node's own modules
it needs (`drm`, `drm_kms_helper`...) resolved through `<host>/lib/modules/<release>/
modules.dep`. Preflight predicts refusals before anything is unloaded: a node that enforces
signatures gets a clear error instead of a half-replaced driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from installer.config import Config, ModuleParam
from installer.config import modparams as grammar
from installer.config.values import Invalid
from installer.errors import (
    ConfigError,
    GpuClaimedError,
    InstallerError,
    IntegrityError,
    ModuleDependencyError,
    ModuleLoadError,
    SignatureRejectedError,
)
from installer.node import kmod, pci
from installer.node.facts import Security, read_security
from installer.node.host import Host
from installer.packages.manifest import Package
from installer.packages.tree import verify_file

Params = Sequence[ModuleParam]
MODULE_DIRS = ("lib/modules", "usr/lib/modules")


@dataclass(frozen=True)
class PlannedModule:
    """One module to load: its file here, parameters, and the modules it needs first."""

    name: str
    path: Path
    source: str
    from_host: bool
    depends: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)

    @property
    def compressed(self) -> bool:
        return self.source.endswith(kmod.COMPRESSED_SUFFIXES)

    @property
    def param_string(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.params.items())


@dataclass(frozen=True)
class HostModules:
    """The node's modules tree: modules.dep (name -> path, deps) and the built-in names."""

    root: Path | None
    deps: dict[str, tuple[str, tuple[str, ...]]]
    builtin: frozenset[str]


def operator_params(config: Config) -> list[ModuleParam]:
    """Parameters from --module-params-file, then --module-param (later ones win)."""
    params: list[ModuleParam] = []
    if config.module_params_file is not None:
        params += read_params_file(config.module_params_file)
    return params + list(config.module_params)


def read_params_file(path: Path) -> list[ModuleParam]:
    """`module.key=value` lines; blank lines and '#' comments are ignored.

    The config already read the file once; it is read again here, where it is used.
    """
    try:
        return grammar.read_params_file(path)
    except Invalid as exc:
        raise ConfigError(f"--module-params-file {path}: {exc.reason}",
                          remedy="mount the file or drop the setting; write module.key=value "
                                 "(no spaces or quotes in the value)") from None


def merged_params(package: Package, params: Params) -> dict[str, dict[str, str]]:
    """Package defaults overridden by the operator's; an unknown module is a config error.

    The package's defaults pass the same kernel syntax as the operator's: a package carrying
    `NVreg_X=1 NVreg_Y=2` as one value would smuggle a second parameter (integrity, exit 7).
    """
    merged = {kmod.normalize(m.name): _defaults(package, m.name, m.params)
              for m in package.manifest.modules}
    for param in params:
        if param.module not in merged:
            raise ConfigError(
                f"module parameter {param.module}.{param.key}: {param.module} is not a module "
                f"of this package ({', '.join(merged)})",
                remedy="name one of the package's modules (e.g. nvidia.NVreg_EnableMSI=0)")
        merged[param.module][param.key] = param.value
    return merged


def _defaults(package: Package, module: str, params: dict[str, str]) -> dict[str, str]:
    for key, value in params.items():
        try:
            grammar.check_param(key, value)
        except Invalid as exc:
            raise IntegrityError(
                f"package {package.source}: default parameter {module}.{key} is refused: "
                f"{exc.reason}", remedy="republish the package with parameters the kernel "
                "parses as one key=value each (no spaces or quotes)") from None
    return dict(params)


def kernel_release(host: Host) -> str:
    text = host.read_text(host.roots.proc / "sys" / "kernel" / "osrelease") or ""
    return text.strip()


def host_modules(host: Host, release: str) -> HostModules:
    """Parse `<host>/lib/modules/<release>/modules.dep` (and modules.builtin) once."""
    for base in MODULE_DIRS:
        root = host.roots.host / base / release
        text = host.read_text(root / "modules.dep")
        if text is None:
            continue
        deps: dict[str, tuple[str, tuple[str, ...]]] = {}
        for line in text.splitlines():
            target, sep, rest = line.partition(":")
            if sep:
                deps[kmod.module_name(target)] = (target.strip(), tuple(rest.split()))
        builtin = host.read_text(root / "modules.builtin") or ""
        names = frozenset(kmod.module_name(p) for p in builtin.split())
        return HostModules(root, deps, names)
    return HostModules(None, {}, frozenset())


def plan(host: Host, package: Package, params: Params) -> list[PlannedModule]:
    """Host dependencies first (deepest first), then each package module in manifest order."""
    merged = merged_params(package, params)
    ours = {kmod.normalize(m.name) for m in package.manifest.modules}
    node = host_modules(host, kernel_release(host))
    planned: list[PlannedModule] = []
    for module in package.manifest.modules:
        name = kmod.normalize(module.name)
        path = package.path_of(module.file)
        declared = tuple(kmod.normalize(d) for d in module.depends)
        depends = tuple(dict.fromkeys(declared + _file_depends(path, module.file)))
        for dep in depends:
            if dep not in ours:
                add_host_module(host, node, dep, planned, needed_by=name)
        planned.append(PlannedModule(name, path, module.file, False, depends, merged[name]))
    return planned


def _file_depends(path: Path, source: str) -> tuple[str, ...]:
    """modpost's depends= of the module file itself: what the kernel will insist on."""
    if source.endswith(kmod.COMPRESSED_SUFFIXES):
        return ()
    try:
        return kmod.modinfo_depends(path.read_bytes())
    except OSError:
        return ()


def add_host_module(host: Host, node: HostModules, name: str, planned: list[PlannedModule],
                    *, needed_by: str, depth: int = 0) -> None:
    """Plan the node's module `name` after what it needs (modules.dep), unless loaded."""
    if any(p.name == name for p in planned) or name in node.builtin or depth > 32:
        return
    if name not in node.deps:
        if kmod.module_state(host, name) is not None:
            return  # loaded already, from wherever it came
        where = node.root or f"{host.roots.host}/lib/modules/<release>"
        raise ModuleDependencyError(
            f"{needed_by} needs the kernel module {name}, which is not loaded and not in "
            f"{where}/modules.dep",
            remedy="use a package built for this kernel, or a node image that ships it")
    relpath, deps = node.deps[name]
    for dep in reversed(deps):  # modules.dep lists the deepest dependency last
        add_host_module(host, node, kmod.module_name(dep), planned, needed_by=name,
                         depth=depth + 1)
    assert node.root is not None
    # modules.dep paths are relative to the tree; very old depmod wrote absolute node paths
    path = host.roots.host / relpath.lstrip("/") if relpath.startswith("/") else (
        node.root / relpath)
    planned.append(PlannedModule(name, path, relpath, True,
                                 tuple(kmod.module_name(d) for d in deps)))


def preflight(host: Host, package: Package, planned: list[PlannedModule], *,
              force: bool) -> list[str]:
    """Refuse what the kernel would refuse, before anything is unloaded; return warnings.

    `force` turns the predictions (signatures, GPU ownership, kernel mismatch) into
    warnings; file verification is never skipped.
    """
    verify_files(package)
    problems, warnings = _predictions(host, package)
    for problem in problems:
        if not force:
            raise problem
        warnings.append(f"forced past preflight: {problem.message}")
    return warnings


def verify_files(package: Package) -> None:
    """Nothing unverified goes into the kernel: re-hash each module file just before use."""
    for module in package.manifest.modules:
        entry = package.manifest.file(module.file)
        verify_file(package.path_of(module.file), entry, f"package {package.source}",
                    None if package.by_hash else package.root)


def _predictions(host: Host, package: Package) -> tuple[list[InstallerError], list[str]]:
    problems: list[InstallerError] = []
    warnings: list[str] = []
    security = read_security(host)
    if security.requires_signed_modules:
        unsigned = [kmod.normalize(m.name) for m in package.manifest.modules
                    if not _is_signed(package.path_of(m.file))]
        if unsigned:
            problems.append(SignatureRejectedError(
                f"the kernel enforces module signatures ({_why(security)}) and these "
                f"modules are unsigned: {', '.join(unsigned)}; nothing was loaded",
                remedy="use a package whose modules are signed with a key enrolled on the "
                       "node (MOK), or disable secure boot / module.sig_enforce"))
    release = kernel_release(host)
    if release and package.manifest.kernel_release != release:
        problems.append(ModuleLoadError(
            f"package is built for kernel {package.manifest.kernel_release}, the node runs "
            f"{release}", remedy="fetch the package built for this kernel release"))
    gpus = [f for f in pci.scan(host) if f.kind == pci.KIND_GPU]
    claimed = [f"{g.pci_address} ({g.driver})" for g in gpus if g.driver == "nouveau"]
    vfio = [g.pci_address for g in gpus if g.driver == "vfio-pci"]
    if gpus and len(vfio) == len(gpus):
        claimed += [f"{a} (vfio-pci)" for a in vfio]
    elif vfio:
        warnings.append(f"GPUs bound to vfio-pci stay with their VMs: {', '.join(vfio)}")
    if claimed:
        problems.append(GpuClaimedError(
            f"GPUs are bound to another driver: {', '.join(claimed)}",
            remedy="blacklist nouveau (modprobe.blacklist=nouveau) and reboot, or unbind "
                   "the GPU from vfio-pci"))
    return problems, warnings


def _is_signed(path: Path) -> bool:
    size = path.stat().st_size
    with path.open("rb") as handle:
        handle.seek(max(0, size - len(kmod.SIGNATURE_MARKER)))
        return kmod.is_signed(handle.read())


def _why(security: Security) -> str:
    parts = []
    if security.secure_boot:
        parts.append("secure boot")
    if security.module_sig_enforce:
        parts.append("module.sig_enforce")
    if security.lockdown not in (None, "none"):
        parts.append(f"lockdown={security.lockdown}")
    return ", ".join(parts)
