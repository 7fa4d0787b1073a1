"""mig-parted config files for the MIG tests: a small one in the shapes of NVIDIA's own
config-default.yaml (`all-disabled`, `all-1g.10gb`, `all-balanced` with device filters for
H100 and A100-80GB), a per-device custom config, and one layout that cannot fit (8 compute
slices on an A100-40GB); and every config of NVIDIA's config-default.yaml as the suite's own
data (`DEFAULTS`, `default_configs()`), with one GPU per MIG model (`MODEL_GPUS`).
"""

MIG_PARTED = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - device-filter: ["0x233010DE", "0x20B210DE", "0x20B510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  all-balanced:
    - device-filter: ["0x20B210DE", "0x20B510DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
    - device-filter: "0x233010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
  custom:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - devices: [2]
      mig-enabled: false
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.20gb": 2
        "2g.10gb": 1
"""

# NVIDIA's default configs, as the suite's own data: every config of NVIDIA/mig-parted's
# deployments/systemd/config-default.yaml at bd7160f4 (2026-08-21), in file order, written
# here one line each as "<name> | <entry> ; <entry> ...", an entry being "<filter>
# <size>:<count> ..." with the filter's device ids (vendor 0x10DE) or `*` for none, `off`
# for mig-enabled false and `{}` for MIG on with no instances. `default_configs()` renders
# them in mig-parted's format.
DEFAULTS = """\
all-disabled | * off
all-enabled | * {}
all-1g.5gb | * 1g.5gb:7
all-1g.5gb.me | * 1g.5gb+me:1
all-2g.10gb | * 2g.10gb:3
all-3g.20gb | * 3g.20gb:2
all-4g.20gb | * 4g.20gb:1
all-7g.40gb | * 7g.40gb:1
all-1g.24gb.gfx | * 1g.24gb+gfx:4
all-1g.24gb.me.all | * 1g.24gb+me.all:1
all-1g.24gb-me | * 1g.24gb-me:4
all-2g.48gb | * 2g.48gb:2
all-2g.48gb.gfx | * 2g.48gb+gfx:2
all-2g.48gb.me.all | * 2g.48gb+me.all:1
all-2g.48gb-me | * 2g.48gb-me:2
all-4g.96gb | * 4g.96gb:1
all-4g.96gb.gfx | * 4g.96gb+gfx:1
all-1g.10gb | 2330,2331,2322,20B2,20B5,20F3,20F5,2324 1g.10gb:7 ; 20B0,20B1,20F1,20F6 1g.10gb:4
all-1g.10gb.me | * 1g.10gb+me:1
all-1g.20gb | * 1g.20gb:4
all-2g.20gb | * 2g.20gb:3
all-3g.40gb | * 3g.40gb:2
all-4g.40gb | * 4g.40gb:1
all-7g.80gb | * 7g.80gb:1
all-1g.6gb | * 1g.6gb:4
all-1g.6gb.me | * 1g.6gb+me:1
all-2g.12gb | * 2g.12gb:2
all-2g.12gb.me | * 2g.12gb+me:1
all-4g.24gb | * 4g.24gb:1
all-1g.12gb | * 1g.12gb:7
all-1g.12gb.me | * 1g.12gb+me:1
all-1g.24gb | * 1g.24gb:4
all-2g.24gb | * 2g.24gb:3
all-1g.24gb.me | * 1g.24gb+me:1
all-1g.47gb | * 1g.47gb:4
all-2g.47gb | * 2g.47gb:3
all-3g.93gb | * 3g.93gb:2
all-4g.93gb | * 4g.93gb:1
all-7g.186gb | * 7g.186gb:1
all-3g.47gb | * 3g.47gb:2
all-4g.47gb | * 4g.47gb:1
all-7g.94gb | * 7g.94gb:1
all-3g.48gb | * 3g.48gb:2
all-4g.48gb | * 4g.48gb:1
all-7g.96gb | * 7g.96gb:1
all-balanced | 2941 1g.23gb:2 2g.47gb:1 3g.93gb:1 ; 31C2 1g.35gb:2 2g.70gb:1 3g.139gb:1 ; \
2BB5 1g.24gb:2 2g.48gb:1 ; 2901 1g.23gb:2 2g.45gb:1 3g.90gb:1 ; \
3182 1g.34gb:2 2g.67gb:1 3g.135gb:1 ; 2348 1g.18gb:2 2g.36gb:1 3g.72gb:1 ; \
2335,233B 1g.18gb:2 2g.35gb:1 3g.71gb:1 ; 2321,233A 1g.12gb:2 2g.24gb:1 3g.47gb:1 ; \
2330,2331,2322,20B2,20B5,20F3,20F5,2324 1g.10gb:2 2g.20gb:1 3g.40gb:1 ; \
20B0,20B1,20F1,20F6 1g.5gb:2 2g.10gb:1 3g.20gb:1 ; 20B7 1g.6gb:2 2g.12gb:1 ; \
2342,233D,20B6,2329 1g.12gb:2 2g.24gb:1 3g.48gb:1
all-1g.18gb | * 1g.18gb:7
all-1g.18gb.me | * 1g.18gb+me:1
all-1g.23gb | * 1g.23gb:7
all-1g.23gb.me | * 1g.23gb+me:1
all-1g.35gb | 2335 1g.35gb:4 ; 31C2 1g.35gb:7
all-2g.35gb | * 2g.35gb:3
all-3g.71gb | * 3g.71gb:2
all-4g.71gb | * 4g.71gb:1
all-7g.141gb | * 7g.141gb:1
all-1g.34gb | * 1g.34gb:7
all-1g.34gb.me | * 1g.34gb+me:1
all-1g.35gb.me | * 1g.35gb+me:1
all-1g.36gb | * 1g.36gb:4
all-1g.45gb | * 1g.45gb:4
all-1g.67gb | * 1g.67gb:4
all-1g.70gb | * 1g.70gb:4
all-2g.36gb | * 2g.36gb:3
all-2g.45gb | * 2g.45gb:3
all-2g.67gb | * 2g.67gb:3
all-2g.70gb | * 2g.70gb:3
all-3g.72gb | * 3g.72gb:2
all-3g.90gb | * 3g.90gb:2
all-3g.95gb | * 3g.95gb:2
all-3g.135gb | * 3g.135gb:2
all-3g.139gb | * 3g.139gb:2
all-4g.72gb | * 4g.72gb:1
all-4g.90gb | * 4g.90gb:1
all-4g.95gb | * 4g.95gb:1
all-4g.135gb | * 4g.135gb:1
all-4g.139gb | * 4g.139gb:1
all-7g.144gb | * 7g.144gb:1
all-7g.180gb | * 7g.180gb:1
all-7g.189gb | * 7g.189gb:1
all-7g.269gb | * 7g.269gb:1
all-7g.278gb | * 7g.278gb:1
"""

# One GPU per MIG model: (NVML name, memory MiB NVML reports, PCI device id of mig-parted's
# filters for it). GH200 144G, B300 and GB300: figures whose whole GiB is the 7g size's GB,
# as go-nvlib's naming of NVML's answer needs of a real board (not read off one); the A30's
# and RTX PRO 6000's are nominal too (not checked against a board here).
MODEL_GPUS = {
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40536, "20B0"),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920, "20B2"),
    "A30-24GB": ("NVIDIA A30", 24169, "20B7"),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 81559, "2330"),
    "H100-94GB": ("NVIDIA H100 NVL", 95830, "2321"),
    "GH200-96GB": ("NVIDIA GH200 480GB", 97871, "2342"),
    "GH200-144GB": ("NVIDIA GH200 144G HBM3e", 147000, "2348"),
    "H200-141GB": ("NVIDIA H200", 143771, "2335"),
    "B200": ("NVIDIA B200", 183359, "2901"),
    "GB200": ("NVIDIA GB200", 189471, "2941"),
    "B300": ("NVIDIA B300 SXM6 AC", 275040, "3182"),
    "GB300": ("NVIDIA GB300", 284000, "31C2"),
    "RTX-PRO-6000": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "2BB5"),
}

Entry = tuple[tuple[str, ...], dict[str, int] | None]  # (PCI ids, sizes; None: MIG off)


def default_entries() -> dict[str, list[Entry]]:
    """DEFAULTS as data: config name -> its entries, PCI ids as `0xDDDD10DE`."""
    configs: dict[str, list[Entry]] = {}
    for line in DEFAULTS.splitlines():
        name, _, body = line.partition(" | ")
        entries: list[Entry] = []
        for entry in body.split(" ; "):
            where, *sizes = entry.split()
            ids = () if where == "*" else tuple(f"0x{d}10DE" for d in where.split(","))
            counts = None if sizes == ["off"] else {} if sizes == ["{}"] else {
                size: int(count) for size, count in (s.split(":") for s in sizes)}
            entries.append((ids, counts))
        configs[name] = entries
    return configs


def default_configs() -> str:
    """DEFAULTS in mig-parted's `version: v1` format."""
    lines = ["version: v1", "mig-configs:"]
    for name, entries in default_entries().items():
        lines.append(f"  {name}:")
        for ids, counts in entries:
            lines.append("    - devices: all")
            if ids:
                lines.append(f"      device-filter: [{', '.join(repr(i) for i in ids)}]")
            lines.append(f"      mig-enabled: {'false' if counts is None else 'true'}")
            if counts is not None:
                shown = ", ".join(f'"{size}": {count}' for size, count in counts.items())
                lines.append(f"      mig-devices: {{{shown}}}")
    return "\n".join(lines) + "\n"


def layouts(text: str) -> list[dict[str, int]]:
    """`1g.5gb:7 1g.5gb:2,2g.10gb:1` as layouts: spaces between them, commas within one."""
    return [{size: int(count) for size, count in (item.split(":") for item in layout.split(","))}
            for layout in text.split()]


# GKE: GoogleCloudPlatform/container-engine-accelerators partition_gpu/partition_gpu.go
# @ 992db812, `partitionSizeMaxCount` by the model its comments name: what one GPU holds.
_GKE_SEVEN = "1g.{0}gb:7 1g.{1}gb:4 2g.{1}gb:3 3g.{2}gb:2 4g.{2}gb:1 7g.{3}gb:1"
GKE = {
    "A100-40GB": layouts("1g.5gb:7 2g.10gb:3 3g.20gb:2 4g.20gb:1 7g.40gb:1"),
    "A100-80GB": layouts("1g.10gb:7 2g.20gb:3 3g.40gb:2 4g.40gb:1 7g.80gb:1"),
    "H100-80GB": layouts(_GKE_SEVEN.format(10, 20, 40, 80)),
    "H200-141GB": layouts(_GKE_SEVEN.format(18, 35, 71, 141)),
    "B200": layouts(_GKE_SEVEN.format(23, 45, 90, 180)),
    "GB200": layouts(_GKE_SEVEN.format(23, 47, 93, 186)),
    "RTX-PRO-6000": layouts("1g.24gb:4 1g.24gb+me:1 1g.24gb+gfx:4 1g.24gb+me.all:1 "
                             "1g.24gb-me:4 2g.48gb:2 2g.48gb+gfx:2 2g.48gb+me.all:1 "
                             "2g.48gb-me:2 4g.96gb:1 4g.96gb+gfx:1"),
}
