"""Canonical-shaped signed module .debs, through `package build --ubuntu-modules`, as a real
kernel reads them.

The tier's stand-in modules named `nvidia` (tests/kernel/modules, open flavour), built
against Debian's real kernel headers, are signed by a throw-away key standing in for
Canonical's (tests/cosbucket.py's `sign_module`: the real `openssl cms -sign`, sign-file's
layout), packed by the real dpkg-deb into `linux-modules-nvidia-535-server-open-<release>`
with Canonical's layout (tests/ubuntudebs.py), and run through the real
`gpu-node-installer package build --ubuntu-modules` (a subprocess) into a package. One guest
boot with `module.sig_enforce=1` then offers the package's modules to `finit_module`:

- each signed module is parsed as signed and refused only for its key (EKEYREJECTED,
  errno 129, "Loading of module with unavailable key is rejected");
- the same module unsigned is refused as unsigned;
- one whose signature DER is garbled is refused as a bad message (EBADMSG);
- one whose signed content was altered (one byte of the module body, the signature kept) is
  refused exactly as the intact ones are: EKEYREJECTED, "unavailable key". The signature
  names its signer by issuer and serial and carries no certificate (sign-file's `-nocerts`),
  so `pkcs7_verify` finds no signer key, digests the content and returns 0 without comparing
  (crypto/asymmetric_keys/pkcs7_verify.c, `pkcs7_verify_one`: `if (!sinfo->signer) return
  0;`, torvalds/linux at 1a1f7f726bd8); only `pkcs7_validate_trust` could match the digest
  to the key, and it finds none (ENOKEY). Without the key the kernel cannot tell an altered
  module from an intact one; `package build --sign-cert` can, and refuses it (tested here).

Why not "accepted": the guest would have to trust the test key. Module signatures are checked
against the secondary trusted keyring (`verify_pkcs7_signature`, VERIFY_USE_SECONDARY_KEYRING),
which holds the builtin keys and only keys "vouched for by a key in either the built-in or
the secondary system keyrings" (certs/system_keyring.c,
`restrict_link_by_builtin_and_secondary_trusted`, torvalds/linux at 0f75ef6a9cff); keys
added with keyctl must be signed by a resident key (Documentation/admin-guide/
module-signing.rst, "Public keys in the kernel", torvalds/linux at 03c11eb3b16d). The builtin
keys are compiled into Debian's kernel (its config has no CONFIG_SYSTEM_EXTRA_CERTIFICATE slot
for scripts/insert-sys-cert), and the machine keyring takes MOK keys only when shim's UEFI
mokvar table has MokListTrustedRT (security/integrity/platform_certs/machine_keyring.c,
`uefi_check_trust_mok_keys`, torvalds/linux at 4cb1ed94f180). So a test key is trusted only
by rebuilding the kernel or by booting through shim with an enrolled MOK; this tier boots
Debian's signed kernel directly. "Unavailable key" is the proof that the structure parsed;
that a vendor-signed module loads under enforcement is shown by tests/kernel/
test_load_kernel.py's TestSignedByPackageBuild (Debian's own signed module, re-joined with its
signature by `package build --signatures`, in its sig_enforce boot).

The guest runs scenarios.py's `raw_loads` group; this file boots once (~15-30 s warm).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cosbucket import sign_module
from signing_keys import KeyPair, make_key, modinfo, openssl_verify
from ubuntudebs import MODULE_DIR, modules_deb, modules_package_name

from installer.packages.builder.modsig import MARKER, strip_signature
from installer.packages.manifest import parse_manifest

from . import assets, signed
from .assets import Kernel
from .conftest import REPO

pytestmark = pytest.mark.timeout(1200)  # cold: the open test modules compile first

VERSION = "535.261.03"
ORDER = signed.MODULES
TAMPER = (f"version={VERSION}".encode(), b"version=535.261.04")  # one byte of .modinfo


def package_build(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process (as a user runs it), bounded."""
    return subprocess.run([sys.executable, "-m", "installer", "package", "build", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


@dataclass(frozen=True)
class Lrm:
    key: KeyPair
    signed: dict[str, bytes]  # <module>.ko -> the signed bytes packed into the .deb
    deb: Path
    package: Path  # what `package build --ubuntu-modules` made


@pytest.fixture(scope="module")
def open_modules(kernel: Kernel) -> Path:
    """The tier's stand-in nvidia*.ko (open flavour) built against the real headers."""
    return assets.build_test_modules(kernel, VERSION, flavour="open")


@pytest.fixture(scope="module")
def lrm(kernel: Kernel, open_modules: Path, tmp_path_factory: pytest.TempPathFactory) -> Lrm:
    """The signed modules in Canonical's .deb, and the package the real CLI made of it."""
    base = tmp_path_factory.mktemp("lrm")
    pair = make_key(base / "keys", "lrm test")
    modules = {name: sign_module((open_modules / name).read_bytes(), pair.key, pair.cert,
                                 base / "sign") for name in ORDER}
    deb = modules_deb(base, kernel.release, modules)
    out = base / "pkg"
    done = package_build(f"--ubuntu-modules={deb}", f"--out-dir={out}",
                         f"--sign-cert={pair.cert}", f"--kernel-release={kernel.release}")
    assert done.returncode == 0, done.stderr
    assert f"built {VERSION} open for {kernel.release}" in done.stdout
    return Lrm(pair, modules, deb, out)


def tampered(signed_module: bytes) -> bytes:
    """One byte of the module body changed, the signature left as it was."""
    body, tail = strip_signature(signed_module)
    assert body.count(TAMPER[0]) == 1
    return body.replace(*TAMPER) + tail


@pytest.fixture(scope="module")
def enforced(kernel: Kernel, open_modules: Path, lrm: Lrm,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One boot with module.sig_enforce=1: the package's modules, then the controls."""
    out = tmp_path_factory.mktemp("guest-lrm-sig")
    mods = out / "modules"  # inside the shared out dir: visible in the guest for certain
    mods.mkdir()
    cases = []
    for name in ORDER:
        (mods / name).write_bytes((lrm.package / "modules" / name).read_bytes())
        cases.append((name, str(mods / name)))
    nvidia = (lrm.package / "modules" / "nvidia.ko").read_bytes()
    (mods / "unsigned-nvidia.ko").write_bytes((open_modules / "nvidia.ko").read_bytes())
    cases.append(("unsigned", str(mods / "unsigned-nvidia.ko")))
    unsigned, tail = strip_signature(nvidia)
    (mods / "garbled-nvidia.ko").write_bytes(unsigned + b"\x31" + tail[1:])  # DER tag broken
    cases.append(("garbled", str(mods / "garbled-nvidia.ko")))
    (mods / "tampered-nvidia.ko").write_bytes(tampered(nvidia))
    cases.append(("tampered", str(mods / "tampered-nvidia.ko")))
    return signed.enforced_loads(kernel, out, cases)


def test_package_keeps_the_debs_modules_as_vendor_signed(
        kernel: Kernel, open_modules: Path, lrm: Lrm, tmp_path: Path) -> None:
    """No boot: the .deb's path is Canonical's, the package holds its modules byte for byte
    (the headers-built module plus a signature openssl and kmod read) and records them as a
    vendor's attached signatures by the test key."""
    listing = subprocess.run(["dpkg-deb", "--contents", str(lrm.deb)], capture_output=True,
                             text=True, check=True).stdout
    for name in ORDER:
        assert f"./lib/modules/{kernel.release}/kernel/{MODULE_DIR}/{name}\n" in listing
    assert lrm.deb.name.startswith(modules_package_name(kernel.release) + "_")
    manifest = parse_manifest((lrm.package / "manifest.json").read_bytes())
    assert (manifest.driver_version, manifest.kernel_release, manifest.flavour) == (
        VERSION, kernel.release, "open")
    assert [m.name for m in manifest.modules] == ["nvidia", "nvidia_uvm", "nvidia_modeset",
                                                  "nvidia_drm"]
    signers = {s.file: s for s in manifest.signatures}
    assert sorted(signers) == sorted(f"modules/{name}" for name in ORDER)
    for name in ORDER:
        data = (lrm.package / "modules" / name).read_bytes()
        assert data == lrm.signed[name] and data.endswith(MARKER)
        assert strip_signature(data)[0] == (open_modules / name).read_bytes()
        entry = signers[f"modules/{name}"]
        assert (entry.origin, entry.subject) == ("attached", lrm.key.subject)
        done = openssl_verify(lrm.package / "modules" / name, lrm.key.cert, tmp_path / name)
        assert done.returncode == 0, done.stderr
        info = modinfo(lrm.package / "modules" / name)
        assert (info["sig_id"], info["signer"]) == ("PKCS#7", "lrm test module signing key")
        assert info["vermagic"].startswith(kernel.release + " ")


def test_package_build_refuses_the_altered_module(kernel: Kernel, lrm: Lrm,
                                                  tmp_path: Path) -> None:
    """What the kernel cannot tell without the key, `--sign-cert` does: one line, exit 2."""
    modules = {**lrm.signed, "nvidia.ko": tampered(lrm.signed["nvidia.ko"])}
    deb = modules_deb(tmp_path, kernel.release, modules)
    done = package_build(f"--ubuntu-modules={deb}", f"--out-dir={tmp_path / 'pkg'}",
                         f"--sign-cert={lrm.key.cert}")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "nvidia.ko" in lines[0] and "does not verify against --sign-cert" in lines[0]
    assert not (tmp_path / "pkg").exists()


class TestEnforcedBoot(signed.EnforcedBootChecks):
    """The one boot: signed.EnforcedBootChecks."""


def test_altered_content_is_refused_for_the_key_as_an_intact_one(
        enforced: dict[str, Any]) -> None:
    """No certificate in the signature, no trusted key: the kernel never compares the digest,
    so one changed byte of the body is refused for the key too (see the module docstring)."""
    case = enforced["cases"]["tampered"]
    signed.assert_rejected_for_key(case)
    assert _words(case) == _words(enforced["cases"]["nvidia.ko"])


def _words(case: dict[str, Any]) -> list[str]:
    """The kernel's lines for one load, without their timestamps."""
    return [line.split("] ", 1)[-1] for line in case["dmesg"]]
