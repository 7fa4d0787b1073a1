"""A mig-parted config file for the MIG tests: the shapes of NVIDIA's own config-default.yaml
(`all-disabled`, `all-1g.10gb`, `all-balanced` with device filters for H100 and A100-80GB),
a per-device custom config, and one layout that cannot fit (8 compute slices on an A100-40GB).
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
