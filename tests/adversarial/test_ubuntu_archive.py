"""The `ubuntu` source (UBUNTU_SOURCE=auto) given a hostile Ubuntu archive, in the arena.

The arena's node is the gke-ubuntu-t4 sample (ID=ubuntu, 22.04). The archive is
Ubuntu-shaped (tests/aptrepo.py: Packages.xz, InRelease clear-signed by the real gpg, checked
by the real gpgv), served over HTTP. Cases: the archive's signature vouches for a modules
package whose data climbs out of it (`../`: a compromised archive); a .deb swapped on the
way (another hash than the signed index says); an InRelease signed by a key the node does
not trust. Each is refused with exit 7 and one line naming the cause, and nothing is
written in the arena but the installer's own work area.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aptrepo import key, publish
from e2e import KERNEL
from httpserver import Fault, MirrorServer
from ubuntudebs import MODULE_DIR, POOL_MODULES, SERIES, ar_deb, modules_package_name, user_debs

from adversarial.harness import Arena, refused_untouched, settle

VERSION = "535.261.03"
PACKAGE = modules_package_name(KERNEL)
DEB_NAME = f"{PACKAGE}_5.15.0-1049.1_amd64.deb"
CONTROL = (f"Package: {PACKAGE}\nVersion: 5.15.0-1049.1\nArchitecture: amd64\n"
           "Maintainer: x <x@x>\nDescription: hostile\n")


@dataclass(frozen=True)
class Hostile:
    root: Path
    keyring: Path
    other: Path  # a keyring of another key


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    base = tmp_path_factory.mktemp("hostile-ubuntu")
    root = base / "mirror"
    pool = root / POOL_MODULES
    pool.mkdir(parents=True)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name in (f"./lib/modules/{KERNEL}/kernel/{MODULE_DIR}",):
            member = tarfile.TarInfo(name)
            member.type, member.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(member)
        escape = tarfile.TarInfo(f"./lib/modules/{KERNEL}/kernel/{MODULE_DIR}/"
                                 "../../../../../../../outside/etc/escape.ko")
        escape.size = 4
        tar.addfile(escape, io.BytesIO(b"\x7fELF"))
    (base / "data.tar.xz").write_bytes(data.getvalue())
    deb = ar_deb(base, PACKAGE, base / "data.tar.xz", CONTROL)
    listed = pool / DEB_NAME
    shutil.move(deb, listed)
    library, smi = base / "libcuda.so", base / "nvidia-smi"
    library.write_bytes(b"\x7fELF not a library")
    smi.write_bytes(b"\x7fELF not a binary")
    users = []
    for made in user_debs(base / "user", VERSION, {"libcuda.so": library}, smi, {}):
        users.append(root / "pool" / "restricted" / made.name)
        shutil.move(made, users[-1])
    gnupg = base / "gnupg"
    keyring = key(gnupg, "ubuntu-archive")
    publish(root, f"{SERIES}-updates", {"restricted": [(listed, ""),
                                                       *((d, "") for d in users)]}, gnupg)
    for suite in (SERIES, f"{SERIES}-security"):
        publish(root, suite, {"restricted": []}, gnupg)
    other = key(base / "other-gnupg", "other")
    yield Hostile(root, keyring, other)
    for home in (gnupg, base / "other-gnupg"):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                       check=False, capture_output=True)


def _install(arena: Arena, server: MirrorServer, keyring: Path, *causes: str) -> str:
    """`install` with the ubuntu source on: refused (exit 7, one line naming `causes`),
    nothing written but the work area; returns the line."""
    settle(arena)
    return refused_untouched(arena, lambda: arena.run("install", *arena.args(
        "--ubuntu-source", "auto", "--ubuntu-apt-mirror", server.url,
        "--ubuntu-keyring", str(keyring), "--driver-version", "535"), timeout=5), 7,
        *causes).lines[0]


def test_a_signed_archive_whose_modules_package_climbs_out(arena: Arena,
                                                           hostile: Hostile) -> None:
    with MirrorServer(hostile.root) as server:
        _install(arena, server, hostile.keyring, "Canonical's packages for 535.261.03",
                       DEB_NAME, "escape.ko")
    assert not (arena.outside / "etc" / "escape.ko").exists()


def test_a_deb_swapped_on_the_way(arena: Arena, hostile: Hostile) -> None:
    with MirrorServer(hostile.root) as server:
        server.fault(f"/{POOL_MODULES}/{DEB_NAME}",
                     Fault("serve", other=b"!<arch>\nnot the signed one", times=0))
        _install(arena, server, hostile.keyring, DEB_NAME,
                       "but the signed Packages index says")


def test_an_inrelease_by_a_key_the_node_does_not_trust(arena: Arena,
                                                       hostile: Hostile) -> None:
    with MirrorServer(hostile.root) as server:
        _install(arena, server, hostile.other,
                       f"/dists/{SERIES}/InRelease is not signed by a key of {hostile.other}",
                       "UBUNTU_KEYRING")
        assert not server.requests_for(f"/{POOL_MODULES}/{DEB_NAME}")
