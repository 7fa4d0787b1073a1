"""The real pynvml over a compiled NVML stand-in, for tests of code that expects NVML
already initialised (the agent's fabric and Xid readers).

A session is NVML's own pairing, as its header declares it (NVIDIA/go-nvml
`gen/nvml/nvml.h` at 2f9e261fe40a7a1c54783d66805e8920564763b4): `nvmlInitWithFlags` (line
4019) before any call, `nvmlShutdown` (4036) after the last; an Xid appended to the stand-in's
file is one `nvmlEventTypeXidCriticalError` event (3168) for `nvmlEventSetWait_v2` (9979)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml  # type: ignore[import-untyped]

from installer.stages.verify.nvml import bind_library
from native import NVML_SONAME


@contextlib.contextmanager
def nvml_session(lib_dir: Path) -> Iterator[None]:
    """pynvml bound to `lib_dir`'s stand-in and initialised; shut down afterwards."""
    bind_library(lib_dir / NVML_SONAME)
    pynvml.nvmlInit()
    try:
        yield
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def clear_fake_env() -> list[str]:
    """Names of every FAKE_* variable in this environment (for a test to unset)."""
    return [name for name in os.environ if name.startswith("FAKE_")]


def append_xids(path: Path, text: str) -> None:
    """Xid events for the stand-in to deliver: lines "<gpu index> <xid>" added to the file
    FAKE_NVML_XID_FILE names (each delivered once)."""
    with path.open("a") as handle:
        handle.write(text)


def h100_mig_node(lib_dir: Path, setenv: Callable[[str, str], object], work: Path) -> None:
    """Two H100s in the stand-in, GPU 1 partitioned (1g.10gb twice, 3g.40gb once: three
    GPU instances, one MIG device each) by the product's own partition code."""
    from installer.stages.partition import nvml as partition
    from installer.stages.partition.plan import GpuLayout, changes, layout

    for name, setting in {"FAKE_NVML_MIG_DIR": work / "mig", "FAKE_NVML_GPUS": "2",
                          "FAKE_NVML_PROC_DIR": work / "proc",
                          "FAKE_NVML_NAME": "NVIDIA H100 80GB HBM3",
                          "FAKE_NVML_MEMORY_MIB": "81559"}.items():
        setenv(name, str(setting))
    with nvml_session(lib_dir):
        want = {0: GpuLayout(False, ()), 1: layout(True, {"1g.10gb": 2, "3g.40gb": 1})}
        for change in changes(want, partition.read_gpus()):
            partition.apply(change)
