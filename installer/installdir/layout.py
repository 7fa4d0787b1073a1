"""Every name the installer writes on the node, in one place.

    <install>/.versions/<driver>-<kernel>-<flavour>/{lib64,bin,drivers,firmware}/...
    <install>/.versions/<name>/.staged.json   identity of a complete version directory
    <install>/.current  -> .versions/<name>   switched by one rename(2)
    <install>/.previous -> .versions/<older>  kept for rollback
    <install>/lib64 -> .current/lib64         likewise bin, drivers, firmware
    <install>/.state.json  .ready.json  .devnodes.json  .lock  .cache/
    <install>/.prepare.lock                  held by `prepare` (a next kernel's package)
    <install>/.skipped.json                  an upgrade the Node's upgrade.skip label held back
    <install>/.agent.json  .agent/            the node agent's view and work area
    <install>/.cdi.json                       which CDI spec is ours (path, sha256)
    <CDI_SPEC_DIR>/gpu-node-installer-nvidia.json   the CDI spec (default /var/run/cdi)
    /etc/ld.so.conf.d/gpu-node-installer.conf  /run/nvidia/validations/driver-ready

Paths here are "as seen in this container": the node's path under the host root.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Protocol

from installer.config import Config
from installer.node.host import Roots

# Where a manifest file lands when staged lives with the package format (validation refuses
# packages whose files collide there); these names stay importable from here.
from installer.packages.placement import KIND_DIRS as KIND_DIRS
from installer.packages.placement import Placed as Placed
from installer.packages.placement import destination as destination

VERSIONS = ".versions"
CURRENT = ".current"
PREVIOUS = ".previous"
TOP_LINKS = ("lib64", "bin", "drivers", "firmware")
STAGED_META = ".staged.json"
STATE_FILE = ".state.json"
LAST_INSTALL_FILE = ".last-install.json"  # how the last `install` ended (installdir/lastrun)
READY_FILE = ".ready.json"
SKIPPED_FILE = ".skipped.json"
DEVNODES_FILE = ".devnodes.json"  # the /dev nodes the load stage made (stages/load/devnodes)
CDI_RECORD = ".cdi.json"  # the CDI spec we wrote: its path and digests (installdir/cdifile)
LOCK_FILE = ".lock"
PREPARE_LOCK_FILE = ".prepare.lock"  # `prepare`'s own lock: one preparation at a time
MIG_RECORD = ".mig.json"  # the MIG layout the partition stage left (labels, `status`)
MIG_REBOOT_RECORD = ".mig-reboot.json"  # node reboots asked for a MIG mode, per boot ID
CDI_HOOK = "cdi-hook-update-ldcache"  # the CDI spec's createContainer hook (installdir/cdihook)
CACHE_DIR = ".cache"
AGENT_VIEW = ".agent.json"  # the node agent's view, read by its readiness probe and `status`
AGENT_DIR = ".agent"  # its work area: Fabric Manager's config copy, daemon logs, readiness
DRIVER_ROOT_DIR = "usr"  # --driver-root-layout's usr/lib/<multiarch>, usr/lib64, usr/bin
LDCONF_NODE_PATH = PurePosixPath("/etc/ld.so.conf.d/gpu-node-installer.conf")
VALIDATION_NODE_PATH = PurePosixPath("/run/nvidia/validations/driver-ready")


class Identity(Protocol):
    """What names a version directory (a package manifest has these)."""

    @property
    def driver_version(self) -> str: ...
    @property
    def kernel_release(self) -> str: ...
    @property
    def flavour(self) -> str: ...


def install_root(config: Config, roots: Roots) -> Path:
    """The install dir as a path in this container."""
    return roots.node(config.install_dir)


def cache_root(config: Config, roots: Roots) -> Path:
    """The host cache as a path here: `--cache-dir`, else `<install dir>/.cache`."""
    return roots.node(config.cache_dir or config.install_dir / CACHE_DIR)


def lock_path(config: Config, roots: Roots) -> Path:
    """The node lock every writing command holds (`flock`)."""
    return install_root(config, roots) / LOCK_FILE


def prepare_lock_path(config: Config, roots: Roots) -> Path:
    """`prepare`'s lock: it fills only the cache, so it never takes (or waits on) the
    node lock; this one keeps two preparations from running at once."""
    return install_root(config, roots) / PREPARE_LOCK_FILE


def version_name(identity: Identity) -> str:
    """`<driver>-<kernel>-<flavour>`: one directory per package identity."""
    return f"{identity.driver_version}-{identity.kernel_release}-{identity.flavour}"
