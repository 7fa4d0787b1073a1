"""COS artifacts: the bucket layout, Cloud Storage's hash header, COS's version fallbacks."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import google_crc32c
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from installer.errors import IntegrityError
from installer.packages.cos import gcshash, layout
from installer.packages.ima import parse_ima
from installer.stages.fetch.cos import CosUnsupportedGpuError, fallbacks, refuse_proprietary_only


def _header(data: bytes, *, md5: bool = True) -> str:
    crc = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
    parts = [f"crc32c={crc}"]
    if md5:
        parts.append("md5=" + base64.b64encode(hashlib.md5(data).digest()).decode())
    return ", ".join(parts)


def _digests(data: bytes) -> gcshash.Digests:
    digests = gcshash.Digests()
    for start in range(0, len(data), 7):  # in pieces, as a stream arrives
        digests.update(data[start:start + 7])
    return digests


class TestLayout:
    """Names and URLs as cos_gpu_installer builds them."""

    @pytest.mark.parametrize(("zone", "bucket", "runfiles"), [
        ("us-central1-a", "cos-tools", "nvidia-drivers-us-public"),
        ("europe-west4-b", "cos-tools-eu", "nvidia-drivers-eu-public"),
        ("asia-east1-c", "cos-tools-asia", "nvidia-drivers-asia-public"),
        ("australia-southeast1-a", "cos-tools-asia", "nvidia-drivers-us-public"),
        ("southamerica-east1-a", "cos-tools", "nvidia-drivers-us-public"),
        (None, "cos-tools", "nvidia-drivers-us-public")])
    def test_region_from_zone(self, zone: str | None, bucket: str, runfiles: str) -> None:
        assert layout.cos_tools_url(None, zone) == f"https://storage.googleapis.com/{bucket}"
        assert layout.runfile_base(None, zone) == f"https://storage.googleapis.com/{runfiles}"

    def test_configured_urls_win(self) -> None:
        assert layout.cos_tools_url("https://mirror/cos/", "europe-west1-b") == \
            "https://mirror/cos"

    def test_prefixes_board_first(self) -> None:
        assert layout.prefixes("B", "17162.279.34", "lakitu") == [
            "B/17162.279.34/lakitu", "B/17162.279.34"]
        assert layout.prefixes("B", "12371.1.0", None) == ["B/12371.1.0"]

    def test_board_of_signed_images(self) -> None:
        assert layout.board_of("lakitu-signed-prempkeys") == "lakitu"
        assert layout.board_of("lakitu-arm64-signed-prempkeys") == "lakitu-arm64"
        assert layout.board_of("lakitu") == "lakitu"
        assert layout.board_of(None) is None

    def test_version_file_and_names(self) -> None:
        assert layout.parse_version_file(b"535.261.03 \t\n\n", "f") == "535.261.03"
        with pytest.raises(IntegrityError, match="not a driver version"):
            layout.parse_version_file(b"<html>", "gpu_default_version")
        assert layout.alias_key("R535") == "535" and layout.alias_key("latest") == "latest"
        assert layout.runfile_url("B", "535.261.03") == \
            "B/tesla/535.261.03/NVIDIA-Linux-x86_64-535.261.03.run"

    @given(st.text(max_size=30))
    def test_no_build_id_climbs_out(self, text: str) -> None:
        if layout.BUILD_ID_RE.match(text):
            assert "/" not in text and ".." not in text


class TestHashHeader:
    """x-goog-hash: both digests checked, a missing or malformed header refused."""

    @given(st.binary(max_size=300))
    def test_matching_bytes_pass(self, data: bytes) -> None:
        gcshash.check("obj", _header(data), _digests(data))
        gcshash.check("obj", _header(data, md5=False), _digests(data))  # composite object

    def test_one_flipped_byte_fails_crc32c(self) -> None:
        data = b"x" * 1000
        with pytest.raises(gcshash.ObjectHashMismatch, match="crc32c"):
            gcshash.check("obj", _header(data), _digests(data[:-1] + b"y"))

    def test_md5_mismatch(self) -> None:
        data = b"payload"
        header = _header(data).split(",")[0] + ",md5=" + base64.b64encode(b"\0" * 16).decode()
        with pytest.raises(gcshash.ObjectHashMismatch, match="md5"):
            gcshash.check("obj", header, _digests(data))

    @pytest.mark.parametrize("header", [None, "", "md5=AAAA"])
    def test_no_crc32c_is_refused(self, header: str | None) -> None:
        with pytest.raises(gcshash.ObjectHashMismatch, match="without a crc32c"):
            gcshash.check("obj", header, _digests(b""))

    def test_malformed_value(self) -> None:
        with pytest.raises(gcshash.ObjectHashMismatch, match="malformed crc32c"):
            gcshash.parse_header("crc32c=@@@@")

    def test_sha256_is_what_the_manifest_gets(self) -> None:
        assert _digests(b"abc").hexdigest() == hashlib.sha256(b"abc").hexdigest()


class TestFallbacks:
    """GPUs a published branch cannot drive: COS falls back (K80 -> R470, L4/H100 -> R535)."""

    LOG = structlog.get_logger("test")

    def test_hopper_falls_back_from_470(self) -> None:
        aliases = {"default": "470.256.02", "latest": "550.90.07", "470": "470.256.02",
                   "535": "535.261.03", "550": "550.90.07"}
        assert fallbacks(aliases, ["Hopper"], self.LOG) == {"default": "535.261.03"}

    def test_kepler_falls_back_to_470(self) -> None:
        aliases = {"default": "535.261.03", "latest": "550.90.07", "470": "470.256.02",
                   "535": "535.261.03"}
        assert fallbacks(aliases, ["Kepler"], self.LOG) == {
            "default": "470.256.02", "latest": "470.256.02"}

    def test_nothing_to_fall_back_to(self) -> None:
        assert fallbacks({"default": "470.256.02"}, ["Hopper"], self.LOG) == {}

    def test_supported_default_stays(self) -> None:
        assert fallbacks({"default": "535.261.03", "470": "470.1.2"}, ["Ampere"],
                         self.LOG) == {}

    @pytest.mark.parametrize("arch", ["Kepler", "Pascal", "Volta"])
    def test_proprietary_only_refused(self, arch: str) -> None:
        with pytest.raises(CosUnsupportedGpuError, match="need the proprietary") as caught:
            refuse_proprietary_only([arch])
        assert "GKE's own installer" in caught.value.one_line()
        refuse_proprietary_only(["Ampere", "Hopper"])


class TestImaField:
    """The manifest's `ima` list: firmware files only, once each, base64."""

    def _fail(self, where: str, problem: str) -> ValueError:
        return ValueError(f"{where}: {problem}")

    def test_valid(self) -> None:
        entries = parse_ima([{"file": "firmware/a.bin", "signature": "AwI="}],
                            {"firmware/a.bin"}, self._fail)
        assert entries[0].signature == b"\x03\x02"

    @pytest.mark.parametrize(("value", "message"), [
        ({}, "must be a list"),
        ([{"file": "lib/x.so", "signature": "AwI="}], "not a firmware file"),
        ([{"file": "firmware/a.bin", "signature": "***"}], "not base64"),
        ([{"file": "firmware/a.bin", "signature": ""}], "1 to"),
        ([{"file": "firmware/a.bin"}], "exactly file, signature"),
        ([{"file": "firmware/a.bin", "signature": "AwI="}] * 2, "listed twice")])
    def test_refused(self, value: object, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            parse_ima(value, {"firmware/a.bin"}, self._fail)

    def test_stage_sets_the_attribute_or_says_why(self, tmp_path: Path) -> None:
        from installer.errors import StagingError
        from installer.packages.ima import XATTR, ImaEntry
        from installer.packages.manifest import FileEntry
        from installer.stages.stage.ima import set_signatures

        entry = FileEntry("firmware/nvidia/535.261.03/gsp_ga10x.bin", 3, "0" * 64, 0o444,
                          "firmware")
        signed = ImaEntry(entry.path, b"\x03\x02sig")
        staged = tmp_path / "firmware" / "nvidia" / "535.261.03" / "gsp_ga10x.bin"
        with pytest.raises(StagingError, match=f"cannot set {XATTR} on firmware/nvidia"):
            set_signatures(tmp_path, (entry,), (signed,))  # not staged yet: ENOENT
        staged.parent.mkdir(parents=True)
        staged.write_bytes(b"gsp")
        set_signatures(tmp_path, (entry,), (signed,))
        assert os.getxattr(staged, XATTR) == b"\x03\x02sig"
