"""`package build --kernel-headers-from-apt` against a local Debian-style archive.

The archive is real in every part that is checked: .debs packed by dpkg-deb (the headers
package's tree is an `nvsources.fake_kbuild`, so the build really compiles against it),
`Packages.xz` with their sizes and SHA256, a `Release` listing that index, clear-signed by
the real gpg with a throw-away key into `InRelease`, served by tests/httpserver.py on
127.0.0.1 and verified by the real gpgv. Then a bad signature, another key, a Packages
index and a .deb that differ from what was signed are each refused (exit 7).
"""

from __future__ import annotations

import lzma
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aptrepo import build_deb, key, refused, sign_release, stanza
from httpserver import MirrorServer
from nvsources import fake_kbuild, proprietary_source

from installer.packages.manifest import parse_manifest

CLI = (sys.executable, "-m", "installer")
RELEASE = "6.1.0-57-amd64"
VERSION = "6.1.192-3"
HEADERS = f"linux-headers-{RELEASE}"
COMMON = "linux-headers-6.1.0-57-common"
KBUILD = "linux-kbuild-6.1"
NVIDIA_DEB_VERSION = "535.261.03-1"


@dataclass(frozen=True)
class Archive:
    root: Path
    url: str
    keyring: Path
    gnupg: Path


@pytest.fixture(autouse=True)
def _no_agent_left(tmp_path: Path) -> Iterator[None]:
    """gpg starts an agent per home directory: end each with its test, so none outlives it."""
    yield
    for home in tmp_path.glob("*gnupg"):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                       check=False, capture_output=True)


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Archive]:
    root = tmp_path / "mirror"
    pool = root / "pool" / "main" / "l" / "linux"
    pool.mkdir(parents=True)
    depends = f"Depends: {COMMON} (= {VERSION}), {KBUILD} (= {VERSION}), gcc-12\n"
    headers_tree = tmp_path / "debs" / "headers"
    fake_kbuild(headers_tree / "usr" / "src" / HEADERS, RELEASE)
    common_tree = tmp_path / "debs" / "common" / "usr" / "src" / COMMON
    common_tree.mkdir(parents=True)
    (common_tree / "Kconfig").write_text("# the common tree\n")
    kbuild_tree = tmp_path / "debs" / "kbuild" / "usr" / "lib" / KBUILD
    kbuild_tree.mkdir(parents=True)
    (kbuild_tree / "README").write_text("kbuild tools\n")
    debs = [(build_deb(headers_tree, HEADERS, VERSION, pool, depends), depends),
            (build_deb(tmp_path / "debs" / "common", COMMON, VERSION, pool), ""),
            (build_deb(tmp_path / "debs" / "kbuild", KBUILD, VERSION, pool), "")]
    text = "\n".join(stanza(deb, root, dep) for deb, dep in debs)
    index = root / "dists" / "bookworm" / "main" / "binary-amd64"
    index.mkdir(parents=True)
    (index / "Packages.xz").write_bytes(lzma.compress(text.encode()))
    nonfree = root / "pool" / "non-free" / "n" / "nvidia-graphics-drivers"
    nonfree.mkdir(parents=True)
    source = proprietary_source(tmp_path / "nvsrc" / "nvidia-kernel-535.261.03")
    (tmp_path / "debs" / "nvidia" / "usr" / "src").mkdir(parents=True)
    subprocess.run(["tar", "-cJf", str(tmp_path / "debs" / "nvidia" / "usr" / "src" /
                                       "nvidia-kernel.tar.xz"),
                    "-C", str(source.parent), source.name], check=True)
    nvidia = build_deb(tmp_path / "debs" / "nvidia", "nvidia-kernel-source",
                       NVIDIA_DEB_VERSION, nonfree)
    (root / "dists" / "bookworm" / "non-free" / "binary-amd64").mkdir(parents=True)
    (root / "dists" / "bookworm" / "non-free" / "binary-amd64" / "Packages.xz").write_bytes(
        lzma.compress(stanza(nvidia, root).encode()))
    gnupg = tmp_path / "gnupg"
    keyring = key(gnupg, "archive")
    sign_release(root, "bookworm", gnupg, origin="Debian")
    with MirrorServer(root) as server:
        yield Archive(root, server.url, keyring, gnupg)


def _build(archive: Archive, tmp_path: Path, *extra: str
           ) -> subprocess.CompletedProcess[str]:
    source = proprietary_source(tmp_path / "src" / "kernel")
    return subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                           f"--kernel-headers-from-apt={HEADERS}",
                           f"--debian-mirror={archive.url}", f"--out-dir={tmp_path / 'out'}",
                           *extra], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path)})


def test_headers_by_name_are_verified_and_built_against(archive: Archive,
                                                         tmp_path: Path) -> None:
    done = _build(archive, tmp_path, f"--debian-keyring={archive.keyring}")
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == RELEASE
    assert manifest.provenance is not None
    fetched = {h["name"] for h in manifest.provenance["kernel_headers"]}
    assert fetched == {HEADERS, COMMON, KBUILD}  # the dependencies came along, gcc-12 not
    assert not list(tmp_path.glob("gni-apt-headers-*"))  # the downloads are cleaned up


def test_a_signature_by_another_key_is_refused(archive: Archive, tmp_path: Path) -> None:
    other = key(tmp_path / "other-gnupg", "other")
    line = refused(_build(archive, tmp_path, f"--debian-keyring={other}"))
    assert f"{archive.url}/dists/bookworm/InRelease is not signed by a key of {other}" in line
    assert not (tmp_path / "out").exists()


def test_a_changed_release_has_a_bad_signature(archive: Archive, tmp_path: Path) -> None:
    signed = archive.root / "dists" / "bookworm" / "InRelease"
    signed.write_bytes(signed.read_bytes().replace(b"Origin: Debian", b"Origin: Debiam"))
    line = refused(_build(archive, tmp_path, f"--debian-keyring={archive.keyring}"))
    assert "is not signed by a key of" in line and "BAD signature" in line


def test_a_packages_index_other_than_the_signed_one_is_refused(archive: Archive,
                                                              tmp_path: Path) -> None:
    index = archive.root / "dists" / "bookworm" / "main" / "binary-amd64" / "Packages.xz"
    index.write_bytes(lzma.compress(lzma.decompress(index.read_bytes()) + b"\n"))
    line = refused(_build(archive, tmp_path, f"--debian-keyring={archive.keyring}"))
    assert "main/binary-amd64/Packages.xz is" in line and "but the signed Release says" in line


def test_a_deb_other_than_the_indexed_one_is_refused(archive: Archive, tmp_path: Path) -> None:
    deb = next(archive.root.glob(f"pool/main/l/linux/{KBUILD}_*.deb"))
    deb.write_bytes(deb.read_bytes()[:-1] + b"\0")  # same size, other bytes
    line = refused(_build(archive, tmp_path, f"--debian-keyring={archive.keyring}"))
    assert f"{deb.name} is {deb.stat().st_size} bytes with sha256" in line
    assert "but the signed Packages index says" in line
    assert not (tmp_path / "out").exists()


def test_a_deb_shorter_than_the_indexed_one_is_named_by_its_size(
        archive: Archive, tmp_path: Path) -> None:
    """A cut file is not "more than" the signed size: the line says what arrived."""
    deb = next(archive.root.glob(f"pool/main/l/linux/{KBUILD}_*.deb"))
    size = deb.stat().st_size
    deb.write_bytes(deb.read_bytes()[:-100])
    line = refused(_build(archive, tmp_path, f"--debian-keyring={archive.keyring}"))
    assert f"{deb.name} is {size - 100} bytes with sha256" in line, line
    assert f"says {size} bytes" in line and "more than" not in line
    assert not (tmp_path / "out").exists()


def test_a_name_that_is_not_a_headers_package(archive: Archive, tmp_path: Path) -> None:
    source = proprietary_source(tmp_path / "src" / "kernel")
    line = refused(subprocess.run(
        [*CLI, "package", "build", f"--nvidia-source={source}", "--kernel-headers-from-apt=bash",
         f"--debian-mirror={archive.url}", f"--repo={tmp_path / 'r'}"],
        capture_output=True, text=True, timeout=120, check=False), 2)
    assert "'bash' is not a linux-headers-<release> package name" in line


def test_sources_by_name_too_so_nothing_is_staged(archive: Archive, tmp_path: Path) -> None:
    """A build farm pod's command: headers and NVIDIA's sources both from the archive."""
    done = subprocess.run(
        [*CLI, "package", "build", f"--nvidia-source-from-apt=nvidia-kernel-source="
         f"{NVIDIA_DEB_VERSION}", f"--kernel-headers-from-apt={HEADERS}",
         f"--debian-mirror={archive.url}", f"--debian-keyring={archive.keyring}",
         f"--repo={tmp_path / 'repo'}", "--shard=0/1"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest(
        (tmp_path / "repo" / RELEASE / "535.261.03" / "proprietary" / "manifest.json")
        .read_bytes())
    assert manifest.provenance is not None
    assert manifest.provenance["nvidia_source"]["name"] == "nvidia-kernel-source"


def test_a_source_version_the_archive_lacks(archive: Archive, tmp_path: Path) -> None:
    line = refused(subprocess.run(
        [*CLI, "package", "build", "--nvidia-source-from-apt=nvidia-kernel-source=550.1-1",
         f"--kernel-headers-from-apt={HEADERS}", f"--debian-mirror={archive.url}",
         f"--debian-keyring={archive.keyring}", f"--repo={tmp_path / 'repo'}"],
        capture_output=True, text=True, timeout=300, check=False), 2)
    assert f"the archive has no nvidia-kernel-source 550.1-1 (it has {NVIDIA_DEB_VERSION})" in line
