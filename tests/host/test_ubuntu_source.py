"""The `ubuntu` source end to end: an Ubuntu node (the gke-ubuntu-t4 sample: ID=ubuntu,
22.04, kernel 5.15.0-1049-gke), UBUNTU_SOURCE=auto, an Ubuntu-shaped archive over HTTP.

The archive (tests/ubuntudebs.py `restricted_archive`): Canonical-layout .debs by dpkg-deb,
the modules signed by a throw-away key with the real `openssl cms` as sign-file signs, the
user-mode libraries the NVML/CUDA stand-ins (so `verify` runs the real pynvml) beside the
real nvidia-smi, Packages.xz per pocket and an InRelease signed by the real gpg, checked by
the real gpgv. The kernel is simulated (tests/fakenode.py) and enforces module signatures.
"""

from __future__ import annotations

import lzma
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import artifacts
import pytest
from cosbucket import firmware_bytes
from e2e import KERNEL, NODE, Scene, events, make_scene, run_cli, standin_env
from helpers import tree_listing
from httpserver import Fault, MirrorServer
from native import build_standins
from signing_keys import make_key
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

from installer.testing import SAMPLE_NODES

pytestmark = pytest.mark.timeout(300)
VERSION = "535.261.03"
NEWER = "535.274.02"  # modules the archive has no user-mode packages of
STEMS = ("nvidia", "nvidia-uvm", "nvidia-modeset")  # the sample node has no drm loaded
MODULES_DEB = modules_deb_path(KERNEL)


@dataclass(frozen=True)
class Archives:
    root: Path  # modules and user-mode packages of VERSION
    skewed: Path  # modules of NEWER, user-mode packages of VERSION and OLD_VERSION
    keyring: Path
    modules: dict[str, bytes]
    firmware: dict[str, bytes]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archives]:
    base = tmp_path_factory.mktemp("ubuntu-source")
    canonical = make_key(base, "canonical")
    built = build_standins(base / "standins")
    libraries = {"libcuda.so": built / "libcuda.so.1",
                 "libnvidia-ml.so": built / "libnvidia-ml.so.1"}
    smi = artifacts.nvidia_tree(VERSION) / "usr/lib/nvidia/current/nvidia-smi"
    firmware = {"gsp_tu10x.bin": firmware_bytes(VERSION, "gsp_tu10x.bin")}
    modules = signed_modules(KERNEL, VERSION, canonical.key, canonical.cert, base,
                             stems=STEMS)
    newer = signed_modules(KERNEL, NEWER, canonical.key, canonical.cert, base / "newer",
                           stems=STEMS)
    gnupg = base / "gnupg"
    with archive_keyring(gnupg) as keyring:
        root = restricted_archive(base / "good", KERNEL, VERSION, modules, libraries, smi,
                                  firmware, gnupg)
        skewed = restricted_archive(base / "skewed", KERNEL, NEWER, newer, libraries, smi,
                                    firmware, gnupg, user_version=VERSION)
        yield Archives(root, skewed, keyring, modules, firmware)


def _scene(tmp_path: Path, kernel: str = KERNEL) -> Scene:
    scene = make_scene(tmp_path, replace(SAMPLE_NODES[NODE], kernel=kernel))
    enforce = scene.root / "sys/module/module/parameters/sig_enforce"
    enforce.parent.mkdir(parents=True, exist_ok=True)
    enforce.write_text("Y\n")
    return scene


def _install(scene: Scene, url: str, archives: Archives,
             request: str = "535") -> subprocess.CompletedProcess[str]:
    return run_cli(["install", *scene.args(
        "--ubuntu-source", "auto", "--ubuntu-apt-mirror", url,
        "--ubuntu-keyring", str(archives.keyring), "--driver-version", request)],
        standin_env(VERSION))


def test_install_assembles_loads_and_reboots_offline(archives: Archives,
                                                     tmp_path: Path) -> None:
    """resolve (branch 535 -> the archive's version) -> download and verify -> assemble ->
    cache -> load under enforced signatures -> verify; then the reboot: no archive at all."""
    scene = _scene(tmp_path)
    with MirrorServer(archives.root) as server:
        server.fault(MODULES_DEB, Fault("status", status=503))
        done = _install(scene, server.url, archives)
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r.status for r in server.requests_for(MODULES_DEB)] == [503, 200]
        for pocket in ("", "-updates", "-security"):  # each pocket's documents once
            assert len(server.requests_for(f"/dists/{SERIES}{pocket}/InRelease")) == 1
            assert len(server.requests_for(
                f"/dists/{SERIES}{pocket}/restricted/binary-amd64/Packages.xz")) == 1
        url = server.url
    assembled = [e for e in events(done.stderr) if e.get("event") == "package assembled"]
    assert len(assembled) == 1 and assembled[0]["branch"] == "535-server", assembled
    loaded = (scene.root / "proc" / "modules").read_text()
    for name in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        assert f"{name} " in loaded, loaded
    drivers = scene.install_dir / "drivers"
    for name, data in archives.modules.items():  # Canonical's signed modules, byte for byte
        assert (drivers / name).read_bytes() == data
    for name, data in archives.firmware.items():
        assert (scene.install_dir / "firmware" / "nvidia" / VERSION / name).read_bytes() == data
    assert (scene.install_dir / "lib64" / f"libnvidia-ml.so.{VERSION}").is_file()
    assert not list((scene.install_dir / "lib64").glob(f"*{OLD_VERSION}*"))
    # the reboot: the same node, the archive's server gone
    again = _install(scene, url, archives)
    assert again.returncode == 0, again.stderr[-3000:]
    assert any(e.get("fast_path") is True for e in events(again.stderr)) or (
        "fast path" in again.stdout), again.stdout


def _refused(scene: Scene, done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (scene.install_dir / "drivers").exists()
    assert not (scene.install_dir / ".ready.json").exists()
    return lines[0]


def _outside(scene: Scene) -> dict[str, int]:
    """What the node holds outside the installer's own directory and the folders above it
    (and the fake kernel's /proc and /sys)."""
    work = scene.install_dir.relative_to(scene.root)
    mine = {work.as_posix(), *(p.as_posix() for p in work.parents)}
    return {p: s for p, s in tree_listing(scene.root).items()
            if p not in mine and not p.startswith((f"{work.as_posix()}/", "proc", "sys"))}


def test_a_tampered_packages_index(archives: Archives, tmp_path: Path) -> None:
    scene = _scene(tmp_path)
    before = _outside(scene)
    index = archives.root / UPDATES_INDEX.lstrip("/")
    other = lzma.compress(lzma.decompress(index.read_bytes()).replace(
        f"{VERSION}-0ubuntu1".encode(), f"{VERSION}-0ubuntu9".encode()))
    with MirrorServer(archives.root) as server:
        server.fault(UPDATES_INDEX, Fault("serve", other=other, times=0))
        line = _refused(scene, _install(scene, server.url, archives), 7)
    assert f"{SERIES}-updates/restricted/binary-amd64/Packages.xz is" in line, line
    assert "but the signed Release says" in line, line
    assert line.endswith("fix: use a UBUNTU_APT_MIRROR that serves the archive unchanged, "
                         "or set UBUNTU_KEYRING to the keyring that signs it"), line
    assert _outside(scene) == before


def test_a_keyring_the_container_lacks(archives: Archives, tmp_path: Path) -> None:
    scene = _scene(tmp_path)
    with MirrorServer(archives.root) as server:
        done = run_cli(["install", *scene.args(
            "--ubuntu-source", "auto", "--ubuntu-apt-mirror", server.url,
            "--ubuntu-keyring", str(tmp_path / "absent.gpg"), "--driver-version", "535")],
            standin_env(VERSION))
        assert not server.requests
    line = _refused(scene, done, 2)
    assert f"the Ubuntu archive keyring {tmp_path / 'absent.gpg'} does not exist" in line


def test_user_mode_packages_of_another_version(archives: Archives, tmp_path: Path) -> None:
    scene = _scene(tmp_path)
    before = _outside(scene)
    with MirrorServer(archives.skewed) as server:
        line = _refused(scene, _install(scene, server.url, archives), 5)
    assert (f"the archive has no libnvidia-compute-535-server of driver {NEWER}, the version "
            f"of {modules_package_name(KERNEL)} (it has {OLD_VERSION}-0ubuntu1, "
            f"{VERSION}-0ubuntu1)" in line), line
    assert _outside(scene) == before


def test_no_modules_for_the_running_kernel(archives: Archives, tmp_path: Path) -> None:
    other = "5.15.0-9999-gke"
    scene = _scene(tmp_path, other)
    before = _outside(scene)
    with MirrorServer(archives.root) as server:
        line = _refused(scene, _install(scene, server.url, archives), 5)
        assert not server.requests_for(MODULES_DEB)
    assert f"restricted has no linux-modules-nvidia-<branch>-open-{other}" in line, line
    assert _outside(scene) == before


def test_off_by_default_and_on_other_distributions(archives: Archives,
                                                  tmp_path: Path) -> None:
    """Without UBUNTU_SOURCE=auto, or on a Debian node, the archive is never asked."""
    scene = _scene(tmp_path)
    (tmp_path / "debian").mkdir()
    debian = make_scene(tmp_path / "debian", replace(SAMPLE_NODES[NODE], os="debian-12"))
    with MirrorServer(archives.root) as server:
        off = run_cli(["install", *scene.args("--ubuntu-apt-mirror", server.url,
                                              "--driver-version", "535")],
                      standin_env(VERSION))
        elsewhere = _install(debian, server.url, archives)
        assert not server.requests
    assert off.returncode == 5 and elsewhere.returncode == 5, (off.stderr, elsewhere.stderr)


def test_versions_lists_what_canonical_built_for_the_kernel(archives: Archives,
                                                            tmp_path: Path) -> None:
    """Only the signed indexes are read: no .deb is downloaded to say what is offered."""
    import json

    scene = _scene(tmp_path)
    with MirrorServer(archives.root) as server:
        done = run_cli(["versions", *scene.args(
            "--ubuntu-source", "auto", "--ubuntu-apt-mirror", server.url,
            "--ubuntu-keyring", str(archives.keyring), "--driver-version", "535",
            "--output", "json")], standin_env(VERSION))
        assert done.returncode == 0, done.stderr[-3000:]
        assert all(r.path.startswith("/dists/") for r in server.requests), server.requests
    report = json.loads(done.stdout)
    ubuntu = [s for s in report["sources"] if s["source"].startswith("ubuntu ")]
    assert len(ubuntu) == 1 and ubuntu[0]["error"] is None, report
    assert ubuntu[0]["aliases"] == {"535": VERSION, "default": VERSION, "latest": VERSION}
    assert ubuntu[0]["versions"] == {VERSION: ["open"]}
    assert report["resolved"] == f"{VERSION} (open)"
