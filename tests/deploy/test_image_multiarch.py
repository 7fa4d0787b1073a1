"""`make image PLATFORMS=linux/amd64,linux/arm64` really builds one manifest list:
both platforms are in it, the arm64 image's Python and installer run (under qemu-user where
this machine is not arm64), and every ELF file in each image is for its own machine, the
compiled dependencies included. Skips, saying why, where podman or emulation is missing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from deploy import podman
from deploy.manifests import REPO
from installer import __version__

pytestmark = [pytest.mark.image, pytest.mark.timeout(3600)]

LIST = f"localhost/gpu-node-installer:test-multiarch-{__version__}"
BASES = f"localhost/gni-test-base:bookworm-multiarch-{__version__}"
PLATFORMS = ("linux/amd64", "linux/arm64")
ELF_MACHINE = {"amd64": 62, "arm64": 183}  # e_machine: EM_X86_64, EM_AARCH64
VENV = "opt/gpu-node-installer/"


def make_image(base: str, name: str = LIST, platforms: tuple[str, ...] = PLATFORMS,
               target: tuple[str, ...] = ()) -> float:
    """The documented `make image PLATFORMS=...` with this machine's podman flags; seconds."""
    engine = " ".join(["podman", *podman.GLOBAL])
    flags = " ".join(["--isolation chroot --pull=never --network host", *target])
    args = ["make", "-s", "-C", str(REPO), "-o", "venv", "image",
            f"PLATFORMS={','.join(platforms)}", f"CONTAINER_ENGINE={engine}",
            f"IMAGE_BUILD_FLAGS={flags}", f"BASE_IMAGE={base}", f"IMAGE={name}",
            f"PIP_CA={podman.ca_bundle() or ''}"]
    started = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3000, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return time.monotonic() - started


@pytest.fixture(scope="module")
def image() -> str:
    reason = podman.why_podman_cannot_run()
    for platform in PLATFORMS:
        reason = reason or podman.why_arch_cannot_run(platform.split("/")[1])
    if reason is not None:
        pytest.skip(reason)
    timings, bases = [], []
    for platform in PLATFORMS:
        arch = platform.split("/")[1]
        base, rootfs_s, import_s = podman.base_image(arch)
        probe = podman.podman("run", *podman.RUN, base, "true", check=False)
        if probe.returncode != 0:
            pytest.skip(f"podman cannot run {arch} containers here: {probe.stderr[-500:]}")
        bases.append(base)
        timings.append(f"{arch} rootfs {'cached' if rootfs_s is None else f'{rootfs_s:.0f} s'}"
                       f", import {'cached' if import_s is None else f'{import_s:.0f} s'}")
    # no layer cache: each platform's pip resolves now, against the same index (a cached
    # layer of one platform would keep the versions of the day it was built)
    build_s = make_image(podman.manifest_list(BASES, bases), target=("--no-cache",))
    print(f"\nmulti-arch image timings: {'; '.join(timings)}; build {build_s:.0f} s",
          file=sys.stderr)
    return LIST


def instances(name: str) -> dict[str, str]:
    """platform ("linux/arm64") -> the image's digest, from the manifest list."""
    listing = json.loads(podman.podman("manifest", "inspect", name).stdout)
    return {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
            for m in listing["manifests"]}


def ref(platform: str, name: str = LIST) -> str:
    """The list's image for `platform`, by digest: what a node's pull resolves it to. (podman
    4.3 run/create --platform on a local list may take the wrong instance, with a warning.)"""
    return f"{name.rsplit(':', 1)[0]}@{instances(name)[platform]}"


def run_on(platform: str, *args: str, entrypoint: str | None = None, name: str = LIST) -> str:
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return podman.podman("run", *podman.RUN, *extra, ref(platform, name), *args).stdout


@pytest.fixture(scope="module")
def elf_machines(image: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, dict[str, int]]:
    """platform -> {path: e_machine} for every ELF file in the venv and the interpreter, read
    from each image's exported file system (no code of the image runs for this)."""
    found: dict[str, dict[str, int]] = {}
    for platform in PLATFORMS:
        name = f"gni-elf-{platform.split('/')[1]}"
        podman.podman("rm", "--force", "--ignore", name)
        podman.podman("create", "--name", name, ref(platform))
        archive = tmp_path_factory.mktemp("export") / "fs.tar"
        try:
            podman.podman("export", "--output", str(archive), name, timeout=300)
        finally:
            podman.podman("rm", "--force", name)
        found[platform] = _elf_files(archive)
    return found


def _elf_files(archive: Path) -> dict[str, int]:
    machines: dict[str, int] = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            if not member.isfile() or not (member.name.startswith(VENV)
                                           or member.name == "usr/bin/python3.11"):
                continue
            stream = tar.extractfile(member)
            head = stream.read(20) if stream else b""
            if head[:4] == b"\x7fELF":
                machines[member.name] = int.from_bytes(head[18:20], "little")
    return machines


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected), bit by bit: the value to compare the C one with."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


class TestMultiArchImage:
    """One name, two platforms, each with its own machine's binaries."""

    def test_the_list_has_both_platforms(self, image: str) -> None:
        found = instances(image)
        assert sorted(found) == sorted(PLATFORMS), found
        assert len(set(found.values())) == len(PLATFORMS)
        for platform in PLATFORMS:  # each image's own config says the same
            (config,) = json.loads(podman.podman("image", "inspect", ref(platform)).stdout)
            assert f"{config['Os']}/{config['Architecture']}" == platform

    def test_each_platform_runs_its_own_interpreter(self, image: str) -> None:
        """arm64 through qemu-user on an x86_64 machine: the machine Python reports is the
        image's, not the host's."""
        code = "import platform; print(platform.machine())"
        for platform, machine in (("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")):
            out = run_on(platform, "-c", code, entrypoint="/opt/gpu-node-installer/bin/python")
            assert out.strip() == machine, platform

    def test_the_installer_runs_on_arm64(self, image: str) -> None:
        out = run_on("linux/arm64", "--version")
        assert out.strip() == f"gpu-node-installer, version {__version__}"

    def test_compiled_dependencies_load_on_arm64(self, image: str) -> None:
        """The per-platform wheels (cryptography, google-crc32c, pyyaml) import and work."""
        code = ("import google_crc32c, yaml, cryptography.hazmat.bindings._rust as r; "
                "from cryptography.hazmat.primitives import hashes; "
                "h = hashes.Hash(hashes.SHA256()); h.update(b'gni'); "
                "print(google_crc32c.value(b'gni'), yaml.__with_libyaml__, h.finalize().hex())")
        crc, libyaml, sha = run_on("linux/arm64", "-c", code,
                                   entrypoint="/opt/gpu-node-installer/bin/python").split()
        assert int(crc) == _crc32c(b"gni")
        assert libyaml == "True"  # the C loader, i.e. the aarch64 extension, not the fallback
        assert sha == hashlib.sha256(b"gni").hexdigest()

    def test_every_elf_file_is_for_its_platform(
            self, elf_machines: dict[str, dict[str, int]]) -> None:
        for platform, machines in elf_machines.items():
            expected = ELF_MACHINE[platform.split("/")[1]]
            assert "usr/bin/python3.11" in machines, platform
            extensions = [p for p in machines if p.endswith(".so")]
            assert len(extensions) >= 5, (platform, sorted(machines))  # cffi, yaml, crc32c...
            wrong = {p: m for p, m in machines.items() if m != expected}
            assert wrong == {}, (platform, wrong)

    def test_both_platforms_have_the_same_packages(self, image: str) -> None:
        """The same distributions at the same versions in both venvs, and each image's SBOM
        (made by the build machine's interpreter, also for arm64) lists exactly those."""
        code = ("import importlib.metadata as m; "
                "print(sorted(f'{d.name}=={d.version}' for d in m.distributions()))")
        listings = {p: run_on(p, "-c", code, entrypoint="/opt/gpu-node-installer/bin/python")
                    for p in PLATFORMS}
        assert len(set(listings.values())) == 1, listings
        assert f"gpu-node-installer=={__version__}" in listings["linux/arm64"]
        for platform in PLATFORMS:
            sbom = json.loads(run_on(platform, "/opt/gpu-node-installer/sbom.cdx.json",
                                     entrypoint="cat"))
            listed = sorted(f"{c['name']}=={c['version']}" for c in sbom["components"])
            assert str(listed) == listings[platform].strip(), platform

    def test_the_arm64_builder_stage_runs_on_the_build_machine(self, image: str) -> None:
        """The build runs no arm64 code: the arm64 build's builder stage (its layers are
        cached from the list's build) is the build machine's own platform, holding the
        aarch64 wheels it downloaded for the target."""
        name = f"localhost/gpu-node-installer:test-builder-{__version__}"
        make_image(BASES, name, ("linux/arm64",), ("--target builder",))
        listing = run_on("linux/arm64", "-c", "uname -m; ls /wheels", entrypoint="sh", name=name)
        machine, *wheels = listing.split()
        assert machine == os.uname().machine
        compiled = [w for w in wheels if not w.endswith("-none-any.whl")]
        assert len(compiled) >= 5 and all(w.endswith("_aarch64.whl") for w in compiled), wheels


def test_a_missing_emulator_is_a_skip_that_says_what_to_install() -> None:
    """The reason the tier gives where a platform cannot run (no handler is registered here
    for riscv64; the native platform never needs one)."""
    assert podman.why_arch_cannot_run(podman.NATIVE) is None
    reason = podman.why_arch_cannot_run("riscv64")
    assert reason is not None
    assert "/proc/sys/fs/binfmt_misc/qemu-riscv64" in reason and "qemu-user-static" in reason
