"""The MIG profile table as data: every model NVIDIA's mig-parted configures plus GKE's own,
each with where its sizes come from. `installer.compat.mig` builds its models from this.

Provenance (re-read these when a model is added or changed):
- PARTED: NVIDIA/mig-parted `deployments/systemd/config-default.yaml` at commit bd7160f4
  (2026-08-21): the `all-<size>` configs give each size and how many fill one GPU, the
  `all-balanced` device filters give the PCI ids per model. GB200's sizes are those of its
  commit ebab1f77 (2025-08, "do not match the production boards": 1g.23gb, 2g.47gb, 3g.93gb,
  4g.93gb, 7g.186gb replace 1g.24gb, 3g.95gb, 4g.95gb, 7g.189gb); the 1g.23gb+me config is
  headed "GB200, B200" there. RTX PRO 6000's from its commit 9e0382f5 (2025-07).
- GKE: GoogleCloudPlatform/container-engine-accelerators `partition_gpu/partition_gpu.go`
  (`partitionSizeMaxCount`, `partitionSizeToProfileID`) and `pkg/gpu/nvidia/mig/mig.go` at
  commit 992db812 (2026-06-11): the sizes a node pool's gpu-partition-size may name per
  model; it adds RTX PRO 6000's `1g.24gb+me` (nvidia-smi profile id 21, 1 per GPU).
- NVML constants: `NVML_GPU_INSTANCE_PROFILE_*` in nvml.h (go-nvml as vendored by mig-parted
  at bd7160f4): 1_SLICE 0x0, 2_SLICE 0x1, 3_SLICE 0x2, 4_SLICE 0x3, 7_SLICE 0x4,
  1_SLICE_REV1 0x7 (+me), 2_SLICE_REV1 0x8 (2g+me), 1_SLICE_REV2 0x9 (1g, double memory),
  1/2/4_SLICE_GFX 0xA/0xB/0xC (+gfx), 1/2_SLICE_NO_ME 0xD/0xE (-me), 1/2_SLICE_ALL_ME
  0xF/0x10 (+me.all).
- Placements: NVIDIA's MIG User Guide, "Supported MIG Profiles" (`nvidia-smi mig -lgipp`):
  on 8 memory slots and 7 compute slices, 1g `{0..6}:1`, 1g double memory `{0,2,4,6}:2`,
  2g `{0,2,4}:2`, 3g `{0,4}:4`, 4g `{0}:4`, 7g `{0}:8`; on the 4-slot, 4-slice parts (A30,
  RTX PRO 6000) 1g `{0..3}:1`, 2g `{0,2}:2`, 4g `{0}:4`, media and graphics variants where
  their base size goes.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTED = "NVIDIA/mig-parted deployments/systemd/config-default.yaml @ bd7160f4"
GKE = ("GoogleCloudPlatform/container-engine-accelerators partition_gpu/partition_gpu.go, "
       "pkg/gpu/nvidia/mig/mig.go @ 992db812")
GUIDE = "NVIDIA MIG User Guide, Supported MIG Profiles (placements)"

# (memory slots, NVML GPU-instance profile constant) -> (compute slices, slots taken, starts)
SHAPES: dict[tuple[int, int], tuple[int, int, tuple[int, ...]]] = {
    (8, 0x0): (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (8, 0x7): (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (8, 0x9): (1, 2, (0, 2, 4, 6)),
    (8, 0x1): (2, 2, (0, 2, 4)),
    (8, 0x2): (3, 4, (0, 4)),
    (8, 0x3): (4, 4, (0,)),
    (8, 0x4): (7, 8, (0,)),
    (4, 0x0): (1, 1, (0, 1, 2, 3)),
    (4, 0x7): (1, 1, (0, 1, 2, 3)),
    (4, 0xA): (1, 1, (0, 1, 2, 3)),
    (4, 0xD): (1, 1, (0, 1, 2, 3)),
    (4, 0xF): (1, 1, (0, 1, 2, 3)),
    (4, 0x1): (2, 2, (0, 2)),
    (4, 0x8): (2, 2, (0, 2)),
    (4, 0xB): (2, 2, (0, 2)),
    (4, 0xE): (2, 2, (0, 2)),
    (4, 0x10): (2, 2, (0, 2)),
    (4, 0x3): (4, 4, (0,)),
    (4, 0xC): (4, 4, (0,)),
}


@dataclass(frozen=True)
class ModelRow:
    """One MIG model: how NVML names it, its PCI ids, and its sizes (name, GI constant,
    how many fill one GPU) as mig-parted's `all-<size>` configs and GKE's list give them."""

    name: str
    families: tuple[str, ...]  # regexes on the NVML name
    memory_mib: int  # nominal memory: picks the variant nearest to what NVML reports
    pci_ids: tuple[str, ...]  # 0xDDDDVVVV, as mig-parted's device filters name them
    slots: int  # memory slots (8, or 4 on the 4-slice parts)
    needs_reset: bool  # Ampere: a mode change stays pending until a GPU reset
    profiles: tuple[tuple[str, int, int], ...]
    sources: tuple[str, ...]


def _seven(one: int, double: int, two: int, three: int, seven: int, *, me: bool = True
           ) -> tuple[tuple[str, int, int], ...]:
    """The 7-slice sizes of a model (the 4g size has the 3g's memory on every such part)."""
    rows = [(f"1g.{one}gb", 0x0, 7)] + ([(f"1g.{one}gb+me", 0x7, 1)] if me else [])
    return (*rows, (f"1g.{double}gb", 0x9, 4), (f"2g.{two}gb", 0x1, 3),
            (f"3g.{three}gb", 0x2, 2), (f"4g.{three}gb", 0x3, 1), (f"7g.{seven}gb", 0x4, 1))


_BOTH = (PARTED, GKE, GUIDE)
_PARTED_ONLY = (PARTED, GUIDE)

ROWS: tuple[ModelRow, ...] = (
    ModelRow("A100-40GB", (r"\bA100\b", r"\bA800\b"), 40 * 1024,
             ("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"), 8, True,
             _seven(5, 10, 10, 20, 40), _BOTH),
    ModelRow("A100-80GB", (r"\bA100\b", r"\bA800\b"), 80 * 1024,
             ("0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE"), 8, True,
             _seven(10, 20, 20, 40, 80), _BOTH),
    ModelRow("A30-24GB", (r"\bA30\b",), 24 * 1024, ("0x20B710DE",), 4, True,
             (("1g.6gb", 0x0, 4), ("1g.6gb+me", 0x7, 1), ("2g.12gb", 0x1, 2),
              ("2g.12gb+me", 0x8, 1), ("4g.24gb", 0x3, 1)), _PARTED_ONLY),
    ModelRow("H100-80GB", (r"\bH100\b", r"\bH800\b"), 80 * 1024,
             ("0x233010DE", "0x233110DE", "0x232210DE", "0x232410DE"), 8, False,
             _seven(10, 20, 20, 40, 80), _BOTH),
    ModelRow("H100-94GB", (r"\bH100\b", r"\bH800\b"), 94 * 1024,
             ("0x232110DE", "0x233A10DE"), 8, False, _seven(12, 24, 24, 47, 94), _PARTED_ONLY),
    ModelRow("GH200-96GB", (r"\bGH200\b", r"\bH100\b", r"\bH20\b", r"\bPG506\b"), 96 * 1024,
             ("0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"), 8, False,
             _seven(12, 24, 24, 48, 96), _PARTED_ONLY),
    ModelRow("GH200-144GB", (r"\bGH200\b",), 144 * 1024, ("0x234810DE",), 8, False,
             _seven(18, 36, 36, 72, 144), _PARTED_ONLY),
    ModelRow("H200-141GB", (r"\bH200\b",), 141 * 1024, ("0x233510DE", "0x233B10DE"), 8, False,
             _seven(18, 35, 35, 71, 141), _BOTH),
    ModelRow("B200", (r"\bB200\b",), 180 * 1024, ("0x290110DE",), 8, False,
             _seven(23, 45, 45, 90, 180), _BOTH),
    ModelRow("GB200", (r"\bGB200\b",), 186 * 1024, ("0x294110DE",), 8, False,
             _seven(23, 47, 47, 93, 186), _BOTH),
    ModelRow("B300", (r"\bB300\b",), 269 * 1024, ("0x318210DE",), 8, False,
             _seven(34, 67, 67, 135, 269), _PARTED_ONLY),
    ModelRow("GB300", (r"\bGB300\b",), 278 * 1024, ("0x31C210DE",), 8, False,
             _seven(35, 70, 70, 139, 278), _PARTED_ONLY),
    ModelRow("RTX-PRO-6000", (r"\bRTX PRO 6000\b",), 96 * 1024, ("0x2BB510DE",), 4, False,
             (("1g.24gb", 0x0, 4), ("1g.24gb+me", 0x7, 1), ("1g.24gb+gfx", 0xA, 4),
              ("1g.24gb-me", 0xD, 4), ("1g.24gb+me.all", 0xF, 1), ("2g.48gb", 0x1, 2),
              ("2g.48gb+gfx", 0xB, 2), ("2g.48gb-me", 0xE, 2), ("2g.48gb+me.all", 0x10, 1),
              ("4g.96gb", 0x3, 1), ("4g.96gb+gfx", 0xC, 1)), _BOTH),
)
