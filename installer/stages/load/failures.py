"""A failed finit_module/delete_module, turned into the error and remedy an operator needs."""

from __future__ import annotations

import errno

from installer.errors import (
    CompressedModuleError,
    InstallerError,
    KernelWithoutModulesError,
    ModuleAlreadyLoadedError,
    ModuleDependencyError,
    ModuleInUseError,
    ModuleLoadError,
    ModulePermissionError,
    NoGpuRespondedError,
    SignatureRejectedError,
)


def load_failure(exc: OSError, module: str, *, missing: tuple[str, ...] = (),
                 compressed: bool = False) -> InstallerError:
    """Turn a failed finit_module into the specific error and the remedy an operator needs.

    `missing` names the dependencies that are not loaded, so ENOENT can say which one.
    """
    code = exc.errno or 0
    what = f"loading {module}"
    if compressed and code in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOEXEC):
        return CompressedModuleError(
            f"{what}: the kernel cannot decompress modules ({errno.errorcode.get(code)})",
            remedy="provide uncompressed .ko files or a kernel with CONFIG_MODULE_DECOMPRESS")
    if code == errno.EEXIST:
        return ModuleAlreadyLoadedError(f"{what}: already loaded (EEXIST)",
                                        remedy="nothing to do, or unload it first to replace it")
    if code == errno.ENODEV:
        return NoGpuRespondedError(
            f"{what}: no NVIDIA GPU responded to the driver (ENODEV, 'NVRM: No NVIDIA GPU "
            "found')",
            remedy="check the GPU is supported by this driver branch and flavour and not "
                   "bound to nouveau/vfio-pci; see `dmesg | grep NVRM` on the node")
    if code in (errno.EKEYREJECTED, errno.ENOKEY):
        return SignatureRejectedError(
            f"{what}: the kernel rejected the module signature ({errno.errorcode[code]}, "
            f"errno {code}): signatures are enforced (secure boot, lockdown or sig_enforce)")
    if code == errno.ENOENT:
        needed = ", ".join(missing) if missing else "unknown (see dmesg: 'Unknown symbol')"
        return ModuleDependencyError(
            f"{what}: a module it depends on is not loaded: {needed} (ENOENT)",
            remedy="load the named module first or ship it in the package's module list")
    if code in (errno.EBUSY, errno.EAGAIN):
        return ModuleInUseError(f"{what}: the module is busy ({errno.errorcode[code]})")
    if code == errno.EPERM:
        return ModulePermissionError(
            f"{what}: not permitted (EPERM)",
            remedy="run privileged with CAP_SYS_MODULE; check kernel lockdown "
                   "(/sys/kernel/security/lockdown) and modules_disabled")
    if code == errno.ENOSYS:
        return KernelWithoutModulesError(
            f"{what}: this kernel cannot load modules (ENOSYS)",
            remedy="use a kernel built with CONFIG_MODULES (GPU nodes need loadable modules)")
    if code == errno.ENOEXEC:
        return ModuleLoadError(
            f"{what}: invalid module format (ENOEXEC): built for another kernel?",
            remedy="use a package built for this node's exact kernel release")
    name = errno.errorcode.get(code, "errno")
    return ModuleLoadError(f"{what}: {exc.strerror or 'failed'} ({name} {code})")


def unload_failure(exc: OSError, module: str) -> InstallerError:
    """Turn a failed delete_module into a specific error."""
    code = exc.errno or 0
    if code in (errno.EAGAIN, errno.EBUSY):
        return ModuleInUseError(f"unloading {module}: still in use "
                                f"({errno.errorcode[code]})")
    if code == errno.EPERM:
        return ModulePermissionError(f"unloading {module}: not permitted (EPERM)",
                                     remedy="run privileged with CAP_SYS_MODULE")
    if code == errno.ENOSYS:
        return KernelWithoutModulesError(f"unloading {module}: no module support (ENOSYS)",
                                         remedy="nothing to unload on this kernel")
    name = errno.errorcode.get(code, "errno")
    return ModuleLoadError(f"unloading {module}: {exc.strerror or 'failed'} ({name} {code})",
                           remedy="read the kernel log (dmesg) on the node")
