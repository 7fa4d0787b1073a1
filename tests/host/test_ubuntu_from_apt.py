"""`package build --ubuntu-modules-from-apt` against an Ubuntu-shaped archive.

The archive (tests/ubuntudebs.py `restricted_archive`) is real in every part the product
reads: Canonical-layout .debs made by dpkg-deb (the modules signed by a throw-away key with
the real `openssl cms` as sign-file signs; NVIDIA's real 535 libcuda, libnvidia-ml and
nvidia-smi at Ubuntu's paths), Packages.xz per pocket, InRelease clear-signed by the real
gpg and checked by the real gpgv, served by tests/httpserver.py with injected faults.
"""

from __future__ import annotations

import lzma
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import artifacts
import pytest
from cosbucket import firmware_bytes
from e2e import KERNEL
from httpserver import Fault, MirrorServer
from signing_keys import KeyPair, make_key
from ubuntudebs import (
    OLD_VERSION,
    SERIES,
    UPDATES_INDEX,
    archive_keyring,
    modules_deb_path,
    modules_package_name,
    restricted_archive,
    signed_modules,
)

from installer.packages.manifest import parse_manifest

pytestmark = pytest.mark.timeout(300)
CLI = (sys.executable, "-m", "installer")
VERSION = "535.261.03"
MODULES_DEB = modules_deb_path(KERNEL)


@dataclass(frozen=True)
class Archive:
    root: Path
    keyring: Path
    canonical: KeyPair
    modules: dict[str, bytes]
    firmware: dict[str, bytes]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archive]:
    base = tmp_path_factory.mktemp("ubuntu-restricted")
    canonical = make_key(base, "canonical")
    modules = signed_modules(KERNEL, VERSION, canonical.key, canonical.cert, base)
    tree = artifacts.nvidia_tree(VERSION)
    libraries = {stem: tree / artifacts.LIB_DIR / f"{stem}.{VERSION}"
                 for stem in ("libcuda.so", "libnvidia-ml.so")}
    firmware = {"gsp_tu10x.bin": firmware_bytes(VERSION, "gsp_tu10x.bin")}
    gnupg = base / "gnupg"
    with archive_keyring(gnupg) as keyring:
        root = restricted_archive(base, KERNEL, VERSION, modules, libraries,
                                  tree / "usr/lib/nvidia/current/nvidia-smi", firmware, gnupg)
        yield Archive(root, keyring, canonical, modules, firmware)


def _build(url: str, archive: Archive, tmp_path: Path, *extra: str,
           suite: str = SERIES, kernel: str = KERNEL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "package", "build", "--ubuntu-modules-from-apt=535-server",
         f"--kernel-release={kernel}", f"--apt-mirror={url}",
         f"--apt-keyring={archive.keyring}", f"--apt-suite={suite}",
         f"--out-dir={tmp_path / 'out'}", *extra],
        capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)})


def _refused(done: subprocess.CompletedProcess[str], code: int, tmp_path: Path) -> str:
    assert done.returncode == code, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error("), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob("gni-*"))  # the downloads are cleaned up
    return errors[0]


def test_modules_and_user_mode_of_their_version_from_the_pockets(
        archive: Archive, tmp_path: Path) -> None:
    """jammy reads jammy-updates and jammy-security too; the modules come byte for byte and
    verified against Canonical's (stand-in) certificate; the user-mode packages are the
    modules' driver version, not the release pocket's older upload; a 503 is retried."""
    with MirrorServer(archive.root) as server:
        server.fault(MODULES_DEB, Fault("status", status=503))
        done = _build(server.url, archive, tmp_path, f"--sign-cert={archive.canonical.cert}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r.status for r in server.requests_for(MODULES_DEB)] == [503, 200]
        for pocket in ("", "-updates", "-security"):
            assert len(server.requests_for(f"/dists/{SERIES}{pocket}/InRelease")) == 1
    out = tmp_path / "out"
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    assert (manifest.driver_version, manifest.kernel_release, manifest.flavour) == (
        VERSION, KERNEL, "open")
    for name, data in archive.modules.items():
        assert (out / "modules" / name).read_bytes() == data
    assert {s.origin for s in manifest.signatures} == {"attached"}
    assert {s.subject for s in manifest.signatures} == {archive.canonical.subject}
    real = artifacts.nvidia_tree(VERSION) / artifacts.LIB_DIR / f"libcuda.so.{VERSION}"
    assert (out / "lib64" / f"libcuda.so.{VERSION}").read_bytes() == real.read_bytes()
    assert not list((out / "lib64").glob(f"*{OLD_VERSION}*"))
    assert (out / "bin" / "nvidia-smi").is_file()
    for name, data in archive.firmware.items():
        assert (out / "firmware" / "nvidia" / VERSION / name).read_bytes() == data
    assert not list(tmp_path.glob("gni-apt-headers-*"))


def test_user_mode_packages_of_another_version_are_refused(archive: Archive,
                                                           tmp_path: Path) -> None:
    with MirrorServer(archive.root) as server:
        line = _refused(_build(server.url, archive, tmp_path, suite=f"{SERIES}-security"),
                        5, tmp_path)
    assert (f"the archive has no libnvidia-compute-535-server of driver {VERSION}, the "
            f"version of {modules_package_name(KERNEL)} (it has {OLD_VERSION}-0ubuntu1)"
            in line), line


def test_no_modules_for_the_kernel(archive: Archive, tmp_path: Path) -> None:
    other = "5.15.0-9999-gke"
    with MirrorServer(archive.root) as server:
        line = _refused(_build(server.url, archive, tmp_path, kernel=other), 5, tmp_path)
    assert f"restricted has no {modules_package_name(other)}" in line, line
    assert "(it has" not in line, line


def test_a_branch_not_built_for_the_kernel_names_those_that_are(archive: Archive,
                                                                tmp_path: Path) -> None:
    with MirrorServer(archive.root) as server:
        done = subprocess.run([*CLI, "package", "build", "--ubuntu-modules-from-apt=570",
                               f"--kernel-release={KERNEL}", f"--apt-mirror={server.url}",
                               f"--apt-keyring={archive.keyring}", "--apt-suite=jammy",
                               f"--out-dir={tmp_path / 'out'}"], capture_output=True,
                              text=True, timeout=120, check=False,
                              env={**os.environ, "TMPDIR": str(tmp_path)})
        line = _refused(done, 5, tmp_path)
    assert f"has no linux-modules-nvidia-570-open-{KERNEL}" in line, line
    assert f"(it has 535-server-open-{KERNEL})" in line, line


def test_a_tampered_packages_index_is_refused(archive: Archive, tmp_path: Path) -> None:
    index = archive.root / UPDATES_INDEX.lstrip("/")
    other = lzma.compress(lzma.decompress(index.read_bytes()).replace(
        b"535.261.03-0ubuntu1", b"535.261.03-0ubuntu9"))
    with MirrorServer(archive.root) as server:
        server.fault(UPDATES_INDEX, Fault("serve", other=other, times=0))
        line = _refused(_build(server.url, archive, tmp_path), 7, tmp_path)
    assert f"{SERIES}-updates/restricted/binary-amd64/Packages.xz is" in line, line
    assert "but the signed Release says" in line, line


def test_a_driver_version_the_modules_are_not(archive: Archive, tmp_path: Path) -> None:
    with MirrorServer(archive.root) as server:
        line = _refused(_build(server.url, archive, tmp_path, "--driver-version=535.274.02"),
                        5, tmp_path)
    assert f"is driver {VERSION}, not the requested 535.274.02" in line, line


@pytest.mark.parametrize(("args", "cause"), [
    (("--ubuntu-modules-from-apt=535-beta", "--kernel-release=6.8.0-44-generic",
      "--apt-suite=noble"), "'535-beta' is not an Ubuntu driver branch"),
    (("--ubuntu-modules-from-apt=535", "--apt-suite=noble"), "needs --kernel-release"),
    (("--ubuntu-modules-from-apt=535", "--kernel-release=6.8.0-44-generic"),
     "needs --apt-suite"),
])
def test_flags_refused_before_any_request(args: tuple[str, ...], cause: str,
                                          tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "package", "build", *args, "--apt-mirror=http://127.0.0.1:9",
                           f"--out-dir={tmp_path / 'out'}"], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert cause in _refused(done, 2, tmp_path)
