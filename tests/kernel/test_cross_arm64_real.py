"""`package build` on x86_64 cross-compiles NVIDIA's real 535 for bookworm's arm64 kernel.

Inputs are Debian's own, downloaded (never installed) by arm64cross.py: the arm64
`nvidia-open-kernel-source` 535.261.03, the exact release's `linux-headers-<release>-arm64`
+ `-common`, and the host's `linux-kbuild` (Multi-Arch: foreign). One real cross-build proves
the cross path, cached outside the repo and keyed by the inputs and the product's build code:
the open modules (what Grace and Blackwell take), with arm64cross's one-line `--patch` (the
open 535 sources call pci_resize_resource with the three arguments this 6.1.0-57 no longer
takes). The proprietary flavour's compile is the same code path, proven on x86_64 (and its
refusal of x86_64 sources here). What needs no real sources is proven on NVIDIA-shaped small
ones cross-built cold on every run: two builds byte for byte, signing, the refusals (no cross
compiler, sources of another arch), `--build-root auto`.

Cold cost on a 2-core machine: the arm64 .debs 28 s; the real open build 223-898 s (load 1-12);
the bookworm root of `--build-root auto` 18 s (mmdebstrap, once). Warm: the whole file in
about a minute.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from nvsources import mini_source
from signing_keys import make_key, modinfo, openssl_verify

from installer.packages.builder.modsig import strip_signature
from installer.packages.manifest import parse_manifest

from . import arm64cross, assets

pytestmark = pytest.mark.timeout(3600)
VERSION = assets.NVIDIA_REAL_VERSION
EM_AARCH64 = 183
MODULES = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko")
CLI = (sys.executable, "-m", "installer")


@pytest.fixture(scope="module")
def release() -> str:
    return arm64cross.arm64_release()


@pytest.fixture(scope="module")
def headers(release: str) -> list[Path]:
    return arm64cross.arm64_headers_debs(release)


@pytest.fixture(scope="module")
def open_build() -> Path:
    """The cached real cross-build's dir (minutes when cold): `pkg/`, `seconds`."""
    return arm64cross.cross_package("open")


def _elf_machine(path: Path) -> tuple[bytes, int]:
    head = path.read_bytes()[:20]
    return head[:6], struct.unpack_from("<H", head, 18)[0]


def _vermagic(release: str) -> str:
    """Debian's arm64 kernel: SMP, modversions, and arm64's MODULE_ARCH_VERMAGIC."""
    return f"{release} SMP mod_unload modversions aarch64"


def _assert_aarch64_modules(directory: Path, release: str) -> None:
    for name in MODULES:
        path = directory / name
        # ELF, 64-bit, little-endian, version 1; e_machine EM_AARCH64
        assert _elf_machine(path) == (b"\x7fELF\x02\x01", EM_AARCH64), name
        info = modinfo(path)
        assert info["vermagic"] == _vermagic(release), name


def test_cross_built_package_is_aarch64_for_the_arm64_release(release: str,
                                                              open_build: Path) -> None:
    package = open_build / "pkg"
    manifest = parse_manifest((package / "manifest.json").read_bytes())
    assert (manifest.arch, manifest.kernel_release, manifest.driver_version,
            manifest.flavour) == ("aarch64", release, VERSION, "open")
    assert sorted(m.name for m in manifest.modules) == sorted(
        m.removesuffix(".ko").replace("-", "_") for m in MODULES)
    _assert_aarch64_modules(package / "modules", release)
    assert modinfo(package / "modules" / "nvidia.ko")["license"] == "Dual MIT/GPL"
    assert manifest.provenance is not None
    assert manifest.provenance["nvidia_source"]["name"] == arm64cross.SOURCES["open"]
    assert [p["name"] for p in manifest.provenance["patches"]] == ["open-pci-resize.patch"]
    assert {h["name"] for h in manifest.provenance["kernel_headers"]} == {
        f"linux-headers-{release}", f"linux-headers-{release.rsplit('-', 1)[0]}-common",
        "linux-kbuild-6.1"}
    for path in (package / "modules").glob("*.ko"):
        text = subprocess.run(["strings", "-a", str(path)], capture_output=True, text=True,
                              check=True).stdout
        for leak in ("/tmp/", str(assets.cache_root()), "/root/"):
            assert leak not in text, f"{path.name} names {leak}"


def test_cross_built_modules_are_signed_when_asked(headers: list[Path], release: str,
                                                   tmp_path: Path) -> None:
    """Small sources cross-built and signed with a throw-away key: each module verifies
    with the real openssl, and modinfo reads the signer and the arm64 vermagic."""
    pair = make_key(tmp_path / "keys", "throwaway")
    package = tmp_path / "out"
    done = _cli(f"--nvidia-source={mini_source(tmp_path / 'nvidia-src')}",
                *(f"--kernel-headers={h}" for h in headers), "--arch=aarch64",
                f"--sign-key={pair.key}", f"--sign-cert={pair.cert}", f"--out-dir={package}")
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((package / "manifest.json").read_bytes())
    assert manifest.arch == "aarch64"
    assert {e.file for e in manifest.signatures} >= {f"modules/{m}" for m in MODULES}
    for name in MODULES:
        path = package / "modules" / name
        verified = openssl_verify(path, pair.cert, tmp_path / name)
        assert verified.returncode == 0, verified.stderr
        info = modinfo(path)
        assert (info["sig_id"], info["signer"]) == ("PKCS#7", "throwaway module signing key")
        assert info["vermagic"] == _vermagic(release)
        body, tail = strip_signature(path.read_bytes())
        assert tail and body, name


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "package", "build", *args], capture_output=True, text=True,
                          timeout=900, check=False, env=env)


def test_small_sources_cross_built_twice_cold_are_identical(headers: list[Path], release: str,
                                                            tmp_path: Path) -> None:
    outs = []
    for number, jobs in ((1, 1), (2, 2)):
        source = mini_source(tmp_path.joinpath(f"place{number}", *["deeper"] * number,
                                               "nvidia-src"))
        out = tmp_path / f"out{number}"
        done = _cli(f"--nvidia-source={source}", *(f"--kernel-headers={h}" for h in headers),
                    "--arch=aarch64", f"--jobs={jobs}", f"--out-dir={out}")
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(out)
    assert (outs[0] / "manifest.json").read_bytes() == (outs[1] / "manifest.json").read_bytes()
    assert parse_manifest((outs[0] / "manifest.json").read_bytes()).arch == "aarch64"
    _assert_aarch64_modules(outs[0] / "modules", release)
    for name in MODULES:
        assert (outs[0] / "modules" / name).read_bytes() == (
            outs[1] / "modules" / name).read_bytes(), name


def _path_without_cross_compiler(tmp_path: Path) -> str:
    """This machine's tools, as links in one dir, minus every aarch64-linux-gnu-* one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for tool in sorted(Path(directory).iterdir()) if Path(directory).is_dir() else []:
            link = bin_dir / tool.name
            if not tool.name.startswith("aarch64-linux-gnu-") and not link.exists():
                link.symlink_to(tool)
    return str(bin_dir)


def test_missing_cross_compiler_is_refused_naming_the_package(headers: list[Path],
                                                              release: str,
                                                              tmp_path: Path) -> None:
    source = mini_source(tmp_path / "nvidia-src")
    out = tmp_path / "out"
    env = dict(os.environ, PATH=_path_without_cross_compiler(tmp_path))
    done = _cli(f"--nvidia-source={source}", *(f"--kernel-headers={h}" for h in headers),
                "--arch=aarch64", f"--out-dir={out}", env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error(config): "), lines
    assert f"aarch64-linux-gnu-gcc-12 not found: kernel {release} is aarch64" in lines[0]
    assert lines[0].endswith("fix: apt-get install gcc-12-aarch64-linux-gnu, or compile in a "
                             "root of the kernel's distro: --build-root auto")
    assert not out.exists()


def test_sources_of_another_arch_are_refused_before_make(headers: list[Path],
                                                         tmp_path: Path) -> None:
    """bookworm's amd64 nvidia-kernel-source (its nv-kernel.o_binary is x86_64)."""
    out = tmp_path / "out"
    done = _cli(f"--nvidia-source={assets.nvidia_source_deb()}",
                *(f"--kernel-headers={h}" for h in headers), "--arch=aarch64",
                f"--out-dir={out}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1, lines
    assert "the NVIDIA sources are for x86_64 (nv-kernel.o_binary is a x86_64 object), not " \
           "aarch64" in lines[0]
    assert "compiling modules" not in done.stderr and not out.exists()


def test_build_root_auto_provides_the_cross_compiler(headers: list[Path], release: str,
                                                     tmp_path: Path) -> None:
    """Without the cross compiler on PATH, `--build-root auto` makes (once, cached) a
    bookworm root with gcc-12-aarch64-linux-gnu and cross-compiles there."""
    if os.geteuid() != 0:
        pytest.fail("--build-root needs root (chroot); run the kernel tier as root")
    source = mini_source(tmp_path / "nvidia-src")
    out = tmp_path / "out"
    env = dict(os.environ, PATH=_path_without_cross_compiler(tmp_path))
    done = _cli(f"--nvidia-source={source}", *(f"--kernel-headers={h}" for h in headers),
                "--arch=aarch64", "--build-root=auto",
                f"--build-root-cache={assets.cache_root() / 'build-roots'}",
                f"--out-dir={out}", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    assert manifest.arch == "aarch64" and manifest.provenance is not None
    root = manifest.provenance["build_root"]
    assert (root["distro"], root["suite"]) == ("debian", "bookworm")
    assert root["compiler"].startswith("gcc-12-aarch64-linux-gnu 12.")
    _assert_aarch64_modules(out / "modules", release)
