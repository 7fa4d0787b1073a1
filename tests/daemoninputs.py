"""NVIDIA-shaped daemon inputs for `package build --fabricmanager/--nvlsm/--persistenced`.

NVIDIA's Fabric Manager and NVLSM archives are not in Debian's archive, so these are built
here in NVIDIA's published layout (`fabricmanager-linux-x86_64-<version>-archive/` with
`bin/nv-fabricmanager`, `etc/fabricmanager.cfg`, `share/nvidia/nvswitch/*_topology`, ...;
`nvlsm-linux-x86_64-<version>-archive/` with `sbin/nvlsm`, `lib/libgrpc_mgr.so`,
`share/nvidia/nvlsm/*.conf`), their executables real x86_64 ELF files compiled with gcc
(never run by the builder). Debian's real `nvidia-persistenced` comes from tests/artifacts.py.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from nvsources import make_deb

FM_CONFIG = "LOG_LEVEL=4\nTOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch\nFABRIC_MODE=0\n"
TOPOLOGIES = ("dgxa100_hgxa100_topology", "dgxh100_hgxh100_topology")
NVLSM_CONFIGS = ("nvlsm.conf", "grpc_mgr.conf", "device_configuration.conf")


def elf(path: Path, *, banner: str = "", shared: bool = False) -> Path:
    """An x86_64 ELF executable (or shared library) carrying `banner` as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_name(path.name + ".c")
    source.write_text(f'const char banner[] __attribute__((used)) = "{banner}";\n'
                      + ("" if shared else "int main(void) { return 0; }\n"))
    subprocess.run(["gcc", *(["-shared", "-fPIC"] if shared else []), "-o", str(path),
                    str(source)], check=True)
    source.unlink()
    return path


def _pack(staging: Path, out: Path) -> Path:
    with tarfile.open(out, "w:xz") as archive:
        archive.add(staging, arcname=staging.name)
    return out


def fm_archive(dest: Path, version: str, *, platform: str = "x86_64",
               file_name: str | None = None) -> Path:
    """NVIDIA's fabricmanager-linux-<platform>-<version>-archive.tar.xz, in its layout."""
    top = dest / f"fabricmanager-linux-{platform}-{version}-archive"
    elf(top / "bin" / "nv-fabricmanager", banner=f"Fabric Manager version is : {version}")
    elf(top / "bin" / "nvswitch-audit")
    (top / "etc").mkdir()
    (top / "etc" / "fabricmanager.cfg").write_text(FM_CONFIG)
    elf(top / "lib" / "libnvfm.so.1", shared=True)
    (top / "lib" / "libnvfm.so").symlink_to("libnvfm.so.1")
    (top / "include").mkdir()
    (top / "include" / "nv_fm_agent.h").write_text("/* header */\n")
    topology = top / "share" / "nvidia" / "nvswitch"
    topology.mkdir(parents=True)
    for number, name in enumerate(TOPOLOGIES):
        (topology / name).write_bytes(bytes([number]) * 512)
    (top / "systemd").mkdir()
    (top / "systemd" / "nvidia-fabricmanager.service").write_text("[Service]\n")
    (top / "LICENSE").write_text("license\n")
    return _pack(top, dest / (file_name or f"{top.name}.tar.xz"))


def nvlsm_archive(dest: Path, version: str) -> Path:
    """NVIDIA's nvlsm-linux-x86_64-<version>-archive.tar.xz, in its layout."""
    top = dest / f"nvlsm-linux-x86_64-{version}-archive"
    elf(top / "sbin" / "nvlsm", banner=f"nvlsm {version}")
    elf(top / "lib" / "libgrpc_mgr.so", shared=True)
    share = top / "share" / "nvidia" / "nvlsm"
    share.mkdir(parents=True)
    for name in NVLSM_CONFIGS:
        (share / name).write_text(f"# {name}\n")
    (top / "LICENSE").write_text("license\n")
    return _pack(top, dest / f"{top.name}.tar.xz")


def fm_deb(dest: Path, version: str, *, branch: str = "535") -> Path:
    """NVIDIA's nvidia-fabricmanager-<branch> .deb layout, packed by the real dpkg-deb."""
    root = dest / f"fm-deb-{version}"
    elf(root / "usr" / "bin" / "nv-fabricmanager", banner=f"version is : {version}")
    share = root / "usr" / "share" / "nvidia" / "nvswitch"
    share.mkdir(parents=True)
    (share / "fabricmanager.cfg").write_text(FM_CONFIG)
    for name in TOPOLOGIES:
        (share / name).write_bytes(b"\x01" * 256)
    (root / "lib" / "systemd" / "system").mkdir(parents=True)
    (root / "lib" / "systemd" / "system" / "nvidia-fabricmanager.service").write_text("x\n")
    return make_deb(root, f"nvidia-fabricmanager-{branch}", f"{version}-1", dest)


# NVIDIA's IMEX guide (docs.nvidia.com/multi-node-nvlink-systems/imex-guide: "Getting Started"
# and "IMEX Service Config Options"): the package installs the service `nvidia-imex` (a
# systemd unit of that name) and the query tool `nvidia-imex-ctl`; the service reads
# /etc/nvidia-imex/config.cfg, whose IMEX_NODE_CONFIG_FILE defaults to
# /etc/nvidia-imex/nodes_config.cfg and DAEMONIZE to 1; SERVER_PORT=50000.
IMEX_CONFIG = ("DAEMONIZE=1\nBIND_INTERFACE_IP=\nSERVER_PORT=50000\n"
               "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n")


def imex_deb(dest: Path, version: str, *, branch: str = "570") -> Path:
    """NVIDIA's nvidia-imex .deb in the layout its guide describes, packed by dpkg-deb."""
    root = dest / f"imex-deb-{version}"
    elf(root / "usr" / "bin" / "nvidia-imex", banner=f"IMEX version is: {version}")
    elf(root / "usr" / "bin" / "nvidia-imex-ctl", banner=f"IMEX version is: {version}")
    etc = root / "etc" / "nvidia-imex"
    etc.mkdir(parents=True)
    (etc / "config.cfg").write_text(IMEX_CONFIG)
    (etc / "nodes_config.cfg").write_text("")  # the site's IMEX domain: its own file
    (root / "lib" / "systemd" / "system").mkdir(parents=True)
    (root / "lib" / "systemd" / "system" / "nvidia-imex.service").write_text("x\n")
    return make_deb(root, f"nvidia-imex-{branch}", f"{version}-1", dest)
