"""The failure classes: each carries its exit code, a stable slug and a one-line remedy.

This is the one table of exit codes; docs/reference.md renders it and a test keeps the two equal.
Only `installer.cli` turns these into process exits.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar


class InstallerError(Exception):
    """Base of every failure the installer reports to an operator."""

    code: ClassVar[int] = 1
    slug: ClassVar[str] = "internal"
    summary: ClassVar[str] = "unexpected internal error (a bug: please report it)"
    default_remedy: ClassVar[str] = "rerun with --debug and report the traceback"

    def __init__(self, message: str, *, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy or self.default_remedy
        self.stage: str | None = None

    def one_line(self) -> str:
        """The single line an operator sees: what went wrong and how to fix it.

        A message may quote a hostile document: what is not printable is escaped, so the
        line stays one line that any terminal, log and encoding can carry."""
        where = f"[{self.stage}] " if self.stage else ""
        return printable(f"error({self.slug}): {where}{self.message}; fix: {self.remedy}")


class ConfigError(InstallerError):
    """A flag, environment variable or config file value is invalid."""

    code = 2
    slug = "config"
    summary = "bad flag, environment variable or setting"
    default_remedy = "correct the named setting (see --help)"


class NoGpuError(InstallerError):
    """The node has no NVIDIA GPU, so there is nothing to install."""

    code = 3
    slug = "no-gpu"
    summary = "no NVIDIA GPU on this node"
    default_remedy = "schedule the installer only on GPU nodes (node affinity on the GPU label)"


class UnsupportedNodeError(InstallerError):
    """The node's OS, kernel or host files are not something we can install onto."""

    code = 4
    slug = "unsupported-node"
    summary = "unsupported or unreadable node (OS, kernel, arch, host files)"
    default_remedy = "check the host mounts (--host-root/--proc-root/--sys-root) and the node OS"


class PackageNotFoundError(InstallerError):
    """No source holds a driver package for this kernel, version and flavour."""

    code = 5
    slug = "package-not-found"
    summary = "no driver package for this kernel/version/flavour in any source"
    default_remedy = "publish a package for this kernel or pick a version the sources offer"


class DownloadError(InstallerError):
    """Every mirror failed to deliver a file."""

    code = 6
    slug = "download-failed"
    summary = "download failed from every mirror"
    default_remedy = "check mirror URLs, proxy and CA settings, or preload the package"


class IntegrityError(InstallerError):
    """A file's size or sha256 does not match its manifest, or a manifest is malformed."""

    code = 7
    slug = "integrity"
    summary = "checksum, size or manifest validation failed"
    default_remedy = "republish the package; never bypass the checksum"


class SignatureRejectedError(InstallerError):
    """The kernel enforces module signatures and the package's modules are not signed for it."""

    code = 8
    slug = "signature-rejected"
    summary = "kernel rejected the module signature (secure boot / sig_enforce)"
    default_remedy = "use a package signed with a key the node trusts, or disable enforcement"


class ModuleLoadError(InstallerError):
    """The kernel refused to load a module for a reason other than its signature."""

    code = 9
    slug = "module-load-failed"
    summary = "kernel module failed to load"
    default_remedy = "read the kernel log (dmesg) on the node for the NVRM message"


class ModuleInUseError(InstallerError):
    """Another driver version is loaded and something still holds it."""

    code = 10
    slug = "module-in-use"
    summary = "loaded module of another version is in use"
    default_remedy = "drain GPU pods from the node (or reboot it), then rerun"


class StagingError(InstallerError):
    """The user-mode files could not be placed in the install directory."""

    code = 11
    slug = "staging-failed"
    summary = "user-mode driver staging failed (disk, permissions)"
    default_remedy = "check free space and permissions of the install directory"


class VerificationError(InstallerError):
    """NVML or the CUDA driver API disagrees with what was installed."""

    code = 12
    slug = "verification-failed"
    summary = "NVML/CUDA verification failed"
    default_remedy = "check that the kernel module and user-mode driver versions match"


class LockHeldError(InstallerError):
    """Another installer run holds the node lock."""

    code = 13
    slug = "lock-held"
    summary = "another installer run holds the lock"
    default_remedy = "wait for the other run to finish (its PID is given) or raise --lock-timeout"


class IncompatibleError(InstallerError):
    """The driver cannot serve the node's GPUs or a CUDA toolkit, a workload would not
    get a GPU or run on this node (`check-pod`), or a kernel of the fleet has no driver
    package (`preflight`)."""

    code = 14
    slug = "incompatible"
    summary = ("driver does not support this GPU or CUDA toolkit, a workload breaks a "
               "GPU pod rule (check-pod), or a kernel has no driver package (preflight)")
    default_remedy = ("pick a driver version that supports the GPU (see `compat`), or fix "
                      "the workload as check-pod says")


class UpgradeBlockedError(InstallerError):
    """A driver upgrade cannot free the GPUs without harm: a holder is not an evictable pod
    (a host process, a static or DaemonSet pod), a pod that must go would be lost for good
    (no controller, emptyDir data) and the settings do not allow it, or the API refused.
    Nothing was cordoned or unloaded. (A node labelled upgrade.skip=true is
    not an error: it keeps its driver; only a label seen after the first read stops here.)"""

    code = 15
    slug = "upgrade-blocked"
    summary = ("driver upgrade blocked: a GPU holder or GPU pod cannot be evicted as the "
               "settings stand, or the Kubernetes API refused")
    default_remedy = ("stop the named holder, set the setting named for each pod "
                      "(UPGRADE_RESTART_DAEMONSETS, UPGRADE_FORCE, "
                      "UPGRADE_DELETE_EMPTYDIR_DATA) or delete the pod yourself, or check "
                      "the installer's RBAC, then rerun")


class UpgradeTimeoutError(InstallerError):
    """The GPUs were not freed within UPGRADE_TIMEOUT (a PodDisruptionBudget kept refusing,
    or pods did not exit); the old driver still serves and the node stays cordoned."""

    code = 16
    slug = "upgrade-timeout"
    summary = "GPUs not freed within UPGRADE_TIMEOUT; old driver kept, node left cordoned"
    default_remedy = ("read the node's Events, relax the PodDisruptionBudget or raise "
                      "UPGRADE_TIMEOUT; the next run resumes")


class UpgradeWaitingError(InstallerError):
    """A driver upgrade waited UPGRADE_TIMEOUT for its turn (UPGRADE_MAX_UNAVAILABLE other
    nodes stayed unavailable) and did not get it: not a failure of this node, which was not
    touched and still serves its old driver; the next run waits again."""

    code = 17
    slug = "upgrade-waiting"
    summary = ("driver upgrade still waiting for its turn: other nodes are unavailable; "
               "this node untouched, old driver serving")
    default_remedy = ("finish or fix the named nodes, or raise UPGRADE_MAX_UNAVAILABLE; the "
                      "next run waits for its turn again")


class InterruptedRun(InstallerError):
    """SIGINT (Ctrl-C) stopped the run; what it had begun was undone (see
    `installer.node.interrupts`)."""

    code = 130
    slug = "interrupted"
    summary = "stopped by SIGINT (Ctrl-C); temp files removed, the previous version kept"
    default_remedy = "nothing to repair: rerun when wanted, it starts the stage over"


class TerminatedRun(InstallerError):
    """SIGTERM (the kubelet deleting the pod, a drain) stopped the run; as for SIGINT."""

    code = 143
    slug = "terminated"
    summary = ("stopped by SIGTERM (pod deleted, node drained); temp files removed, the "
               "previous version kept")
    default_remedy = ("nothing to repair: the next run (the recreated pod) starts the "
                      "stage over")


def error_table() -> list[type[InstallerError]]:
    """One class per exit code, ordered by code, for help text and the reference table.

    Finer-grained errors subclass one of these and inherit its code, so only the
    direct subclasses of `InstallerError` define codes.
    """
    classes: list[type[InstallerError]] = [InstallerError, *InstallerError.__subclasses__()]
    return sorted(classes, key=lambda cls: cls.code)


# --- finer-grained kernel-module failures; codes come from their base class ----------------


class KernelWithoutModulesError(UnsupportedNodeError):
    """The running kernel was built without loadable-module support (ENOSYS)."""


class ModuleAlreadyLoadedError(ModuleLoadError):
    """finit_module said EEXIST: a module of that name is already in the kernel."""


class NoGpuRespondedError(ModuleLoadError):
    """The driver initialised but found no NVIDIA GPU it can drive (ENODEV)."""


class ModuleDependencyError(ModuleLoadError):
    """The module needs symbols from a module that is not loaded (ENOENT)."""


class ModulePermissionError(ModuleLoadError):
    """The kernel refused the load for lack of privilege or under lockdown (EPERM)."""


class GpuClaimedError(ModuleLoadError):
    """Another kernel driver (nouveau, vfio-pci) owns the GPUs the module would drive."""


class CompressedModuleError(ModuleLoadError):
    """A compressed host module cannot be loaded: the kernel does not decompress modules."""


# --- MIG partitioning; codes come from their base class ---------------------------------


class MigConfigError(ConfigError):
    """A MIG layout is malformed or names a profile NVIDIA does not define (exit 2)."""

    default_remedy = ("name profiles as NVIDIA does (e.g. `1g.10gb`) with positive counts; "
                      "the error lists the sizes this GPU offers")


class MigLayoutError(IncompatibleError):
    """A well-formed MIG layout this GPU cannot take: a size it does not offer, more slices
    or instances than fit its placements, or MIG on a GPU without MIG (exit 14)."""

    default_remedy = "pick sizes the named GPU offers (listed) whose slices fit in 7"


class MigInUseError(ModuleInUseError):
    """NVML refused to change a GPU's MIG layout because something holds the GPU or one of
    its instances (NVML_ERROR_IN_USE); what was already changed stays (exit 10)."""

    default_remedy = ("free the GPU (drain its pods, or UPGRADE_POLICY=evict|drain), then "
                      "rerun: the rest of the layout is applied then")


class MigNvmlError(VerificationError):
    """An NVML call reading or changing a GPU's MIG layout failed for another reason
    (exit 12)."""

    default_remedy = ("read the NVML error named; rerun (a partial layout is completed), "
                      "or reset the GPU if it persists")


# --- a full filesystem, wherever a write meets it -----------------------------------------

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFullError(StagingError):
    """A write found its filesystem full (ENOSPC) or the quota spent (EDQUOT)."""

    default_remedy = "free space on that filesystem, or point the directory at a larger one"


def disk_full(exc: BaseException, path: Path | str | None = None, needed: int | None = None,
              *, cleaned: bool = True) -> DiskFullError | None:
    """The one line for a write that found no space: the path, bytes needed and free; None
    for any other failure. `path` defaults to the file the OSError names; `cleaned` says
    the caller removed what it had half-written."""
    if not isinstance(exc, OSError) or exc.errno not in NO_SPACE:
        return None
    named = path if path is not None else exc.filename
    where = Path(os.fsdecode(named)) if named is not None else None
    free = free_bytes(where) if where is not None else None
    need = f"{needed} bytes needed, " if needed is not None else ""
    have = f"{free} free" if free is not None else "free space unknown"
    cause = "disk full" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    shown = where if where is not None else "a file (rerun with --debug for its path)"
    kept = "; nothing half-written kept" if cleaned else ""
    return DiskFullError(f"{cause} writing {shown} ({need}{have}){kept}",
                         remedy=f"free {f'at least {needed} bytes' if needed else 'space'} "
                                "on that filesystem, or point the directory (--cache-dir, "
                                "--install-dir) at a larger one")


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on `path`'s filesystem (its nearest
    existing ancestor's), or None when it cannot be told."""
    for candidate in (path, *path.parents):
        try:
            info = os.statvfs(candidate)
        except OSError:
            continue
        return info.f_bavail * info.f_frsize
    return None


@contextmanager
def space_for(path: Path, needed: int | None = None, *, partial: Path | None = None
              ) -> Iterator[None]:
    """Turn a full filesystem inside the block into DiskFullError, removing `partial`
    (the file being written) first so nothing half-written stays behind."""
    try:
        yield
    except OSError as exc:
        error = disk_full(exc, path, needed)
        if error is None:
            raise
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise error from None


def printable(text: str) -> str:
    """`text` with control, unassigned and surrogate characters escaped (`\\x1b`, `\\ud800`)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
