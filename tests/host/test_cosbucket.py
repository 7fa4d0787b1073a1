"""The COS bucket fixture (tests/cosbucket.py) against Google's layout, read back with
independent tools: tarfile's pax reader and GNU tar, the real `openssl cms -verify`, kmod's
`modinfo`, makeself's own `--noexec --target`, and google-crc32c/hashlib over the bytes the
server sent."""

from __future__ import annotations

import errno
import hashlib
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import artifacts
import pytest
import requests
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
from cosserver import CosServer, object_hashes, parse_x_goog_hash
from httpserver import Fault
from native import build_standins
from signing_keys import make_key, modinfo, openssl_verify

from installer.node import kmod
from installer.node.host import Roots
from installer.packages.builder.modsig import MARKER, TAIL_OVERHEAD, TRAILER, strip_signature
from installer.testing import SAMPLE_NODES, build_node
from installer.testing.kernel import FakeKernelHost

VERSION = "535.261.03"
BUILD = "17162.279.34"
KOS = ("nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> CosBucket:
    """The default bucket, with the real-files runfile (cached across runs)."""
    return make_bucket(tmp_path_factory.mktemp("cos"))


@pytest.fixture(scope="module")
def server(bucket: CosBucket) -> Iterator[CosServer]:
    with CosServer(bucket.root) as running:
        yield running


@pytest.fixture
def small(tmp_path: Path) -> CosBucket:
    """A bucket without the runfile, for tests that change it."""
    return make_bucket(tmp_path, runfile=False)


def get(server: CosServer, path: str, **headers: str) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=30,
                        verify=str(server.ca_bundle) if server.ca_bundle else True)


def digests_of(data: bytes) -> dict[str, str]:
    crc, md5 = object_hashes(data)
    return {"crc32c": crc, "md5": md5}


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


class TestServedHashes:
    """x-goog-hash and x-goog-stored-content-length describe the whole object's bytes."""

    def test_full_get(self, server: CosServer, bucket: CosBucket) -> None:
        answer = get(server, bucket.tarball_path)
        assert answer.status_code == 200
        assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(answer.content)
        assert answer.headers["x-goog-hash"] == (
            "crc32c={crc32c},md5={md5}".format(**digests_of(answer.content)))
        assert answer.headers["x-goog-stored-content-length"] == str(len(answer.content))
        assert answer.content == bucket.tarball.read_bytes()

    def test_range_get_carries_the_whole_objects_hash(self, server: CosServer,
                                                      bucket: CosBucket) -> None:
        whole = bucket.tarball.read_bytes()
        part = get(server, bucket.tarball_path, Range="bytes=100-199")
        assert part.status_code == 206 and part.content == whole[100:200]
        assert parse_x_goog_hash(part.headers["x-goog-hash"]) == digests_of(whole)
        assert part.headers["x-goog-stored-content-length"] == str(len(whole))

    def test_version_file_and_runfile(self, server: CosServer, bucket: CosBucket) -> None:
        answer = get(server, bucket.path("gpu_default_version"))
        assert answer.text == "535.261.03\n"
        assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(b"535.261.03\n")
        assert bucket.runfile is not None
        head = requests.head(server.url + bucket.runfile_path, verify=str(server.ca_bundle),
                             timeout=30)
        assert head.status_code == 200
        crc, md5 = object_hashes(bucket.runfile)
        assert parse_x_goog_hash(head.headers["x-goog-hash"]) == {"crc32c": crc, "md5": md5}
        assert head.headers["x-goog-stored-content-length"] == str(
            bucket.runfile.stat().st_size)
        assert server.runfile_url + bucket.runfile_path.removeprefix(
            "/nvidia-drivers-us-public") == server.url + bucket.runfile_path
        assert server.cos_tools_url == server.url + "/cos-tools"

    def test_tls_needs_the_ca_bundle(self, server: CosServer, bucket: CosBucket) -> None:
        assert server.url.startswith("https://127.0.0.1:") and server.ca_bundle
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(server.url + bucket.path("gpu_default_version"), timeout=30)

    def test_plain_http(self, small: CosBucket) -> None:
        with CosServer(small.root, tls=False) as plain:
            assert plain.url.startswith("http://127.0.0.1:") and plain.ca_bundle is None
            answer = get(plain, small.tarball_path)
            assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(
                answer.content)

    def test_split_header_lines(self, small: CosBucket) -> None:
        with CosServer(small.root, tls=False, split_hash=True) as split:
            answer = get(split, small.tarball_path)
            raw = answer.raw.headers.getlist("x-goog-hash")
            assert [v.split("=")[0] for v in raw] == ["crc32c", "md5"]
            assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(
                answer.content)

    def test_requests_are_recorded(self, server: CosServer, bucket: CosBucket) -> None:
        get(server, bucket.path("gpu_latest_version"))
        (seen,) = server.requests_for(bucket.path("gpu_latest_version"))[-1:]
        assert seen.status == 200
        assert seen in server.requests


class TestFaults:
    """Each lie does what it says; the body stays the object's."""

    @pytest.fixture
    def live(self, small: CosBucket) -> Iterator[CosServer]:
        with CosServer(small.root) as running:
            yield running

    def test_wrong_crc32c(self, live: CosServer, small: CosBucket) -> None:
        live.lie(small.tarball_path, crc32c=True)
        answer = get(live, small.tarball_path)
        told, truth = parse_x_goog_hash(answer.headers["x-goog-hash"]), digests_of(
            answer.content)
        assert answer.content == small.tarball.read_bytes()
        assert told["crc32c"] != truth["crc32c"] and told["md5"] == truth["md5"]
        assert len(told["crc32c"]) == len(truth["crc32c"])  # still 4 bytes, just wrong
        again = get(live, small.tarball_path, Range="bytes=0-0")  # every response lies
        assert parse_x_goog_hash(again.headers["x-goog-hash"]) == told

    def test_wrong_md5(self, live: CosServer, small: CosBucket) -> None:
        live.lie(small.tarball_path, md5=True)
        answer = get(live, small.tarball_path)
        told, truth = parse_x_goog_hash(answer.headers["x-goog-hash"]), digests_of(
            answer.content)
        assert told["md5"] != truth["md5"] and told["crc32c"] == truth["crc32c"]

    def test_missing_header(self, live: CosServer, small: CosBucket) -> None:
        live.lie(small.tarball_path, missing=True, times=1)
        answer = get(live, small.tarball_path)
        assert answer.status_code == 200 and "x-goog-hash" not in answer.headers
        assert answer.headers["x-goog-stored-content-length"] == str(len(answer.content))
        assert "x-goog-hash" in get(live, small.tarball_path).headers  # times=1: once

    def test_composite_object_has_only_crc32c(self, live: CosServer, small: CosBucket
                                              ) -> None:
        live.lie(small.tarball_path, composite=True)
        answer = get(live, small.tarball_path)
        assert answer.headers["x-goog-hash"] == "crc32c=" + digests_of(
            answer.content)["crc32c"]

    def test_tarball_404(self, live: CosServer, small: CosBucket) -> None:
        live.missing(small.tarball_path)
        assert get(live, small.tarball_path).status_code == 404
        assert get(live, small.tarball_path).status_code == 404  # stays gone
        assert get(live, small.path("gpu_default_version")).status_code == 200

    def test_missing_version_file(self, live: CosServer, small: CosBucket) -> None:
        small.remove_alias("latest")
        answer = get(live, small.path("gpu_latest_version"))
        assert answer.status_code == 404 and "x-goog-hash" not in answer.headers
        live.missing(small.path("gpu_default_version"))
        assert get(live, small.path("gpu_default_version")).status_code == 404

    def test_alias_pointing_at_a_version_without_a_tarball(self, live: CosServer,
                                                           small: CosBucket) -> None:
        small.write_alias("R550", "550.54.14")
        version = get(live, small.path("gpu_R550_version")).text.strip()
        assert version == "550.54.14"
        assert get(live, small.path(tarball_name(version))).status_code == 404

    def test_httpserver_faults_keep_the_true_hash(self, live: CosServer, small: CosBucket
                                                  ) -> None:
        truth = digests_of(small.tarball.read_bytes())
        live.fault(small.tarball_path, Fault("corrupt", after=10))
        corrupt = get(live, small.tarball_path)
        assert corrupt.content != small.tarball.read_bytes()
        assert parse_x_goog_hash(corrupt.headers["x-goog-hash"]) == truth  # detectable
        live.fault(small.tarball_path, Fault("serve", other=b"replaced upstream"))
        served = get(live, small.tarball_path)
        assert served.content == b"replaced upstream"
        assert parse_x_goog_hash(served.headers["x-goog-hash"]) == digests_of(
            b"replaced upstream")


def test_crc32c_is_castagnoli_big_endian() -> None:
    """The header's crc32c is base64 of the big-endian CRC-32C (RFC 3720's check value)."""
    import base64

    crc, md5 = object_hashes(b"123456789")
    assert struct.unpack(">I", base64.b64decode(crc))[0] == 0xE3069283
    assert base64.b64decode(md5) == hashlib.md5(b"123456789").digest()
    assert shutil.which("makeself"), "makeself (Debian) is needed for the runfile"
