"""makeself `.run` archives read without running their shell header (real `makeself` output)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from installer.packages import makeself

pytestmark = pytest.mark.skipif(shutil.which("makeself") is None,
                                reason="Debian's makeself is not installed (make deps)")


def _make(tmp: Path, *flags: str, startup: str = "./setup.sh") -> Path:
    src = tmp / "src"
    (src / "firmware").mkdir(parents=True)
    (src / "libcuda.so.535.261.03").write_bytes(b"\x7fELF" + b"\0" * 60)
    (src / "firmware" / "gsp_ga10x.bin").write_bytes(b"gsp" * 100)
    (src / "libcuda.so.1").symlink_to("libcuda.so.535.261.03")
    witness = tmp / "header-ran"
    (src / "setup.sh").write_text(f"#!/bin/sh\ntouch {witness}\n")
    (src / "setup.sh").chmod(0o755)
    run = tmp / "NVIDIA-Linux-x86_64-535.261.03.run"
    subprocess.run(["makeself", "--quiet", "--nox11", *flags, str(src), str(run),
                    "NVIDIA Accelerated Graphics Driver", startup], check=True,
                   stdout=subprocess.DEVNULL)
    return run


class TestExtract:
    """The payload lands in the target; the header (a shell script) is never executed."""

    @pytest.mark.parametrize("flags", [(), ("--xz", "--sha256"), ("--nocomp",),
                                       ("--bzip2",)])
    def test_every_compression_makeself_writes(self, tmp_path: Path,
                                               flags: tuple[str, ...]) -> None:
        run = _make(tmp_path, *flags)
        payload = makeself.extract(run, tmp_path / "out")
        assert (tmp_path / "out" / "firmware" / "gsp_ga10x.bin").read_bytes() == b"gsp" * 100
        assert (tmp_path / "out" / "libcuda.so.1").readlink() == Path("libcuda.so.535.261.03")
        assert payload.md5 is not None
        assert ("--sha256" in flags) == (payload.sha256 is not None)
        assert not (tmp_path / "header-ran").exists()

    def test_altered_payload_fails_its_own_checksum(self, tmp_path: Path) -> None:
        run = _make(tmp_path, "--nocomp")
        data = bytearray(run.read_bytes())
        position = data.rindex(b"gspgsp")
        data[position] ^= 0x20  # same length, still a valid tar body
        run.write_bytes(bytes(data))
        with pytest.raises(makeself.RunfileError, match=r"MD5 .*\(damaged or altered\)"):
            makeself.extract(run, tmp_path / "out")

    def test_truncated_file_is_refused_before_unpacking(self, tmp_path: Path) -> None:
        run = _make(tmp_path)
        run.write_bytes(run.read_bytes()[:-40])
        with pytest.raises(makeself.RunfileError, match="is truncated"):
            makeself.extract(run, tmp_path / "out")
        assert not (tmp_path / "out").exists()

    def test_not_a_makeself_file(self, tmp_path: Path) -> None:
        other = tmp_path / "x.run"
        other.write_text("#!/bin/sh\necho hello\n")
        with pytest.raises(makeself.RunfileError, match="not a makeself"):
            makeself.extract(other, tmp_path / "out")

    def test_member_climbing_out_is_refused(self, tmp_path: Path) -> None:
        run = _make(tmp_path, "--nocomp")
        header = makeself.read_header(run)
        evil = io.BytesIO()
        with tarfile.open(fileobj=evil, mode="w") as tar:
            info = tarfile.TarInfo("../escaped")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
        body = evil.getvalue()
        head = run.read_bytes()[:header.offset]
        head = head.replace(f'filesizes="{header.size}"'.encode(),
                            f'filesizes="{len(body)}"'.encode())
        head = head.replace(b'MD5="', b'MD5_UNCHECKED="', 1)  # the body changed
        run.write_bytes(head + body)
        with pytest.raises(makeself.RunfileError, match="does not unpack"):
            makeself.extract(run, tmp_path / "out")
        assert not (tmp_path / "escaped").exists()
