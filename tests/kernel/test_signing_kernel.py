"""`package build` signatures on real modules (no boot; the guest checks are in
test_load_kernel.py's TestSignedByPackageBuild, in the sig_enforce boot).

- NVIDIA's real 535.261.03 modules, built for Debian's kernel, signed by the product with a
  throw-away key: the real `openssl cms -verify` and kmod's `modinfo` accept every one;
- Debian's own signed modules: splitting off the detached tail and attaching it again with
  `package build --signatures` gives Debian's file back byte for byte, and the product's
  reader names Debian's build key as the signer, as modinfo does.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from signing_keys import make_key, modinfo, openssl_verify

from installer.cli import cli
from installer.packages.builder.modsig import parse_tail, strip_signature
from installer.packages.manifest import parse_manifest

from . import signed
from .assets import Kernel


def test_real_nvidia_modules_signed_verify(kernel: Kernel, nvidia_real: Path,
                                           tmp_path: Path) -> None:
    pair = make_key(tmp_path / "keys", "nvidia")
    out = tmp_path / "pkg"
    result = CliRunner().invoke(cli, ["package", "build", f"--modules={nvidia_real}",
                                      f"--out-dir={out}", f"--sign-key={pair.key}",
                                      f"--sign-cert={pair.cert}", "--sign-hash=sha512"])
    assert result.exit_code == 0, result.stderr
    manifest = parse_manifest((out / "manifest.json").read_bytes())
    built = {m.name for m in nvidia_real.glob("*.ko")}  # nvidia-peermem too, when compiled
    assert built >= {"nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko"}
    assert len(manifest.signatures) == len(built)
    for original in nvidia_real.glob("*.ko"):
        module = out / "modules" / original.name
        assert strip_signature(module.read_bytes())[0] == original.read_bytes()
        done = openssl_verify(module, pair.cert, tmp_path / original.name)
        assert done.returncode == 0, done.stderr
        info = modinfo(module)
        assert (info["sig_id"], info["signer"], info["sig_hashalgo"]) == (
            "PKCS#7", "nvidia module signing key", "sha512")
        assert info["vermagic"].startswith(kernel.release)


def test_debian_signature_detached_and_attached_byte_for_byte(kernel: Kernel,
                                                              tmp_path: Path) -> None:
    package, original = signed.vendor_attached(kernel, tmp_path)
    assert (package / "modules" / original.name).read_bytes() == original.read_bytes()
    entry = parse_manifest((package / "manifest.json").read_bytes()).signatures[0]
    info = modinfo(original)
    assert entry.origin == "attached" and entry.issuer == f"CN={info['signer']}"
    assert entry.serial == info["sig_key"].replace(":", "").lower().lstrip("0")
    # every Debian module with a signature splits and re-joins exactly
    checked = 0
    for path in sorted((kernel.modules_dir / "kernel" / "lib").rglob("*.ko"))[:40]:
        data = path.read_bytes()
        body, tail = strip_signature(data)
        assert body + tail == data and parse_tail(tail).digest == "sha256"
        checked += 1
    assert checked >= 10
