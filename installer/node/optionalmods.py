"""The load stage's word on each optional module (gdrdrv, nvidia-fs), for signal and `status`.

An optional module is one a package lists in `optional_modules`: loaded after the driver,
and whatever happens to it, the GPUs' own readiness stands. Each known one has its own
node condition, so a broken GPUDirect Storage never hides a working GDRCopy.
"""

from __future__ import annotations

from dataclasses import dataclass

# module name -> the node condition's type (after the `gpu-node-installer/` prefix)
CONDITIONS = {"gdrdrv": "GDRCopyReady", "nvidia_fs": "GDSReady"}
NAMES = tuple(CONDITIONS)


@dataclass(frozen=True)
class OptionalVerdict:
    """One optional module: loaded (and its device nodes made), or why not.

    `reason` is the condition's CamelCase reason; `message` one line naming the cause."""

    module: str
    ready: bool
    reason: str
    message: str
    nodes: tuple[str, ...] = ()
    loaded_now: bool = False

    @property
    def condition(self) -> str | None:
        """The condition type this module reports under, or None (an unknown module)."""
        return CONDITIONS.get(self.module)

    def to_dict(self) -> dict[str, object]:
        return {"module": self.module, "ready": self.ready, "reason": self.reason,
                "message": self.message, "device_nodes": list(self.nodes)}
