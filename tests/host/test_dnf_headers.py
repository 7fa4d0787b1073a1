"""`package build --kernel-headers-from-dnf` against a local dnf repository.

The repository is real in every part that is checked: kernel-devel RPMs packed by the real
`rpmbuild` (one from a Debian kernel's real headers laid out as RHEL's kernel-devel, so the
build really compiles against it; one older release from a minimal tree), `repodata/` made
by the real `createrepo_c`, `repomd.xml` signed by the real gpg (`--detach-sign --armor`,
a throw-away key) and verified by the real gpgv, everything served by tests/httpserver.py
on 127.0.0.1 and fetched through the project's downloader. Then another key, a changed
repomd.xml, a missing signature, a primary and an RPM that differ from what was signed,
sha1 checksums, an unknown release and a name of the wrong shape are each refused with one
line and their exit code.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fallbacknode import RELEASE, headers_debs, unpack_headers
from httpserver import MirrorServer
from nvsources import mini_source
from rpmrepos import (
    build_rpm,
    make_key,
    make_repo,
    minimal_tree,
    rhel_tree,
    rpm_tools,
    sign_repomd,
    stop_agents,
)

from installer.packages.manifest import parse_manifest

CLI = (sys.executable, "-m", "installer")
VERSION, ABI = RELEASE.split("-")[:2]  # bookworm's 6.1.0-57-amd64 -> kernel-devel 6.1.0-57.el9
RHEL_RELEASE = f"{VERSION}-{ABI}.el9.x86_64"
OLDER = f"{VERSION}-9.el9"  # older by rpm's ordering, though "9" > "57" as text

pytestmark = pytest.mark.skipif(not rpm_tools(), reason="needs rpmbuild, rpm2archive, "
                                "createrepo_c, gpg and gpgv: make deps")


@dataclass(frozen=True)
class Repo:
    root: Path
    url: str
    armored: Path
    keyring: Path
    gnupg: Path


@pytest.fixture(scope="module")
def rpms(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The real-headers kernel-devel and an older minimal one (built once per module)."""
    debs = headers_debs()
    if debs is None:
        pytest.skip("needs dpkg-deb and gcc-12 (the kernel's compiler): make deps")
    work = tmp_path_factory.mktemp("rpms")
    real = rhel_tree(unpack_headers(debs, work / "debs"), RELEASE, work / "real", RHEL_RELEASE)
    older = minimal_tree(work / "older", f"{OLDER}.x86_64")
    return [build_rpm(real, work, version=VERSION, release=f"{ABI}.el9"),
            build_rpm(older, work, version=VERSION, release="9.el9")]


@pytest.fixture
def repo(tmp_path: Path, rpms: list[Path]) -> Iterator[Repo]:
    with _own_repo(tmp_path, rpms) as served:
        yield served


def _build(repo: Repo, tmp_path: Path, name: str = f"kernel-devel-{VERSION}", *extra: str,
           keyring: Path | None = None, target: str | None = None
           ) -> subprocess.CompletedProcess[str]:
    source = mini_source(tmp_path / "src" / "kernel")
    return subprocess.run([*CLI, "package", "build", f"--nvidia-source={source}",
                           f"--kernel-headers-from-dnf={name}", f"--dnf-mirror={repo.url}",
                           f"--dnf-keyring={keyring or repo.armored}",
                           target or f"--out-dir={tmp_path / 'out'}", *extra],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path)})


def _refused(done: subprocess.CompletedProcess[str], tmp_path: Path, code: int = 7) -> str:
    assert done.returncode == code, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
    return errors[0]


def test_the_highest_release_is_verified_and_built_against(repo: Repo, tmp_path: Path) -> None:
    """`kernel-devel-6.1.0` matches both releases: rpm's ordering picks 57.el9 over 9.el9;
    the armored key file (as /etc/pki/rpm-gpg ships them) is accepted."""
    done = _build(repo, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == RHEL_RELEASE
    assert manifest.provenance is not None
    assert [(h["name"], h["version"]) for h in manifest.provenance["kernel_headers"]] == [
        ("kernel-devel", f"{VERSION}-{ABI}.el9")]
    assert {m.name for m in manifest.modules} >= {"nvidia", "nvidia_uvm"}
    assert not list(tmp_path.glob("gni-apt-headers-*"))  # the downloads are cleaned up


def test_an_exact_release_with_a_binary_keyring(repo: Repo, tmp_path: Path) -> None:
    done = _build(repo, tmp_path, f"kernel-devel-{OLDER}.x86_64", keyring=repo.keyring)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == f"{OLDER}.x86_64"


def test_a_signature_by_another_key_is_refused(repo: Repo, tmp_path: Path) -> None:
    other, _ = make_key(tmp_path / "other-gnupg", "other")
    line = _refused(_build(repo, tmp_path, keyring=other), tmp_path)
    assert f"{repo.url}/repodata/repomd.xml is not signed by a key of" in line
    assert "No public key" in line


def test_a_changed_repomd_has_a_bad_signature(repo: Repo, tmp_path: Path) -> None:
    repomd = repo.root / "repodata" / "repomd.xml"
    repomd.write_bytes(repomd.read_bytes().replace(b"<revision>", b"<revision>1"))
    line = _refused(_build(repo, tmp_path), tmp_path)
    assert "repomd.xml is not signed by a key of" in line and "BAD signature" in line


def test_a_missing_signature_is_refused(repo: Repo, tmp_path: Path) -> None:
    (repo.root / "repodata" / "repomd.xml.asc").unlink()
    line = _refused(_build(repo, tmp_path), tmp_path)
    assert f"{repo.url}/repodata/repomd.xml has no detached signature" in line


def test_a_primary_other_than_the_signed_one_is_refused(repo: Repo, tmp_path: Path) -> None:
    primary = next((repo.root / "repodata").glob("*-primary.xml.gz"))
    primary.write_bytes(gzip.compress(gzip.decompress(primary.read_bytes()) + b"\n"))
    line = _refused(_build(repo, tmp_path), tmp_path)
    assert f"{primary.name} is not the primary metadata the signed repomd.xml lists" in line


def test_an_rpm_other_than_the_listed_one_is_refused(repo: Repo, tmp_path: Path) -> None:
    rpm = next((repo.root / "Packages").glob(f"kernel-devel-{VERSION}-{ABI}.el9.*.rpm"))
    data = rpm.read_bytes()
    rpm.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    line = _refused(_build(repo, tmp_path), tmp_path)
    assert f"{rpm.name} is not the package the signed primary metadata lists" in line


@contextmanager
def _own_repo(tmp_path: Path, rpms: list[Path], **kwargs: str) -> Iterator[Repo]:
    root = make_repo(tmp_path / "mirror", rpms, **kwargs)
    armored, keyring = make_key(tmp_path / "gnupg", "repo")
    sign_repomd(root, tmp_path / "gnupg")
    try:
        with MirrorServer(root) as server:
            yield Repo(root, server.url, armored, keyring, tmp_path / "gnupg")
    finally:
        stop_agents(tmp_path)


def test_sha1_checksums_are_refused(tmp_path: Path, rpms: list[Path]) -> None:
    with _own_repo(tmp_path, rpms[1:], checksum="sha1") as repo:
        line = _refused(_build(repo, tmp_path), tmp_path)
    assert "with a sha1 checksum, which this client cannot trust" in line


def test_an_xz_primary(tmp_path: Path, rpms: list[Path]) -> None:
    with _own_repo(tmp_path, rpms[1:], compress="xz") as repo:
        assert list((repo.root / "repodata").glob("*-primary.xml.xz"))
        done = _build(repo, tmp_path, "kernel-devel", keyring=repo.keyring)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == f"{OLDER}.x86_64"


def _zstd_primary(root: Path) -> None:
    """createrepo_c's gzip primary recompressed with zstd and repomd.xml's entry rewritten,
    as createrepo_c 1.0 and Fedora write it (Debian's createrepo_c 0.17 has no zstd)."""
    zstandard = pytest.importorskip("zstandard")
    gz = next((root / "repodata").glob("*-primary.xml.gz"))
    data = zstandard.ZstdCompressor().compress(gzip.decompress(gz.read_bytes()))
    digest = hashlib.sha256(data).hexdigest()
    (root / "repodata" / f"{digest}-primary.xml.zst").write_bytes(data)
    repomd = root / "repodata" / "repomd.xml"
    text, old = repomd.read_text(), gz.name.split("-")[0]
    block = text[text.index('<data type="primary">'):]
    block = block[:block.index("</data>")]
    new = re.sub(r"<size>\d+</size>", f"<size>{len(data)}</size>", block.replace(
        gz.name, f"{digest}-primary.xml.zst").replace(f">{old}<", f">{digest}<"))
    repomd.write_text(text.replace(block, new))
    gz.unlink()


def test_a_zstd_primary(tmp_path: Path, rpms: list[Path]) -> None:
    root = make_repo(tmp_path / "mirror", rpms[1:])
    _zstd_primary(root)
    armored, _ = make_key(tmp_path / "gnupg", "repo")
    sign_repomd(root, tmp_path / "gnupg")
    try:
        with MirrorServer(root) as server:
            done = _build(Repo(root, server.url, armored, armored, tmp_path / "gnupg"),
                          tmp_path)
    finally:
        stop_agents(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == f"{OLDER}.x86_64"


def test_a_release_the_repository_lacks(repo: Repo, tmp_path: Path) -> None:
    line = _refused(_build(repo, tmp_path, "kernel-devel-9.9.9-1.el9"), tmp_path, 2)
    assert "the repository has no kernel-devel-9.9.9-1.el9 for x86_64 (it has " in line
    assert f"kernel-devel-{VERSION}-{ABI}.el9.x86_64" in line


def test_a_name_that_is_not_a_kernel_devel_package(repo: Repo, tmp_path: Path) -> None:
    line = _refused(_build(repo, tmp_path, "bash"), tmp_path, 2)
    assert "--kernel-headers-from-dnf 'bash' is not a kernel-devel[-<release>] package" in line


def test_no_key_is_trusted_by_default(repo: Repo, tmp_path: Path) -> None:
    source = mini_source(tmp_path / "src" / "kernel")
    line = _refused(subprocess.run(
        [*CLI, "package", "build", f"--nvidia-source={source}",
         f"--kernel-headers-from-dnf=kernel-devel-{VERSION}", f"--dnf-mirror={repo.url}",
         f"--out-dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120,
        check=False), tmp_path, 2)
    assert "--kernel-headers-from-dnf needs --dnf-keyring" in line


def test_a_local_kernel_devel_rpm_builds_too(rpms: list[Path], tmp_path: Path) -> None:
    """`--kernel-headers FILE.rpm`: the same real tree, given as a file."""
    local = tmp_path / rpms[0].name
    shutil.copy2(rpms[0], local)
    done = subprocess.run([*CLI, "package", "build",
                           f"--nvidia-source={mini_source(tmp_path / 'src')}",
                           f"--kernel-headers={local}", f"--out-dir={tmp_path / 'out'}"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.kernel_release == RHEL_RELEASE
    assert manifest.arch == "x86_64"


def test_rpms_are_grouped_by_the_release_their_header_names(rpms: list[Path]) -> None:
    from installer.packages.builder.headers import group_headers
    from installer.packages.builder.headersarch import headers_arch

    assert group_headers(tuple(rpms)) == {RHEL_RELEASE: (rpms[0],),
                                          f"{OLDER}.x86_64": (rpms[1],)}
    assert headers_arch(tuple(rpms)) == "x86_64"


def test_two_kernels_by_name_build_one_package_each(repo: Repo, tmp_path: Path) -> None:
    """Each name resolves on its own; the fetched RPMs are grouped by their header's release."""
    done = _build(repo, tmp_path, f"kernel-devel-{VERSION}-{ABI}.el9",
                  f"--kernel-headers-from-dnf=kernel-devel-{OLDER}",
                  target=f"--repo={tmp_path / 'repo'}")
    assert done.returncode == 0, done.stderr[-3000:]
    built = sorted(p.parent.parent.parent.name
                   for p in (tmp_path / "repo").glob("*/*/*/manifest.json"))
    assert built == sorted([RHEL_RELEASE, f"{OLDER}.x86_64"])
