"""The COS bucket fixture (tests/cosbucket.py) against Google's layout, read back with
independent tools: tarfile's pax reader and GNU tar, the real `openssl cms -verify`, kmod's
`modinfo` and makeself's own `--noexec --target` (test_cosbucket_served.py: what the server
sends)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import artifacts
import cosbucket_fixtures
import pytest
from cosbucket import (
    FIRMWARE,
    MODULES,
    PADDED_ALIAS,
    CosBucket,
    firmware_bytes,
    ima_xattr,
    make_bucket,
    read_tgz,
    tarball_name,
    xattr_bytes,
)
from cosrunfile import cached_runfile, runfile_key, runfile_sources
from native import build_standins
from signing_keys import make_key, modinfo, openssl_verify

from installer.node import kmod
from installer.node.host import Roots
from installer.packages.builder.modsig import MARKER, TAIL_OVERHEAD, TRAILER, strip_signature
from installer.testing import SAMPLE_NODES, build_node
from installer.testing.kernel import FakeKernelHost

# The fixtures: the default bucket (once per module), a small bucket (per test).
bucket = cosbucket_fixtures.bucket
small = cosbucket_fixtures.small

VERSION = "535.261.03"
BUILD = "17162.279.34"
KOS = ("nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko")


class TestLayout:
    """cos-tools/<BUILD_ID>/[<board>/] and NVIDIA's tesla/<v>/ as cos_gpu_installer reads."""

    def test_current_builds_have_the_board_in_the_prefix(self, bucket: CosBucket) -> None:
        prefix = bucket.root / "cos-tools" / BUILD / "lakitu"
        assert bucket.prefix() == prefix and bucket.prefix_path() == f"/cos-tools/{BUILD}/lakitu"
        names = {p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if p.is_file()}
        assert names == {
            "gpu_default_version", "gpu_latest_version", "gpu_R535_version",
            f"nvidia-drivers-{VERSION}.tgz", "kernel-headers.tgz", "toolchain_env",
            f"extensions/gpu/NVIDIA-Linux-x86_64-{VERSION}-custom.run",
            f"extensions/gpu/nvidia-drivers-{VERSION}-signature.tar.gz"}
        run = bucket.root / "nvidia-drivers-us-public/tesla" / VERSION / \
            f"NVIDIA-Linux-x86_64-{VERSION}.run"
        assert bucket.runfile == run and run.is_file()
        assert bucket.runfile_path == (f"/nvidia-drivers-us-public/tesla/{VERSION}/"
                                       f"NVIDIA-Linux-x86_64-{VERSION}.run")

    def test_older_builds_have_no_board(self, tmp_path: Path) -> None:
        old = make_bucket(tmp_path, build_id="16919.235.1", board=None, runfile=False)
        assert old.prefix() == old.root / "cos-tools" / "16919.235.1"
        assert old.path("gpu_default_version") == "/cos-tools/16919.235.1/gpu_default_version"
        assert (old.prefix() / tarball_name(VERSION)).is_file()
        assert sorted(p.name for p in old.prefix().iterdir() if p.is_dir()) == ["extensions"]

    def test_version_files_hold_the_version_and_a_newline(self, bucket: CosBucket) -> None:
        assert bucket.version_file("default").read_bytes() == b"535.261.03\n"
        assert bucket.version_file("latest").read_bytes() == b"535.261.03\n"
        padded = bucket.version_file(PADDED_ALIAS).read_text()
        assert padded != VERSION + "\n" and padded.endswith("\n")
        assert padded.strip() == VERSION
        assert bucket.aliases == {"default": VERSION, "latest": VERSION, "R535": VERSION}

    def test_an_alias_may_point_at_a_version_without_a_tarball(self, small: CosBucket
                                                               ) -> None:
        small.write_alias("R550", "550.54.14")
        assert small.version_file("R550").read_text() == "550.54.14\n"
        assert not (small.prefix() / tarball_name("550.54.14")).exists()
        small.remove_alias("latest")
        assert not small.version_file("latest").exists() and "latest" not in small.aliases

    def test_signature_tarball_holds_each_modules_detached_tail(self, bucket: CosBucket
                                                                ) -> None:
        sigs = bucket.prefix() / f"extensions/gpu/nvidia-drivers-{VERSION}-signature.tar.gz"
        members = {name: data for name, (_, data) in read_tgz(sigs).items()}
        assert set(members) == {f"{ko}.sig" for ko in KOS}
        for ko in KOS:
            assert bucket.unsigned[ko] + members[f"{ko}.sig"] == bucket.signed[ko]


class TestModulesTarball:
    """nvidia-drivers-<v>.tgz: signed open modules and firmware with security.ima xattrs."""

    def test_members_are_googles(self, bucket: CosBucket) -> None:
        members = read_tgz(bucket.tarball)
        assert list(members) == [
            "drivers", *(f"drivers/{ko}" for ko in KOS), "firmware", "firmware/nvidia",
            f"firmware/nvidia/{VERSION}",
            *(f"firmware/nvidia/{VERSION}/{fw}" for fw in FIRMWARE)]
        for name, (info, data) in members.items():
            assert info.isdir() == (data is None), name
            assert (info.uid, info.gid, info.uname) == (0, 0, "root")
        for ko in KOS:
            assert members[f"drivers/{ko}"][1] == bucket.signed[ko]

    def test_each_module_ends_with_a_real_appended_signature(
            self, bucket: CosBucket, tmp_path: Path) -> None:
        members = read_tgz(bucket.tarball)
        for ko in KOS:
            data = members[f"drivers/{ko}"][1]
            assert data is not None and data.endswith(MARKER)
            _, _, id_type, signer, key_id, pad, sig_len = TRAILER.unpack_from(
                data, len(data) - TAIL_OVERHEAD)
            assert (id_type, signer, key_id, pad) == (2, 0, 0, b"\0\0\0")
            unsigned, tail = strip_signature(data)
            assert unsigned == bucket.unsigned[ko] and len(tail) == sig_len + TAIL_OVERHEAD
            assert tail[0] == 0x30  # DER SEQUENCE: the ContentInfo
            (tmp_path / ko).write_bytes(data)
            done = openssl_verify(tmp_path / ko, bucket.cert, tmp_path / f"v-{ko}")
            assert done.returncode == 0, done.stderr
            other = make_key(tmp_path / "other", "other")
            wrong = openssl_verify(tmp_path / ko, other.cert, tmp_path / f"w-{ko}")
            assert wrong.returncode != 0  # the check means something

    def test_modinfo_says_what_nvidias_open_modules_say(self, bucket: CosBucket,
                                                        tmp_path: Path) -> None:
        for ko in KOS:
            path = tmp_path / ko
            path.write_bytes(bucket.signed[ko])
            info = modinfo(path)
            stem = ko.removesuffix(".ko")
            assert info["name"] == stem.replace("-", "_")
            assert info["version"] == VERSION and info["license"] == "Dual MIT/GPL"
            assert info["vermagic"] == "6.1.58+ SMP preempt mod_unload modversions"
            assert info.get("depends", "") == MODULES[stem]
            assert (info["sig_id"], info["signer"], info["sig_hashalgo"]) == (
                "PKCS#7", "cos test module signing key", "sha256")

    def test_firmware_carries_security_ima_as_gnu_tar_writes_it(self, bucket: CosBucket
                                                                ) -> None:
        members = read_tgz(bucket.tarball)
        for fw in FIRMWARE:
            info, data = members[f"firmware/nvidia/{VERSION}/{fw}"]
            assert data == firmware_bytes(VERSION, fw) == bucket.firmware[fw]
            value = xattr_bytes(info)
            assert value == ima_xattr(data) == bucket.ima[info.name]
            assert value[:2] == b"\x03\x02" and len(value) == 265
        assert not any(xattr_bytes(info) for name, (info, _) in members.items()
                       if "/gsp_" not in name)
        import gzip

        raw = gzip.decompress(bucket.tarball.read_bytes())
        value = bucket.ima[f"firmware/nvidia/{VERSION}/gsp_ga10x.bin"]
        assert b" SCHILY.xattr.security.ima=" + value + b"\n" in raw  # raw binary record
        assert b"hdrcharset" not in raw
        assert f"firmware/nvidia/{VERSION}/PaxHeaders/gsp_ga10x.bin".encode() in raw

    def test_gnu_tar_lists_the_xattr(self, bucket: CosBucket) -> None:
        done = subprocess.run(["tar", "--xattrs", "--xattrs-include=*", "-tvvzf",
                               str(bucket.tarball)], capture_output=True, text=True,
                              check=True)
        listed = [line.strip() for line in done.stdout.splitlines()]
        assert listed.count("x: 265 security.ima") == 2, done.stdout

    def test_the_products_fake_kernel_loads_them_in_order(self, bucket: CosBucket,
                                                          tmp_path: Path) -> None:
        root = build_node(tmp_path / "node", SAMPLE_NODES["gke-cos-a100x8"])
        (root / "proc" / "modules").touch()
        enforce = root / "sys/module/module/parameters/sig_enforce"
        enforce.parent.mkdir(parents=True, exist_ok=True)
        enforce.write_text("Y\n")
        host = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))
        for ko in ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko"):
            (tmp_path / ko).write_bytes(bucket.signed[ko])
            host.finit_module(tmp_path / ko, "")
        assert {n: host.version_of(n) for n in ("nvidia", "nvidia_uvm", "nvidia_modeset")
                } == dict.fromkeys(("nvidia", "nvidia_uvm", "nvidia_modeset"), VERSION)
        assert kmod.modinfo_depends(bucket.signed["nvidia-drm.ko"]) == (
            "nvidia_modeset", "drm_kms_helper", "drm")
        (tmp_path / "unsigned.ko").write_bytes(bucket.unsigned["nvidia-drm.ko"])
        with pytest.raises(OSError) as rejected:
            host.finit_module(tmp_path / "unsigned.ko", "")
        assert rejected.value.errno == errno.EKEYREJECTED

    def test_given_modules_are_signed_and_packed(self, tmp_path: Path, bucket: CosBucket
                                                 ) -> None:
        mods = tmp_path / "mods"
        mods.mkdir()
        (mods / "nvidia.ko").write_bytes(bucket.unsigned["nvidia.ko"] + b"\0custom")
        (mods / "nvidia-uvm.ko").write_bytes(bucket.signed["nvidia-uvm.ko"])  # re-signed
        own = make_bucket(tmp_path / "b", modules_dir=mods, runfile=False)
        members = read_tgz(own.tarball)
        assert sorted(n for n in members if n.startswith("drivers/")) == [
            "drivers/nvidia-uvm.ko", "drivers/nvidia.ko"]
        assert own.unsigned["nvidia-uvm.ko"] == bucket.unsigned["nvidia-uvm.ko"]
        data = members["drivers/nvidia.ko"][1]
        assert data is not None and strip_signature(data)[0].endswith(b"\0custom")
        (tmp_path / "n.ko").write_bytes(data)
        assert openssl_verify(tmp_path / "n.ko", own.cert, tmp_path / "v").returncode == 0


def unpack(run: Path, target: Path) -> Path:
    subprocess.run(["sh", str(run), "--noexec", "--target", str(target)], check=True,
                   capture_output=True, cwd=target.parent)
    return target


class TestRunfile:
    """NVIDIA-Linux-x86_64-<v>.run: a compressed makeself archive with NVIDIA's layout."""

    def test_unpacks_with_nvidias_layout_and_debians_real_libraries(
            self, bucket: CosBucket, tmp_path: Path) -> None:
        assert bucket.runfile is not None
        tree = unpack(bucket.runfile, tmp_path / "x")
        real = artifacts.nvidia_tree(VERSION) / artifacts.LIB_DIR
        for lib in ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                    "libnvidia-nvvm.so"):
            name = f"{lib}.{VERSION}"
            assert (tree / name).read_bytes() == (real / name).read_bytes(), name
        assert not [p for p in tree.rglob("*") if p.is_symlink()]  # NVIDIA ships no links
        assert (tree / "nvidia-smi").stat().st_mode & 0o111
        assert (tree / "nvidia-installer").stat().st_mode & 0o111
        assert (tree / ".manifest").read_text().splitlines()[1] == VERSION
        assert (tree / "kernel-open/Kbuild").is_file()
        assert (tree / "kernel-open/nvidia/nv.c").is_file()
        assert (tree / "kernel").is_dir()
        for fw in FIRMWARE:
            assert (tree / "firmware" / fw).read_bytes() == bucket.firmware[fw]
        # only the archive went there: nvidia-installer (exit 99) never ran
        assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]

    def test_is_gzip_compressed_by_default(self, bucket: CosBucket) -> None:
        assert bucket.runfile is not None
        info = subprocess.run(["sh", str(bucket.runfile), "--info"], capture_output=True,
                              text=True, check=True).stdout
        assert "Compression: gzip" in info
        assert f"Linux-x86_64 {VERSION}" in info  # the label

    def test_cached_by_its_inputs(self, bucket: CosBucket, tmp_path: Path) -> None:
        assert bucket.runfile is not None
        again = cached_runfile(VERSION, bucket.firmware)
        assert again.parent.parent == artifacts.cache_root() / "cos-run"
        assert again.stat().st_mtime_ns == cached_runfile(VERSION, bucket.firmware
                                                          ).stat().st_mtime_ns  # not rebuilt
        assert again.read_bytes() == bucket.runfile.read_bytes()
        sources = runfile_sources(VERSION, None)
        key = runfile_key(VERSION, bucket.firmware, sources, xz=False)
        assert again.parent.name == key
        standins = build_standins(tmp_path / "standins")
        others = [runfile_key(VERSION, bucket.firmware, sources, xz=True),
                  runfile_key(VERSION, dict(bucket.firmware, **{FIRMWARE[0]: b"other"}),
                              sources, xz=False),
                  runfile_key(VERSION, bucket.firmware, runfile_sources(VERSION, standins),
                              xz=False)]
        assert len({key, *others}) == 4

    def test_standins_replace_nvml_and_cuda(self, tmp_path: Path) -> None:
        standins = build_standins(tmp_path / "standins")
        own = make_bucket(tmp_path / "b", standins=standins)
        assert own.runfile is not None
        tree = unpack(own.runfile, tmp_path / "x")
        assert (tree / f"libnvidia-ml.so.{VERSION}").read_bytes() == (
            standins / "libnvidia-ml.so.1").read_bytes()
        assert (tree / f"libcuda.so.{VERSION}").read_bytes() == (
            standins / "libcuda.so.1").read_bytes()
        real = artifacts.nvidia_tree(VERSION) / artifacts.LIB_DIR
        assert (tree / f"libnvidia-nvvm.so.{VERSION}").read_bytes() == (
            real / f"libnvidia-nvvm.so.{VERSION}").read_bytes()

    def test_xz_option(self, tmp_path: Path) -> None:
        own = make_bucket(tmp_path, xz=True)
        assert own.runfile is not None
        info = subprocess.run(["sh", str(own.runfile), "--info"], capture_output=True,
                              text=True, check=True).stdout
        assert "Compression: xz" in info
        tree = unpack(own.runfile, tmp_path / "x")
        assert (tree / ".manifest").read_text().splitlines()[1] == VERSION
        assert (tree / "firmware/gsp_tu10x.bin").read_bytes() == own.firmware["gsp_tu10x.bin"]
