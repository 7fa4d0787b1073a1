"""Whether `signal` may publish readiness itself on this node, now.

On a node with an NVLink fabric (NVSwitch, NVLink5) CUDA fails with 802 until Fabric
Manager has trained every GPU's fabric, while the driver verifies fine: readiness published
then is a lie every consumer acts on. So on such a node `signal` publishes only once every
GPU's fabric has completed with success (`installer.node.gpufabric`), waiting up to
FABRIC_WAIT seconds (0, the default: not at all) for it; otherwise it leaves the document
held for the agent, which publishes those bytes when the fabric completes. NVML is the
library the verify stage bound before, in the same process (by path: the staged driver's);
each reading initialises and shuts it down, as verify does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pynvml  # type: ignore[import-untyped]

from installer.context import Context
from installer.errors import VerificationError
from installer.node.gpufabric import GpuFabric, fabric_done, not_done_detail, read_fabric

POLL_S = 0.2


class FabricNotReadyError(VerificationError):
    """`--fabric-wait` passed and some GPU's fabric has not completed."""


def read_live() -> list[GpuFabric]:
    """Every GPU's fabric now, NVML initialised around the reading."""
    pynvml.nvmlInit()
    try:
        return read_fabric()
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def pending(ctx: Context, read: Callable[[], list[GpuFabric]] = read_live) -> str | None:
    """None when readiness may be published now; else why not (the GPUs not done). With
    FABRIC_WAIT > 0 it waits that long first, then FabricNotReadyError (exit 12)."""
    kind = ctx.node_info().fabric.kind
    if kind == "none":
        return None
    wait = ctx.config.fabric_wait
    deadline = time.monotonic() + wait
    while True:
        why = _why_not(read)
        if why is None:
            return None
        if time.monotonic() >= deadline:
            break
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    if wait > 0:
        raise FabricNotReadyError(
            f"readiness not published: {why} after --fabric-wait {wait:g}s",
            remedy="start Fabric Manager (the agent does, or the node's own service) and "
                   "wait for it to train the fabric; `status` shows each GPU")
    return f"{why}: readiness is held for the agent, which publishes it once every " \
           "GPU's fabric completes"


def _why_not(read: Callable[[], list[GpuFabric]]) -> str | None:
    try:
        gpus = read()
    except Exception as exc:  # NVML failing is "not known to be trained", never a crash
        return f"cannot read the GPUs' fabric state ({type(exc).__name__}: {exc})"
    if fabric_done(gpus):
        return None
    return f"fabric not complete on {not_done_detail(gpus) or 'no GPUs'}"
