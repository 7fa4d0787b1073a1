"""Each GPU's fabric state: the agent reads it through the shared reader in the node seam
(`installer.node.gpufabric`), which `signal` uses too."""

from installer.node.gpufabric import (
    COMPLETED,
    FAILED,
    NOT_SUPPORTED,
    GpuFabric,
    fabric_done,
    fabric_summary,
    not_done,
    not_done_detail,
    read_fabric,
)

__all__ = ["COMPLETED", "FAILED", "NOT_SUPPORTED", "GpuFabric", "fabric_done",
           "fabric_summary", "not_done", "not_done_detail", "read_fabric"]
