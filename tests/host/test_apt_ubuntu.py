"""`package build --kernel-headers-from-apt` against an Ubuntu-shaped archive.

The archive is real in every part the product reads: a flavour's headers package
(`linux-headers-6.1.0-57-gcp`) and the common package it depends on
(`linux-gcp-headers-6.1.0-57`, unversioned, as Ubuntu's flavour-control.stub writes it),
made from the real headers of Debian's 6.1.0-57-amd64 laid out the way Ubuntu's kernel
packaging lays them out (tests/aptrepo.py `ubuntu_headers` cites the sources), packed by
dpkg-deb (`-Z` of the `deb_compression` fixture); three pockets (jammy, jammy-updates
with the higher version, jammy-security), each with `Packages.xz` and an `InRelease`
clear-signed by a throw-away key; served by tests/httpserver.py with injected faults and
verified by the real gpgv. The build compiles the stand-in modules against the unpacked
tree with the kernel's own gcc-12.
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
from aptrepo import build_deb, key, publish, refused
from httpserver import Fault, MirrorServer
from nvsources import mini_source

from installer.node import kmod
from installer.packages.manifest import parse_manifest

pytestmark = pytest.mark.timeout(900)
CLI = (sys.executable, "-m", "installer")
DEBIAN_RELEASE = "6.1.0-57-amd64"
RELEASE = "6.1.0-57-gcp"
FLAVOUR = f"linux-headers-{RELEASE}"
COMMON = "linux-gcp-headers-6.1.0-57"
NEW, OLD = "6.1.0-57.10", "6.1.0-57.9"  # dpkg: .10 > .9 (as strings: .10 < .9)
POCKETS = ("jammy-updates", "jammy", "jammy-security")  # the newest listed first
FLAVOUR_DEPENDS = f"Depends: {COMMON}, libc6 (>= 2.34), libelf1 (>= 0.142)\n"


@dataclass(frozen=True)
class Archive:
    root: Path
    keyring: Path
    gnupg: Path


@pytest.fixture(scope="module")
def deb_compression() -> str:
    """dpkg-deb's -Z for the archive's .debs: zstd, as Ubuntu's own."""
    return "zstd"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory, deb_compression: str
            ) -> Iterator[Archive]:
    from aptrepo import ubuntu_headers
    from kernel.assets import release_headers_debs

    tmp = tmp_path_factory.mktemp("ubuntu")
    debian = tmp / "debian"
    for deb in release_headers_debs(DEBIAN_RELEASE):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(debian)], check=True)
    flavour_tree, common_tree = ubuntu_headers(debian, DEBIAN_RELEASE, RELEASE, COMMON,
                                               tmp / "trees")
    root = tmp / "mirror"
    pool = root / "pool" / "main" / "l" / "linux-gcp"
    new_flavour = build_deb(flavour_tree, FLAVOUR, NEW, pool, FLAVOUR_DEPENDS,
                            compression=deb_compression)
    new_common = build_deb(common_tree, COMMON, NEW, pool, compression=deb_compression,
                           arch="all")
    stale = []  # the release pocket's older upload: building against it cannot work
    for name, arch in ((FLAVOUR, "amd64"), (COMMON, "all")):
        tree = tmp / "stale" / name / "usr" / "share" / "doc" / name
        tree.mkdir(parents=True)
        (tree / "README").write_text("superseded by -updates\n")
        stale.append(build_deb(tmp / "stale" / name, name, OLD, pool,
                               FLAVOUR_DEPENDS if name == FLAVOUR else "",
                               compression=deb_compression, arch=arch))
    gnupg = tmp / "gnupg"
    keyring = key(gnupg, "ubuntu-archive")
    # -updates lists the newest first and the release's upload after it: not "the last"
    publish(root, "jammy-updates", {"main": [(new_flavour, FLAVOUR_DEPENDS), (new_common, ""),
                                             (stale[0], FLAVOUR_DEPENDS)]}, gnupg)
    publish(root, "jammy", {"main": [(stale[0], FLAVOUR_DEPENDS), (stale[1], "")],
                            "restricted": []}, gnupg)
    publish(root, "jammy-security", {"main": []}, gnupg)
    yield Archive(root, keyring, gnupg)
    subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"],
                   check=False, capture_output=True)


def _build(url: str, archive: Archive, tmp_path: Path, *extra: str,
           keyring: Path | None = None) -> subprocess.CompletedProcess[str]:
    source = mini_source(tmp_path / "src" / "kernel")
    return subprocess.run(
        [*CLI, "package", "build", f"--nvidia-source={source}",
         f"--kernel-headers-from-apt={FLAVOUR}", f"--apt-mirror={url}",
         f"--apt-keyring={keyring or archive.keyring}",
         *(f"--apt-suite={pocket}" for pocket in POCKETS), f"--out-dir={tmp_path / 'out'}",
         "--jobs=2", *extra],
        capture_output=True, text=True, timeout=800, check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)})


def test_flavour_and_common_from_the_newest_pocket_are_built_against(
        archive: Archive, tmp_path: Path) -> None:
    """The flavour's closure brings its common package; -updates' version wins although
    the release pocket is read after it; a 503 is retried and a cut download resumed."""
    with MirrorServer(archive.root) as server:
        flavour_deb = f"/pool/main/l/linux-gcp/{FLAVOUR}_{NEW}_amd64.deb"
        common_deb = f"/pool/main/l/linux-gcp/{COMMON}_{NEW}_all.deb"
        server.fault(flavour_deb, Fault("status", status=503))
        server.fault(common_deb, Fault("drop", after=1 << 20))
        done = _build(server.url, archive, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r.status for r in server.requests_for(flavour_deb)] == [503, 200]
        common = server.requests_for(common_deb)
        assert [(r.status, r.range) for r in common] == [(200, None), (206, "bytes=1048576-")]
        for pocket in POCKETS:  # each pocket's documents once
            assert len(server.requests_for(f"/dists/{pocket}/InRelease")) == 1
            assert len(server.requests_for(f"/dists/{pocket}/main/binary-amd64/Packages.xz")) == 1
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == RELEASE
    assert manifest.provenance is not None
    assert {(h["name"], h["version"]) for h in manifest.provenance["kernel_headers"]} == {
        (FLAVOUR, NEW), (COMMON, NEW)}
    info = kmod.modinfo((tmp_path / "out" / "modules" / "nvidia.ko").read_bytes())
    assert info["vermagic"][0].split()[0] == RELEASE
    assert not list(tmp_path.glob("gni-apt-headers-*"))  # the downloads are cleaned up


def test_a_file_mirror_is_read_too(archive: Archive, tmp_path: Path) -> None:
    """file:// goes through the same downloader (no server): the index and hashes still
    decide; a version nobody has is named with the versions the pockets have."""
    source = mini_source(tmp_path / "src" / "kernel")
    done = subprocess.run(
        [*CLI, "package", "build", f"--nvidia-source={source}",
         f"--kernel-headers-from-apt={FLAVOUR}", f"--apt-mirror={archive.root.as_uri()}",
         f"--apt-keyring={archive.keyring}", "--apt-suite=jammy",
         "--nvidia-source-from-apt=nvidia-kernel-source=535.1-1",
         f"--out-dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=120, check=False)
    line = refused(done, 2)
    assert "the archive has no nvidia-kernel-source 535.1-1" in line


def test_a_packages_index_other_than_the_signed_one_is_refused(archive: Archive,
                                                              tmp_path: Path) -> None:
    index = archive.root / "dists" / "jammy-updates" / "main" / "binary-amd64" / "Packages.xz"
    other = lzma.compress(lzma.decompress(index.read_bytes()).replace(
        NEW.encode(), b"6.1.0-57.99"))
    with MirrorServer(archive.root) as server:
        server.fault("/dists/jammy-updates/main/binary-amd64/Packages.xz",
                     Fault("serve", other=other, times=0))
        line = refused(_build(server.url, archive, tmp_path))
    assert "jammy-updates/main/binary-amd64/Packages.xz is" in line
    assert "but the signed Release says" in line
    assert not (tmp_path / "out").exists()


def test_a_signature_by_another_key_is_refused(archive: Archive, tmp_path: Path) -> None:
    other = key(tmp_path / "other-gnupg", "other")
    try:
        with MirrorServer(archive.root) as server:
            line = refused(_build(server.url, archive, tmp_path, keyring=other))
    finally:
        subprocess.run(["gpgconf", "--homedir", str(tmp_path / "other-gnupg"), "--kill",
                        "gpg-agent"], check=False, capture_output=True)
    assert f"/dists/jammy-updates/InRelease is not signed by a key of {other}" in line
    assert not (tmp_path / "out").exists()


def test_a_changed_release_has_a_bad_signature(archive: Archive, tmp_path: Path) -> None:
    signed = archive.root / "dists" / "jammy-security" / "InRelease"
    with MirrorServer(archive.root) as server:
        server.fault("/dists/jammy-security/InRelease", Fault(
            "serve", other=signed.read_bytes().replace(b"Origin: Ubuntu", b"Origin: Ubuntv"),
            times=0))
        line = refused(_build(server.url, archive, tmp_path))
    assert "jammy-security/InRelease is not signed by a key of" in line
    assert "BAD signature" in line


def test_a_suite_the_mirror_lacks(archive: Archive, tmp_path: Path) -> None:
    with MirrorServer(archive.root) as server:
        line = refused(_build(server.url, archive, tmp_path, "--apt-suite=jammy-proposed"), 5)
    assert f"{server.url}/dists/jammy-proposed/InRelease" in line
    assert line.endswith("fix: check --apt-mirror and --apt-suite (is jammy-proposed a suite "
                         "of that archive?)")
