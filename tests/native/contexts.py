"""Contexts over temp host trees for the stage/verify/signal tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from installer.cli import logs
from installer.config import load_config
from installer.context import Context
from installer.node.host import CommandResult, RealHost, Roots


class RecordingHost(RealHost):
    """The real host, except that commands are recorded and answered, not run."""

    def __init__(self, roots: Roots) -> None:
        super().__init__(roots)
        self.commands: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 120.0) -> CommandResult:
        args = tuple(str(a) for a in argv)
        self.commands.append(args)
        return CommandResult(args, 0, "", "")


def make_ctx(root: Path, **flags: object) -> Context:
    """A context for the node tree at `root` (settings as flags; no environment)."""
    config = load_config({"host_root": str(root), "proc_root": str(root / "proc"),
                          "sys_root": str(root / "sys"), **flags}, {})
    return Context(config=config, host=RecordingHost(Roots.from_config(config)),
                   log=logs.get_logger())


def node_args(root: Path) -> list[str]:
    """CLI flags that point the installer at a host tree."""
    return ["--host-root", str(root), "--proc-root", str(root / "proc"),
            "--sys-root", str(root / "sys")]
