"""Runs inside the guest: a package built by `package build --gdrcopy` loaded on the real kernel.

The package holds the stand-in NVIDIA modules and the gdrdrv-shaped fixture
(tests/gdrsources.py), compiled by the product for this kernel. The load stage loads the
driver, then gdrdrv as an optional module, and makes /dev/gdrdrv from the major the kernel
put in /proc/devices. Results: $OUT/results.json.
Usage: python tests/kernel/gdrdrv_guest.py PACKAGE_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from installer.node import kmod
from installer.node.host import RealHost, Roots
from installer.packages.tree import read_tree
from installer.stages import load

HOST = RealHost(Roots(Path("/"), Path("/proc"), Path("/sys"), Path("/dev")))


def main(package_dir: Path, out: Path) -> None:
    result = load.load_package(HOST, read_tree(package_dir))
    node = Path("/dev/gdrdrv")
    info = node.stat() if node.exists() else None
    opened = False
    if info is not None:
        fd = os.open(node, os.O_RDWR)  # minor 0: gdrdrv's open() accepts it
        os.close(fd)
        opened = True
    results: dict[str, Any] = {
        "loaded": result.loaded, "warnings": result.warnings,
        "optional": [v.to_dict() for v in result.optional],
        "majors": kmod.char_majors(HOST),
        "node": None if info is None else {
            "char": stat.S_ISCHR(info.st_mode), "major": os.major(info.st_rdev),
            "minor": os.minor(info.st_rdev), "mode": stat.S_IMODE(info.st_mode)},
        "opened": opened,
        "nvidia_holders": sorted(p.name for p in Path("/sys/module/nvidia/holders").iterdir()),
        "gdrdrv_version": (Path("/sys/module/gdrdrv/version").read_text().strip()
                           if Path("/sys/module/gdrdrv/version").exists() else None)}
    (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
