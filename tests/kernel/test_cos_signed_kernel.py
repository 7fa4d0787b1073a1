"""The COS bucket fixture's signed modules are what a real kernel parses as signed.

The tier's stand-in modules named `nvidia` (tests/kernel/modules, open flavour), built
against Debian's real kernel headers, are signed by the fixture's throw-away key
(tests/cosbucket.py: the real `openssl cms -sign`, sign-file's layout), packed into the
bucket's `nvidia-drivers-<v>.tgz` and taken out of it again with tarfile. One guest boot
with `module.sig_enforce=1` then offers each to `finit_module`: the kernel must read every
signature and refuse it for its key (EKEYREJECTED, "Loading of module with unavailable key
is rejected"), where the same module unsigned is refused as unsigned and one whose DER is
garbled as a bad message (EBADMSG): a key the kernel trusts is not at hand, so "unavailable
key" is the proof that the structure parsed.

The guest runs scenarios.py's `raw_loads` group (the raw finit_module the sig_enforce group
uses too); this file boots once on its own (~15-30 s).
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
from cosbucket import CosBucket, make_bucket
from signing_keys import modinfo, openssl_verify

from installer.packages.builder.modsig import MARKER, strip_signature

from . import assets, signed
from .assets import Kernel

pytestmark = pytest.mark.timeout(1200)  # cold: the open test modules compile first

VERSION = "535.261.03"
ORDER = signed.MODULES

@pytest.fixture(scope="module")
def open_modules(kernel: Kernel) -> Path:
    """The tier's stand-in nvidia*.ko (open flavour) built against the real headers."""
    return assets.build_test_modules(kernel, VERSION, flavour="open")


@pytest.fixture(scope="module")
def cos_bucket(kernel: Kernel, open_modules: Path,
               tmp_path_factory: pytest.TempPathFactory) -> CosBucket:
    return make_bucket(tmp_path_factory.mktemp("cos"), modules_dir=open_modules,
                       kernel_release=kernel.release, runfile=False)


@pytest.fixture(scope="module")
def from_tgz(cos_bucket: CosBucket, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bucket tarball's drivers/*.ko, taken out again (tarfile, no product code)."""
    out = tmp_path_factory.mktemp("from-tgz")
    with tarfile.open(cos_bucket.tarball, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith("drivers/"):
                handle = tar.extractfile(member)
                assert handle is not None
                (out / Path(member.name).name).write_bytes(handle.read())
    return out


@pytest.fixture(scope="module")
def enforced(kernel: Kernel, open_modules: Path, from_tgz: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One boot with module.sig_enforce=1: each signed module, then the unsigned control."""
    out = tmp_path_factory.mktemp("guest-cos-sig")
    mods = out / "modules"  # inside the shared out dir: visible in the guest for certain
    mods.mkdir()
    cases = []
    for name in ORDER:
        (mods / name).write_bytes((from_tgz / name).read_bytes())
        cases.append((name, str(mods / name)))
    (mods / "unsigned-nvidia.ko").write_bytes((open_modules / "nvidia.ko").read_bytes())
    cases.append(("unsigned", str(mods / "unsigned-nvidia.ko")))
    unsigned, tail = strip_signature((from_tgz / "nvidia.ko").read_bytes())
    (mods / "garbled-nvidia.ko").write_bytes(unsigned + b"\x31" + tail[1:])  # DER tag broken
    cases.append(("garbled", str(mods / "garbled-nvidia.ko")))
    return signed.enforced_loads(kernel, out, cases)


def test_tarball_round_trip_keeps_the_real_modules_signed(
        kernel: Kernel, open_modules: Path, cos_bucket: CosBucket, from_tgz: Path,
        tmp_path: Path) -> None:
    """No boot: what came out of the tgz is the headers-built module plus a signature that
    openssl and kmod read, signed by the bucket's certificate."""
    assert sorted(p.name for p in from_tgz.iterdir()) == sorted(ORDER)
    for name in ORDER:
        data = (from_tgz / name).read_bytes()
        assert data.endswith(MARKER) and data == cos_bucket.signed[name]
        assert strip_signature(data)[0] == (open_modules / name).read_bytes()
        done = openssl_verify(from_tgz / name, cos_bucket.cert, tmp_path / name)
        assert done.returncode == 0, done.stderr
        info = modinfo(from_tgz / name)
        assert (info["sig_id"], info["signer"]) == ("PKCS#7", "cos test module signing key")
        assert info["vermagic"].startswith(kernel.release + " ")
        assert info["version"] == VERSION


class TestEnforcedBoot(signed.EnforcedBootChecks):
    """The one boot: signed.EnforcedBootChecks."""
