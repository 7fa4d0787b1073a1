"""The MIG plan, pure: is a wanted layout possible on these GPUs, and which GPUs differ.

Nothing here touches a GPU, so a layout is refused before anything changes: every GPU's
layout is checked against its MIG model, placements included, before the first NVML call that
writes: the model NVML itself reported for the GPU where it did (`GpuNow.nvml_model`), the
profile table (`installer.compat.mig`) only where NVML gave none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from installer.compat.mig import PROFILE_NAME, MigModel, known_profile, mig_model, offered_by
from installer.errors import MigConfigError, MigLayoutError
from installer.node.documents import quote


@dataclass(frozen=True)
class GpuLayout:
    """What a GPU is split into: MIG on or off and the instances by profile."""

    mig_enabled: bool
    devices: tuple[tuple[str, int], ...]  # (profile name, count), sorted by name


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance) as NVML enumerates it under its GPU: `index` is
    NVML's MIG device index, the one nvidia-ctk's CDI names use (`<gpu>:<index>`)."""

    index: int
    uuid: str
    gi: int
    ci: int
    profile: str = ""  # its GPU instance's profile name (`1g.5gb`)
    # NVML's nvmlDeviceGetAttributes under gpu-feature-discovery's names (`memory` in MiB,
    # `multiprocessors`, `slices.gi`, `slices.ci`, `engines.copy`, ...); () if unanswered
    attributes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class GpuNow:
    """One GPU as NVML reports it now."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    layout: GpuLayout
    mode_pending: bool  # MIG mode switched but a reset is pending (A100)
    mig_devices: tuple[MigDevice, ...] = ()  # MIG mode on: what containers may be given
    # the MIG model from NVML's own answer (`installer.compat.mignvml`); None: NVML gave no
    # profiles (MIG off on an older driver, a dry run without one): the table's is used
    nvml_model: MigModel | None = field(default=None, compare=False)


def model_of(gpu: GpuNow) -> MigModel | None:
    """The GPU's MIG model: NVML's answer where it gave one, else the table's (None: no
    MIG)."""
    return gpu.nvml_model if gpu.nvml_model is not None else mig_model(gpu.name,
                                                                         gpu.memory_mib)


@dataclass(frozen=True)
class GpuChange:
    """One GPU whose layout differs from the wanted one."""

    gpu: GpuNow
    want: GpuLayout
    mode_change: bool


def layout(mig_enabled: bool, devices: dict[str, int]) -> GpuLayout:
    """A layout in its one comparable form: counts above zero, sorted by name."""
    return GpuLayout(mig_enabled, tuple(sorted((n, c) for n, c in devices.items() if c)))


def normal(want: GpuLayout) -> GpuLayout:
    """`want` in the form `layout` builds (so two spellings of one layout compare equal)."""
    counts: dict[str, int] = {}
    for name, count in want.devices:
        counts[name] = counts.get(name, 0) + count
    return layout(want.mig_enabled, counts)


def describe(want: GpuLayout) -> str:
    """A layout in words: `MIG off`, `MIG on, no instances`, `2x 1g.5gb + 1x 3g.20gb`."""
    if not want.mig_enabled:
        return "MIG off"
    if not want.devices:
        return "MIG on, no instances"
    return " + ".join(f"{count}x {name}" for name, count in want.devices)


def validate(want: dict[int, GpuLayout], gpus: list[GpuNow]) -> None:
    """Refuse a layout before anything changes: MigConfigError (malformed, unknown profile)
    or MigLayoutError (this GPU cannot take it), naming the GPU and the sizes it offers."""
    by_index = {gpu.index: gpu for gpu in gpus}
    for index in sorted(want):
        _well_formed(index, want[index], by_index)
    for index in sorted(want):
        _fits(by_index[index], want[index])


def _well_formed(index: int, wanted: GpuLayout, gpus: dict[int, GpuNow]) -> None:
    """Exit 2 for a layout no GPU could take: a GPU the node lacks, a size NVIDIA does not
    define, a count that is not a positive whole number, instances with MIG off."""
    if index not in gpus:
        have = ", ".join(str(i) for i in sorted(gpus)) or "none"
        raise MigConfigError(f"the MIG layout names GPU {index}, which this node lacks "
                             f"(its GPUs: {have})",
                             remedy="name only the node's GPU indexes (or `all`)")
    for name, count in wanted.devices:
        if not isinstance(name, str) or not PROFILE_NAME.match(name) or not (
                known_profile(name) or name in _offers(gpus[index])):
            gpu = gpus[index]
            model = model_of(gpu)
            where = f"GPU {index} ({gpu.name})"
            if model is None:
                raise MigConfigError(f"{where}: {quote(name)} is not a MIG profile NVIDIA defines, "
                                     "and this GPU has no MIG",
                                     remedy="leave MIG off for this GPU (mig-enabled false)")
            raise MigConfigError(f"{where}: {quote(name)} is not a MIG profile NVIDIA defines; "
                                 f"this GPU's profiles are {', '.join(model.profiles)}",
                                 remedy=f"use one of them (e.g. {next(iter(model.profiles))})")
        _this_models(index, gpus[index], name)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise MigConfigError(f"GPU {index}: the count of {name} must be a whole number "
                                 f"of 1 or more, not {quote(count)}")
    if wanted.devices and not wanted.mig_enabled:
        raise MigConfigError(f"GPU {index}: MIG instances asked for with mig-enabled false",
                             remedy="set mig-enabled true, or drop the instances")


def _offers(gpu: GpuNow) -> dict[str, object]:
    model = model_of(gpu)
    return dict(model.profiles) if model is not None else {}


def _this_models(index: int, gpu: GpuNow, name: str) -> None:
    """Exit 2 for a size NVIDIA defines for other models only, naming those models."""
    model = model_of(gpu)
    if model is None or name in model.profiles:
        return
    raise MigConfigError(f"GPU {index} ({gpu.name}): {name} is a MIG size of "
                         f"{', '.join(offered_by(name))}, not of this GPU ({model.name}), "
                         f"whose profiles are {', '.join(model.profiles)}",
                         remedy=f"use one of this GPU's (e.g. {next(iter(model.profiles))}), "
                                "or a device-filter so the entry reaches only those models")


def _fits(gpu: GpuNow, wanted: GpuLayout) -> None:
    """Exit 14 for a layout this GPU cannot take."""
    if not wanted.mig_enabled:
        return
    model = model_of(gpu)
    where = f"GPU {gpu.index} ({gpu.name}, {gpu.memory_mib} MiB)"
    if model is None:
        raise MigLayoutError(f"{where} has no MIG; it cannot be partitioned",
                             remedy="leave MIG off for this GPU (mig-enabled false), or "
                                    "select only MIG nodes (A100, A30, H100, H200, GH200, "
                                    "B200, GB200, B300, GB300, RTX PRO 6000)")
    counts = dict(normal(wanted).devices)
    if model.pack(counts) is None:
        raise MigLayoutError(f"{where} cannot hold {describe(normal(wanted))}: "
                             f"{_why(model, counts)}; it offers {model.offers()} "
                             f"within {model.compute_slices} compute slices")


def _why(model: MigModel, counts: dict[str, int]) -> str:
    """Which rule the layout breaks, for the error line."""
    for name, count in counts.items():
        if count > model.profiles[name].max_count:
            return f"at most {model.profiles[name].max_count} of {name} fit"
    slices = sum(model.profiles[name].slices * count for name, count in counts.items())
    if slices > model.compute_slices:
        return f"it takes {slices} compute slices of {model.compute_slices}"
    return "no placement of those instances fits the GPU's memory slots"


def changes(want: dict[int, GpuLayout], gpus: list[GpuNow]) -> list[GpuChange]:
    """Only the GPUs whose layout differs from the wanted one; a GPU as wanted is untouched.

    A GPU whose MIG mode is pending (switched, awaiting a reset) differs even when its
    current layout matches, since the pending mode is what a reset would bring."""
    found = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.index not in want:
            continue
        wanted = normal(want[gpu.index])
        if normal(gpu.layout) == wanted and not gpu.mode_pending:
            continue
        mode_change = gpu.layout.mig_enabled != wanted.mig_enabled or gpu.mode_pending
        found.append(GpuChange(gpu, wanted, mode_change))
    return found
