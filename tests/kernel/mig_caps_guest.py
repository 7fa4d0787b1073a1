"""Run inside the guest: MIG capability nodes made on the guest kernel's devtmpfs.

A /proc stand-in in a temp dir holds what the driver publishes (`/proc/devices` with
`nvidia-caps`, `/proc/driver/nvidia-caps/mig-minors`, the instances' `access` files); the
nodes are made on the real `/dev` through the seam, as the pipeline makes them (the
partition stage's plan, the load stage's recorded `ensure_nodes`), and the kernel's own
view of each node (stat) is written to $GNI_OUT/results.json. Run twice: the rerun keeps.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from installer.node.host import RealHost, Roots
from installer.stages.load import devnodes
from installer.stages.partition import caps

CAPS_MAJOR = 237
# GPU 0: seven 1g GIs (ids 7..13) with CI 0 each, as 7x1g.5gb leaves them
INSTANCES = {0: [7, 8, 9, 10, 11, 12, 13]}


def _proc(root: Path) -> dict[str, int]:
    lines, minor, table = ["config 1", "monitor 2"], 3, {}
    for gpu in range(2):
        for gi in range(15):
            for key in [f"gpu{gpu}/gi{gi}/access",
                        *(f"gpu{gpu}/gi{gi}/ci{ci}/access" for ci in range(8))]:
                lines.append(f"{key} {minor}")
                table[key] = minor
                minor += 1
    (root / "driver/nvidia-caps").mkdir(parents=True)
    (root / "driver/nvidia-caps/mig-minors").write_text("\n".join(lines) + "\n")
    (root / "devices").write_text(f"Character devices:\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n")
    base = root / "driver/nvidia/capabilities"
    (base / "mig").mkdir(parents=True)
    for name, minor in (("config", 1), ("monitor", 2)):
        (base / "mig" / name).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 256\n")
    for gpu, gis in INSTANCES.items():
        for gi in gis:
            for key in (f"gi{gi}", f"gi{gi}/ci0"):
                path = base / f"gpu{gpu}/mig/{key}/access"
                path.parent.mkdir(parents=True, exist_ok=True)
                number = table[f"gpu{gpu}/{key}/access"]
                path.write_text(f"DeviceFileMinor: {number}\nDeviceFileMode: 292\n")
    return table


def main(out: Path) -> None:
    proc = Path(tempfile.mkdtemp(prefix="mig-proc-"))
    table = _proc(proc)
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(
        Path("/proc/sys/kernel/random/boot_id").read_text())
    work = Path(tempfile.mkdtemp(prefix="mig-install-"))
    host = RealHost(Roots(Path("/"), proc, Path("/sys"), Path("/dev")))
    nodes = caps.plan(host)
    wanted = [devnodes.DeviceNode(n.name, n.major, n.minor, n.mode) for n in nodes]
    first = devnodes.ensure_nodes(host, wanted, record=work / ".devnodes.json")
    second = devnodes.ensure_nodes(host, wanted, record=work / ".devnodes.json")
    seen = {}
    for node in nodes:
        info = os.lstat(Path("/dev") / node.name)
        link = os.readlink(Path("/dev/char") / f"{node.major}:{node.minor}")
        seen[node.name] = {"char": stat.S_ISCHR(info.st_mode),
                           "major": os.major(info.st_rdev), "minor": os.minor(info.st_rdev),
                           "mode": stat.S_IMODE(info.st_mode), "link": link}
    result = {"expected": {k: v for k, v in table.items() if k.startswith("gpu0/")},
              "nodes": seen, "created": first.created, "kept_on_rerun": second.kept,
              "changed_on_rerun": second.changed,
              "record": json.loads((work / ".devnodes.json").read_text())}
    (out / "results.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
