"""The partition stage as the pipeline runs it: the hooks it may not build itself.

A stage imports no other stage and not the upgrade room, so the pipeline hands it an NVML
session over the staged library (the verify stage's binding), the load stage's recorded
device-node maker, the upgrade room's eviction (UPGRADE_POLICY evict|drain) and the reboot.
Without a MIG config the stage is not run at all: no NVML, no timing row.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from installer.context import Context
from installer.installdir.layout import DEVNODES_FILE
from installer.pipeline import runner

if TYPE_CHECKING:
    from installer.node.holders import Holder
    from installer.stages.partition import Hooks, PartitionResult
    from installer.stages.partition.caps import CapNode

NVML_LIB = "lib64/libnvidia-ml.so.1"


def partition(ctx: Context) -> PartitionResult | None:
    """In `install`, after verify and before signal: None when MIG is not configured."""
    from installer.stages import partition as stage

    source = stage.find(ctx)
    if source is None:
        return None
    hooks = make_hooks(ctx)
    return runner.run_stage(ctx, "partition", lambda c: stage.partition(c, source, hooks))


def command(ctx: Context, *, dry_run: bool) -> PartitionResult:
    """The `partition` command: the same stage on its own (`--dry-run` changes nothing).

    A change withdraws readiness, so after one the node is verified and signalled again
    (as `signal` does): readiness and the slice labels then describe the new layout."""
    from installer.stages import partition as stage

    hooks = make_hooks(ctx)
    result = runner.run_stage(ctx, "partition",
                              lambda c: stage.run(c, hooks, dry_run=dry_run))
    if result.changed and not dry_run:
        runner.detect(ctx)
        runner.verify(ctx)
        runner.signal(ctx)
    return result


def make_hooks(ctx: Context) -> Hooks:
    from installer.stages.partition import Hooks

    evict = ctx.config.upgrade_policy in ("evict", "drain")
    return Hooks(nvml=lambda: _nvml(ctx), make_nodes=lambda nodes: _make_nodes(ctx, nodes),
                 free=(lambda h, d: _free(ctx, h, d)) if evict else None, reboot=_reboot)


@contextlib.contextmanager
def _nvml(ctx: Context) -> Iterator[None]:
    """NVML over the install dir's staged library, shut down afterwards."""
    import pynvml  # type: ignore[import-untyped]

    from installer.stages.verify import nvml

    facts = nvml.Facts(ctx.install_root / NVML_LIB)
    nvml.bind_library(facts.lib_path)
    nvml.init(facts)
    try:
        yield
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _make_nodes(ctx: Context, nodes: list[CapNode]) -> object:
    from installer.stages.load import devnodes

    wanted = [devnodes.DeviceNode(n.name, n.major, n.minor, n.mode) for n in nodes]
    return devnodes.ensure_nodes(ctx.host, wanted, record=ctx.install_root / DEVNODES_FILE)


def _free(ctx: Context, holders: Sequence[Holder], devices: Sequence[str]) -> None:
    from installer.upgrade import gpufree

    gpufree.free(ctx, holders, devices)


def _reboot() -> None:
    """As GKE's partitioner: systemd (PID 1 of the node, hostPID) reboots on SIGRTMIN+5."""
    os.kill(1, signal.SIGRTMIN + 5)
