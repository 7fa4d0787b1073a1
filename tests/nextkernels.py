"""Host trees with installed kernels, for the next kernel's tests: a running kernel in the
node's /proc, complete modules trees (`kernel/` and depmod's `modules.dep`), Debian's and
Ubuntu's boot links, the reboot-required marker; and a log that keeps what it was told."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from installer.node.host import RealHost, Roots

RUNNING = "6.1.0-57-amd64"
NEXT = "6.1.0-58-amd64"
OLDER = "6.1.0-40-amd64"


def host_tree(root: Path, running: str = RUNNING) -> RealHost:
    """A node whose running kernel is `running`, with its own modules tree."""
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text(running + "\n")
    for path in ("sys", "dev", "boot", "var/run", "lib/modules"):
        (root / path).mkdir(parents=True, exist_ok=True)
    add_tree(root, running)
    return RealHost(Roots(root, root / "proc", root / "sys", root / "dev"))


def add_tree(root: Path, release: str, *, modules: bool = True, depmod: bool = True) -> Path:
    """/lib/modules/<release> as a kernel package leaves it (`modules`: its kernel/ dir,
    `depmod`: the postinst's modules.dep)."""
    tree = root / "lib/modules" / release
    tree.mkdir(parents=True, exist_ok=True)
    if modules:
        (tree / "kernel/drivers").mkdir(parents=True, exist_ok=True)
    if depmod:
        (tree / "modules.dep.tmp").write_text("kernel/drivers/x.ko:\n")
        os.rename(tree / "modules.dep.tmp", tree / "modules.dep")  # as depmod writes it
    return tree


def boot_link(root: Path, link: str, target: str) -> None:
    """`/vmlinuz` (Debian: `boot/vmlinuz-R`) or `/boot/vmlinuz` (Ubuntu: `vmlinuz-R`)."""
    path = root / link.lstrip("/")
    if path.is_symlink():
        path.unlink()
    path.symlink_to(target)


class Log:
    """A structlog-shaped logger that keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _keep(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))

    def __getattr__(self, level: str) -> Any:
        if level in ("debug", "info", "warning", "error"):
            return self._keep(level)
        raise AttributeError(level)

    def events(self, event: str) -> list[dict[str, Any]]:
        return [fields for _, name, fields in self.lines if name == event]
