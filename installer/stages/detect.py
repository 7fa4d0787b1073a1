"""The detect stage: what node is this, which NVIDIA devices does it have, what is loaded.

Reads only; never writes. The facts themselves are read by `installer.node.facts`; this
stage reports them, and `install` refuses a node without GPUs (`require_gpus`).
"""

from __future__ import annotations

from installer.context import Context
from installer.errors import NoGpuError
from installer.node.facts import NodeInfo, detect_node


def run(ctx: Context) -> NodeInfo:
    """Stage entry point."""
    return detect_node(ctx.host)


def require_gpus(node: NodeInfo) -> None:
    """`install` stops here on a node without NVIDIA GPUs, with its own exit code."""
    if not node.gpus:
        raise NoGpuError("no NVIDIA GPU on this node (no PCI function of vendor 10de, "
                         "class 0300/0302)")
