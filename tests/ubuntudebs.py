"""Ubuntu's NVIDIA packages in their published layout, made here by the real dpkg-deb.

Canonical's linux-restricted-modules packages put each module of kernel K at
`/lib/modules/K/kernel/nvidia-<branch>[srv][-open]/<module>.ko` (packages.ubuntu.com's
file list of linux-objects-nvidia-580-server-open-6.8.0-1036-nvidia and its siblings; see
docs/building-packages.md "Ubuntu: Canonical's signed modules"); the proprietary flavour's
unlinked objects and Canonical's detached signatures sit in that directory's `bits/`
(`BUILD`, `*.o`, `<module>.ko.sig`: the file lists of linux-objects-nvidia-535-server-
6.11.0-8-generic and linux-signatures-nvidia-5.15.0-1055-aws). The modules here are ELF
objects whose `.modinfo` says what NVIDIA's open modules say (tests/cosbucket.py), signed
as the kernel's sign-file signs (the real `openssl cms`) by a throw-away key standing in for
Canonical's. The user-mode packages (libnvidia-compute-<branch>-server, nvidia-utils-
<branch>-server, nvidia-firmware-<branch>-server-<version>) hold the given files at Ubuntu's
paths. Packed with `-Zzstd`, as Ubuntu packs its own.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from cosbucket import MODULES, OPEN_LICENCE, module_bytes, sign_module
from nvsources import make_deb

BRANCH = "535"
MODULE_DIR = f"nvidia-{BRANCH}srv-open"
PEERMEM = ("nvidia-peermem", "nvidia,ib_core")


def modules_package_name(kernel: str, *, branch: str = BRANCH) -> str:
    return f"linux-modules-nvidia-{branch}-server-open-{kernel}"


def signed_modules(kernel: str, version: str, key: Path, cert: Path, work: Path, *,
                   vermagic: Mapping[str, str] | None = None,
                   stems: tuple[str, ...] = (*MODULES, PEERMEM[0])) -> dict[str, bytes]:
    """`<stem>.ko` -> the signed module; `vermagic` gives some stems another kernel."""
    depends = {**MODULES, PEERMEM[0]: PEERMEM[1]}
    out = {}
    for stem in stems:
        body = module_bytes(stem, version=version, depends=depends[stem],
                            kernel_release=(vermagic or {}).get(stem, kernel),
                            licence=OPEN_LICENCE)
        out[f"{stem}.ko"] = sign_module(body, key, cert, work / "sign")
    return out


def modules_deb(dest: Path, kernel: str, modules: Mapping[str, bytes], *,
                package: str | None = None, module_dir: str = MODULE_DIR,
                directory_kernel: str | None = None) -> Path:
    """linux-modules-nvidia-<branch>-server-open-<kernel>: the modules at Canonical's path."""
    name = package or modules_package_name(kernel)
    root = dest / f"root-{name}"
    shutil.rmtree(root, ignore_errors=True)
    target = root / "lib" / "modules" / (directory_kernel or kernel) / "kernel" / module_dir
    target.mkdir(parents=True)
    for file_name, data in modules.items():
        (target / file_name).write_bytes(data)
    doc = root / "usr" / "share" / "doc" / name
    doc.mkdir(parents=True)
    (doc / "copyright").write_text("test copyright\n")
    return make_deb(root, name, f"{kernel.split('-')[0]}-{kernel.split('-')[1]}.1", dest,
                    compression="zstd")


def objects_deb(dest: Path, kernel: str, *, branch: str = BRANCH) -> Path:
    """linux-objects-nvidia-<branch>-server-<kernel> of the proprietary flavour: objects and
    the link script in `bits/`, no module (linked on the node)."""
    name = f"linux-objects-nvidia-{branch}-server-{kernel}"
    root = dest / f"root-{name}"
    bits = root / "lib" / "modules" / kernel / "kernel" / f"nvidia-{branch}srv" / "bits"
    (bits / "nvidia").mkdir(parents=True)
    (bits / "BUILD").write_text("#!/bin/sh\n# links the objects (not run by the product)\n")
    (bits / "nvidia" / "nv-kernel.o_binary").write_bytes(b"\x7fELF" + b"\0" * 60)
    (bits / "nvidia.mod.o").write_bytes(b"\x7fELF" + b"\0" * 60)
    return make_deb(root, name, "1.0", dest, compression="zstd")


def user_debs(dest: Path, version: str, libraries: Mapping[str, Path],
              smi: Path | None, firmware: Mapping[str, bytes]) -> list[Path]:
    """libnvidia-compute, nvidia-utils (when `smi`) and nvidia-firmware at Ubuntu's paths;
    `libraries` maps a soname stem (libcuda.so) to the library file."""
    debs = []
    lib_root = dest / "root-libnvidia-compute"
    lib_dir = lib_root / "usr" / "lib" / "x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    for stem, source in libraries.items():
        shutil.copy(source, lib_dir / f"{stem}.{version}")
        (lib_dir / f"{stem}.1").symlink_to(f"{stem}.{version}")
    debs.append(make_deb(lib_root, f"libnvidia-compute-{BRANCH}-server",
                         f"{version}-0ubuntu1", dest, compression="zstd"))
    if smi is not None:
        utils = dest / "root-nvidia-utils"
        (utils / "usr" / "bin").mkdir(parents=True)
        shutil.copy(smi, utils / "usr" / "bin" / "nvidia-smi")
        (utils / "usr" / "bin" / "nvidia-smi").chmod(0o755)
        debs.append(make_deb(utils, f"nvidia-utils-{BRANCH}-server", f"{version}-0ubuntu1",
                             dest, compression="zstd"))
    fw_root = dest / "root-nvidia-firmware"
    fw_dir = fw_root / "lib" / "firmware" / "nvidia" / version
    fw_dir.mkdir(parents=True)
    for name, data in firmware.items():
        (fw_dir / name).write_bytes(data)
    debs.append(make_deb(fw_root, f"nvidia-firmware-{BRANCH}-server-{version}",
                         f"{version}-0ubuntu1", dest, compression="zstd"))
    return debs


def ar_deb(dest: Path, name: str, data_tar: Path, control: str) -> Path:
    """A .deb assembled by hand with binutils' `ar` (debian-binary, control.tar.xz, the given
    data.tar.xz): for members dpkg-deb would never write."""
    work = dest / f"ar-{name}"
    work.mkdir(parents=True)
    (work / "debian-binary").write_text("2.0\n")
    (work / "control").write_text(control)
    subprocess.run(["tar", "-C", str(work), "-cJf", str(work / "control.tar.xz"), "./control"],
                   check=True)
    shutil.copy(data_tar, work / "data.tar.xz")
    target = dest / f"{name}.deb"
    subprocess.run(["ar", "rc", str(target), "debian-binary", "control.tar.xz",
                    "data.tar.xz"], cwd=work, check=True)
    return target


SERIES = "jammy"
POOL_MODULES = "pool/restricted/l/linux-restricted-modules"
POOL_USER = f"pool/restricted/n/nvidia-graphics-drivers-{BRANCH}-server"
OLD_VERSION = "535.247.01"  # an older upload of the user-mode packages
UPDATES_INDEX = f"/dists/{SERIES}-updates/restricted/binary-amd64/Packages.xz"


def modules_deb_path(kernel: str) -> str:
    """Where `restricted_archive` serves the modules package of `kernel` (its URL path)."""
    upload = "-".join(kernel.split("-")[:2])
    return f"/{POOL_MODULES}/{modules_package_name(kernel)}_{upload}.1_amd64.deb"


@contextmanager
def archive_keyring(gnupg: Path) -> Iterator[Path]:
    """A signing key for `restricted_archive` in `gnupg`; yields its public keyring (what
    apt's gpgv reads). The gpg-agent that signing starts is ended after."""
    from aptrepo import key

    try:
        yield key(gnupg, "ubuntu-archive")
    finally:
        subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"],
                       check=False, capture_output=True)


def restricted_archive(base: Path, kernel: str, version: str, modules: Mapping[str, bytes],
                       libraries: Mapping[str, Path], smi: Path | None,
                       firmware: Mapping[str, bytes], gnupg: Path, *,
                       user_version: str | None = None) -> Path:
    """An Ubuntu-shaped archive (tests/aptrepo.py: Packages.xz, InRelease signed by the key
    in `gnupg`) serving Canonical's packages from its `restricted` component:

    - `jammy-updates`: linux-modules-nvidia-535-server-open-<kernel> (`modules`) and the
      user-mode packages of `user_version` (default `version`: libnvidia-compute,
      nvidia-utils, nvidia-firmware);
    - `jammy`: the user-mode packages of the older OLD_VERSION (never to be taken with
      modules of `version`);
    - `jammy-security`: the same modules package, and only OLD_VERSION's user-mode packages
      (a mirror caught between syncs).
    Returns the archive's root."""
    root = base / "mirror"
    pool_modules, pool_user = root / POOL_MODULES, root / POOL_USER
    pool_modules.mkdir(parents=True)
    pool_user.mkdir(parents=True)
    modules_file = modules_deb(pool_modules, kernel, modules)
    shutil.rmtree(pool_modules / f"root-{modules_package_name(kernel)}")
    uploads = {}
    newest = user_version or version
    for upload in (newest, OLD_VERSION):
        work = base / f"user-{upload}"
        debs = []
        for deb in user_debs(work, upload, libraries, smi, firmware):
            debs.append(pool_user / deb.name)
            shutil.move(deb, debs[-1])
        shutil.rmtree(work)
        uploads[upload] = debs
    from aptrepo import publish

    listed = [(modules_file, "")]
    publish(root, f"{SERIES}-updates", {"main": [], "restricted": [
        *listed, *((d, "") for d in uploads[newest])]}, gnupg)
    publish(root, SERIES, {"main": [], "restricted": [(d, "") for d in uploads[OLD_VERSION]]},
            gnupg)
    publish(root, f"{SERIES}-security", {"restricted": [
        *listed, *((d, "") for d in uploads[OLD_VERSION])]}, gnupg)
    return root
