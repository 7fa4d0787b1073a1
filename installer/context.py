"""What every stage sees, and how stages hand their results to each other, typed.

A stage reads the results of earlier stages only through these fields: `node` (detect),
`package` (fetch), `modules_loaded`, `rdma` and `optional` (load ran in this process), `verified`
(verify). The pipeline sets them; a stage never imports another stage. What signal reads
of a verification is the `Verified` protocol below, which verify's result satisfies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from installer.config import Config
from installer.installdir import layout
from installer.node.host import Host

if TYPE_CHECKING:  # types only: importing the CLI must stay cheap
    from structlog.typing import FilteringBoundLogger

    from installer.node.facts import NodeInfo
    from installer.node.optionalmods import OptionalVerdict
    from installer.node.rdma import RdmaVerdict
    from installer.packages.manifest import Package


class VerifiedGpu(Protocol):
    """One GPU as verification saw it."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def pci_bus_id(self) -> str: ...
    @property
    def memory_total_mib(self) -> int: ...
    @property
    def compute_capability(self) -> str | None: ...


class Verified(Protocol):
    """A verification of the staged driver, as readiness needs it."""

    @property
    def passed(self) -> bool: ...
    @property
    def driver_version(self) -> str: ...
    @property
    def cuda_version(self) -> str: ...
    @property
    def kernel_release(self) -> str: ...
    @property
    def flavour(self) -> str | None: ...
    @property
    def digest(self) -> str | None: ...
    @property
    def gpus(self) -> Sequence[VerifiedGpu]: ...


@dataclass
class Context:
    """Settings, the host seam, a logger, and the results of the stages run so far."""

    config: Config
    host: Host
    log: FilteringBoundLogger
    node: NodeInfo | None = None
    package: Package | None = None
    modules_loaded: bool = False
    verified: Verified | None = None
    rdma: RdmaVerdict | None = None  # the load stage's word on nvidia-peermem (this process)
    optional: Sequence[OptionalVerdict] = ()  # its word on gdrdrv, nvidia-fs (this process)
    # /dev nodes a live upgrade withdrew: the load stage does not make them again until the
    # upgrade releases them after verification (GKE's device plugin waits for them)
    held_device_nodes: tuple[str, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)

    def node_info(self) -> NodeInfo:
        """This run's detect result, or a fresh read of the node for a single command."""
        if self.node is None:
            from installer.node.facts import detect_node

            self.node = detect_node(self.host)
        return self.node

    @property
    def install_root(self) -> Path:
        """The install dir as a path in this container."""
        return layout.install_root(self.config, self.host.roots)
