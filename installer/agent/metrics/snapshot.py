"""What one collection saw, frozen: a scrape renders it and never asks NVML or the kubelet.

The collector builds a new `Snapshot` every interval and swaps the reference in one
assignment, so a scrape on the HTTP server's thread always sees one whole collection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from installer.node.podresources import Assignment


@dataclass(frozen=True)
class GpmReading:
    """One GPU's GPM answer: `supported` False with the reason, or the metrics (percent)
    NVML gave over the last interval (a metric NVML refused is left out), for the whole GPU
    and, with MIG on, for each GPU instance (by its GI id) that NVML sampled."""

    supported: bool
    reason: str = ""
    values: dict[str, float] = field(default_factory=dict)
    instances: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML reported it this pass; a reading NVML refused is None (not shown)."""

    index: int
    uuid: str
    model: str  # NVML's name, as GKE's device plugin labels `model`
    pci_bus_id: str
    minor: int | None = None  # /dev/nvidia<minor>
    duty_cycle: float | None = None  # percent of the window the GPU was busy
    utilization_source: str = "samples"  # or "instant" (nvmlDeviceGetUtilizationRates)
    memory_used: int | None = None  # bytes, reserved included (NVML's v1 `used`)
    memory_total: int | None = None
    memory_free: int | None = None
    memory_reserved: int | None = None  # set aside by the driver and firmware (v2 only)
    temperature: float | None = None  # degrees C
    power_watts: float | None = None
    ecc: dict[str, int] = field(default_factory=dict)  # corrected|uncorrected, volatile
    remapped: dict[str, int] = field(default_factory=dict)  # correctable|uncorrectable|...
    mig_uuids: tuple[str, ...] = ()  # its MIG devices' UUIDs (MIG mode on)
    mig_instances: dict[str, int] = field(default_factory=dict)  # MIG UUID -> its GI id
    gpm: GpmReading | None = None  # None: GPM off (METRICS_GPM_INTERVAL=0) or not read

    @property
    def device_minor(self) -> int:
        """/dev/nvidia<minor> (the index where NVML gave no minor)."""
        return self.minor if self.minor is not None else self.index

    def device_ids(self) -> tuple[str, ...]:
        """The names a device plugin may give this GPU: its UUID, nvidia<minor>, its index,
        and the UUIDs of its MIG devices."""
        return (self.uuid, f"nvidia{self.device_minor}", str(self.index), *self.mig_uuids)


@dataclass(frozen=True)
class InstallFacts:
    """What the install recorded on the node (`.state.json`, `.last-install.json`)."""

    driver_version: str = ""
    flavour: str = ""
    kernel: str = ""
    cuda_version: str = ""
    package_digest: str = ""
    exit_code: int | None = None
    fast_path: bool | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One collection: the install, the agent's verdict, daemons, fabric, Xids, GPUs and
    (when the kubelet answered) which container holds which GPU."""

    taken_at: float  # time.time() of the collection
    node_name: str = ""
    install: InstallFacts = InstallFacts()
    ready: bool | None = None  # None: the agent has not decided yet
    daemons: tuple[tuple[str, bool, int], ...] = ()  # (name, up, restarts)
    fabric: tuple[tuple[int, str], ...] = ()  # (GPU index, state)
    xids: tuple[tuple[str, int, int], ...] = ()  # (GPU, Xid, count)
    last_xids: tuple[tuple[str, int], ...] = ()  # (GPU, the last Xid seen)
    driver_version: str = ""  # NVML's nvmlSystemGetDriverVersion
    gpus: tuple[GpuReading, ...] = ()
    unreadable: tuple[tuple[int, str], ...] = ()  # (GPU index, cause): GPUs not served
    containers: tuple[Assignment, ...] | None = None  # None: PodResources unavailable
    errors: tuple[tuple[str, int], ...] = ()  # (source, count since the agent started)
