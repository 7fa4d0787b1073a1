"""`uninstall`: take the driver off the node, or refuse while GPU pods still use it.

Order matters: first prove the modules can go (nothing holds them), then withdraw
readiness, unload, remove device nodes, our CDI spec (never another's), the linker entry and
the staged versions. A refusal happens before anything is touched, so running GPU pods
never lose their driver.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from installer.context import Context
from installer.errors import ModuleLoadError, StagingError
from installer.installdir import cdifile, layout, ownership
from installer.installdir.readiness import clear_readiness
from installer.node import kmod
from installer.stages import load

INSTALL_DIR_ENTRIES = (*layout.TOP_LINKS, layout.VERSIONS, layout.CURRENT, layout.PREVIOUS,
                       layout.STATE_FILE, layout.LAST_INSTALL_FILE, layout.SKIPPED_FILE,
                       layout.DEVNODES_FILE, layout.DRIVER_ROOT_DIR, layout.AGENT_VIEW,
                       layout.AGENT_DIR, layout.CDI_RECORD, layout.MIG_RECORD,
                       layout.MIG_REBOOT_RECORD)


@dataclass(frozen=True)
class UninstallResult:
    """What was removed."""

    unloaded: list[str]
    device_nodes: list[str]
    removed: list[str]

    def log_fields(self) -> dict[str, Any]:
        return {"unloaded": len(self.unloaded), "removed": len(self.removed)}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_text(self) -> str:
        return "\n".join([f"Unloaded:        {', '.join(self.unloaded) or 'nothing'}",
                          f"Device nodes:    {len(self.device_nodes)} removed",
                          f"Removed:         {', '.join(self.removed) or 'nothing'}"])


def run(ctx: Context, *, keep_cache: bool = False) -> UninstallResult:
    """Unload (refusing with the holders listed when in use), then remove our files."""
    unloaded: list[str] = []
    if kmod.loaded_modules(ctx.host) is not None:
        unloaded = load.unload(ctx.host).unloaded
    elif kmod.loaded_driver(ctx.host) is not None:
        raise ModuleLoadError("this kernel has no module support but reports a loaded "
                              "NVIDIA driver", remedy="the driver is built in; nothing to do")
    clear_readiness(ctx.config, ctx.host.roots)
    nodes = remove_device_nodes(ctx.host.roots.dev)
    removed = [*cdifile.withdraw(ctx.config, ctx.host.roots),
               *remove_install_files(ctx, keep_cache=keep_cache)]
    return UninstallResult(unloaded, nodes, removed)


def remove_device_nodes(dev: Path) -> list[str]:
    """Every /dev/nvidia* node, /dev/nvidia-caps and the /dev/char links pointing at them.

    `dev` is already confined (Roots); entries are removed by name, never followed.
    """
    removed = []
    for path in sorted(dev.glob("nvidia*")):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    char = dev / "char"
    for link in sorted(char.glob("*:*")) if char.is_dir() and not char.is_symlink() else []:
        target = _readlink(link)
        if target is not None and Path(target).name.startswith("nvidia"):
            link.unlink(missing_ok=True)
    return removed


def _readlink(path: Path) -> str | None:
    try:
        return str(path.readlink())
    except OSError:
        return None


def remove_install_files(ctx: Context, *, keep_cache: bool) -> list[str]:
    """The linker entry, staged versions, links and state (the cache unless kept).

    Only in an install dir that is the installer's; what was there before it (GKE's own
    installer's files, moved aside) comes back; a real directory where a link of ours
    would be is someone else's and stays.
    """
    root = ctx.install_root
    removed = []
    try:
        conf = ctx.host.roots.node_entry(layout.LDCONF_NODE_PATH)
        if conf.is_file() or conf.is_symlink():
            conf.unlink()
            removed.append(str(layout.LDCONF_NODE_PATH))
        if not ownership.ours(root):
            return removed
        entries = [*INSTALL_DIR_ENTRIES, *(() if keep_cache else (layout.CACHE_DIR,))]
        for name in entries:
            if _remove_own(root / name, link_only=name in layout.TOP_LINKS):
                removed.append(name)
        restored = ownership.restore_aside(root)
        if restored:
            ctx.log.warning("restored what was in the install dir before the installer",
                            install_dir=str(ctx.config.install_dir), entries=restored)
            ownership.unmark(root)
    except OSError as exc:
        raise StagingError(f"cannot remove files from {ctx.config.install_dir}: {exc}") from exc
    return removed


def _remove_own(path: Path, *, link_only: bool) -> bool:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir() and not link_only:
        shutil.rmtree(path)
    else:
        return False
    return True
