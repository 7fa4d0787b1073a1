"""`package build --sign-key/--sign-cert` and `--signatures`: the kernel's module signature format.

Keys and certificates are throw-away ones made by the real `openssl req -x509`; the modules
are ELF objects with a real `.modinfo` (as in test_packagebuild); every signature the product
writes is checked by the real `openssl cms -verify` and kmod's `modinfo`. The real-kernel tier
(tests/kernel/test_signing_kernel.py) does the same on NVIDIA's real modules and has the
kernel itself parse the signatures.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from signing_keys import KeyPair, cert_field, make_key, modinfo, openssl_verify

from installer.cli import cli
from installer.packages.builder.modsig import TAIL_OVERHEAD, TRAILER, strip_signature
from installer.packages.manifest import parse_manifest
from tests.host.test_packagebuild import make_modules

NAMES = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko", "nvidia-peermem.ko")


def build(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["package", "build", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    base = tmp_path_factory.mktemp("keys")
    return {"rsa": make_key(base, "rsa"), "other": make_key(base, "other"),
            "ec": make_key(base, "ec", newkey="ec", extra=("-pkeyopt",
                                                          "ec_paramgen_curve:P-384")),
            "encrypted": make_key(base, "encrypted", encrypt="s3cret"),
            "rsa1024": make_key(base, "rsa1024", newkey="rsa:1024"),
            "ed25519": make_key(base, "ed25519", newkey="ed25519")}


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_modules(tmp_path_factory.mktemp("modules"))


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, KeyPair],
           modules: Path) -> Path:
    """A package whose modules the product signed with the throw-away RSA key."""
    out = tmp_path_factory.mktemp("signed") / "pkg"
    code, _, err = build([f"--modules={modules}", f"--out-dir={out}",
                          f"--sign-key={keys['rsa'].key}", f"--sign-cert={keys['rsa'].cert}"])
    assert code == 0, err
    return out


def detach(package: Path, target: Path) -> tuple[Path, Path]:
    """Split a package's signed modules into unsigned modules and `<module>.ko.sig` tails."""
    unsigned, sigs = target / "unsigned", target / "sigs"
    unsigned.mkdir(parents=True)
    sigs.mkdir()
    for module in (package / "modules").iterdir():
        body, tail = strip_signature(module.read_bytes())
        (unsigned / module.name).write_bytes(body)
        (sigs / f"{module.name}.sig").write_bytes(tail)
    return unsigned, sigs


class TestSign:
    def test_openssl_and_modinfo_accept_every_module(self, signed: Path, modules: Path,
                                                     keys: dict[str, KeyPair],
                                                     tmp_path: Path) -> None:
        manifest = parse_manifest((signed / "manifest.json").read_bytes())
        serial = cert_field(keys["rsa"].cert, "-serial").split("=")[1].lower().lstrip("0")
        ski = cert_field(keys["rsa"].cert, "-ext", "subjectKeyIdentifier").splitlines()[-1]
        assert sorted(e.file for e in manifest.signatures) == sorted(
            f"modules/{n}" for n in NAMES)
        for name in NAMES:
            module = signed / "modules" / name
            body, tail = strip_signature(module.read_bytes())
            assert body == (modules / name).read_bytes()  # the module itself is untouched
            algo_hash_id = TRAILER.unpack_from(tail, len(tail) - TAIL_OVERHEAD)[:5]
            assert algo_hash_id == (0, 0, 2, 0, 0)
            done = openssl_verify(module, keys["rsa"].cert, tmp_path / name)
            assert done.returncode == 0, done.stderr
            info = modinfo(module)
            assert (info["sig_id"], info["signer"], info["sig_hashalgo"]) == (
                "PKCS#7", "rsa module signing key", "sha256")
            assert info["sig_key"].replace(":", "").lower().lstrip("0") == serial
            entry = next(e for e in manifest.signatures if e.file == f"modules/{name}")
            assert (entry.origin, entry.hash, entry.subject, entry.issuer) == (
                "signed", "sha256", keys["rsa"].subject, keys["rsa"].subject)
            assert entry.serial == serial
            assert entry.key_id == ski.strip().replace(":", "").lower()

    def test_ecdsa_p384_with_sha384(self, keys: dict[str, KeyPair], modules: Path,
                                    tmp_path: Path) -> None:
        out = tmp_path / "pkg"
        code, _, err = build([f"--modules={modules}", f"--out-dir={out}", "--sign-hash=sha384",
                              f"--sign-key={keys['ec'].key}", f"--sign-cert={keys['ec'].cert}"])
        assert code == 0, err
        module = out / "modules" / "nvidia.ko"
        done = openssl_verify(module, keys["ec"].cert, tmp_path / "v")
        assert done.returncode == 0, done.stderr
        assert modinfo(module)["sig_hashalgo"] == "sha384"
        assert openssl_verify(module, keys["rsa"].cert, tmp_path / "w").returncode != 0

    def test_encrypted_key_with_kbuild_sign_pin(self, keys: dict[str, KeyPair], modules: Path,
                                                tmp_path: Path) -> None:
        out = tmp_path / "pkg"
        code, _, err = build([f"--modules={modules}", f"--out-dir={out}",
                              f"--sign-key={keys['encrypted'].key}",
                              f"--sign-cert={keys['encrypted'].cert}"],
                             env={"KBUILD_SIGN_PIN": "s3cret"})
        assert code == 0, err
        done = openssl_verify(out / "modules" / "nvidia.ko", keys["encrypted"].cert, tmp_path)
        assert done.returncode == 0, done.stderr

    def test_resign_replaces_the_signature(self, signed: Path, keys: dict[str, KeyPair],
                                           modules: Path, tmp_path: Path) -> None:
        out = tmp_path / "pkg"
        code, _, err = build([f"--modules={signed / 'modules'}", f"--out-dir={out}",
                              f"--sign-key={keys['other'].key}",
                              f"--sign-cert={keys['other'].cert}", "--resign"])
        assert code == 0, err
        module = out / "modules" / "nvidia.ko"
        assert strip_signature(module.read_bytes())[0] == (modules / "nvidia.ko").read_bytes()
        assert openssl_verify(module, keys["other"].cert, tmp_path / "v").returncode == 0
        assert module.read_bytes().count(b"~Module signature appended~") == 1

    def test_same_inputs_same_digest(self, keys: dict[str, KeyPair], modules: Path,
                                     tmp_path: Path) -> None:
        """RSA PKCS#1 v1.5 with no signing time is deterministic: builds stay reproducible."""
        digests = []
        for name in ("one", "two"):
            code, out, err = build([f"--modules={modules}", f"--out-dir={tmp_path / name}",
                                    f"--sign-key={keys['rsa'].key}",
                                    f"--sign-cert={keys['rsa'].cert}", "--output=json"])
            assert code == 0, err
            digests.append(json.loads(out)["digest"])
        assert digests[0] == digests[1]


class TestAttach:
    def test_detached_tails_reproduce_the_signed_modules(self, signed: Path,
                                                         keys: dict[str, KeyPair],
                                                         tmp_path: Path) -> None:
        unsigned, sigs = detach(signed, tmp_path)
        for with_cert in ([], [f"--sign-cert={keys['rsa'].cert}"]):
            out = tmp_path / f"pkg{len(with_cert)}"
            code, _, err = build([f"--modules={unsigned}", f"--signatures={sigs}",
                                  f"--out-dir={out}", *with_cert])
            assert code == 0, err
            for name in NAMES:
                assert (out / "modules" / name).read_bytes() == (
                    signed / "modules" / name).read_bytes()
            manifest = parse_manifest((out / "manifest.json").read_bytes())
            entry = manifest.signatures[0]
            assert (entry.origin, entry.issuer) == ("attached", keys["rsa"].subject)
            assert entry.subject == (keys["rsa"].subject if with_cert else None)


def _edit_tail(sigs: Path, edit: str) -> None:
    path = sigs / "nvidia.ko.sig"
    tail = bytearray(path.read_bytes())
    trailer = len(tail) - TAIL_OVERHEAD
    if edit == "marker":
        tail[-2] ^= 0xFF
    elif edit == "id_type":
        tail[trailer + 2] = 1
    elif edit == "length":
        tail[trailer + 11] ^= 0x01
    elif edit == "der":
        tail[0] = 0x31
    elif edit == "value":
        tail[trailer - 5] ^= 0x01
    path.write_bytes(bytes(tail))


SIG_CASES = {  # edit: (words of the one-line error)
    "marker": "does not end with '~Module signature appended~'",
    "id_type": "id_type is 1, not 2",
    "length": "signature bytes, it holds",
    "der": "ContentInfo has DER tag 0x31",
    "value": "does not verify against --sign-cert: its signature value does not match",
    "extra": "is for a module the package does not have",
    "missing": "has no signature",
    "other-cert": "does not verify against --sign-cert: it names another signer",
    "signed-module": "is already signed",
}


@pytest.mark.parametrize("case", sorted(SIG_CASES))
def test_bad_signatures_refused_with_one_line_and_nothing_written(
        case: str, signed: Path, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    unsigned, sigs = detach(signed, tmp_path)
    cert = keys["other" if case == "other-cert" else "rsa"].cert
    if case == "extra":
        (sigs / "nvidia-fs.ko.sig").write_bytes((sigs / "nvidia.ko.sig").read_bytes())
    elif case == "missing":
        (sigs / "nvidia-drm.ko.sig").unlink()
    elif case == "signed-module":
        shutil.copy(signed / "modules" / "nvidia.ko", unsigned / "nvidia.ko")
    elif case != "other-cert":
        _edit_tail(sigs, case)
    out = tmp_path / "out"
    code, stdout, err = build([f"--modules={unsigned}", f"--signatures={sigs}",
                               f"--sign-cert={cert}", f"--out-dir={out}"])
    assert code == 2, (stdout, err)
    assert len(err.strip().splitlines()) == 1 and SIG_CASES[case] in err, err
    assert not out.exists()


KEY_CASES = {
    "mismatch": "does not match --sign-cert",
    "garbage": "is not a private key this can read",
    "ed25519": "the kernel verifies RSA and ECDSA module signatures only",
    "rsa1024": "is RSA 1024: use 2048 bits or more",
    "encrypted": "is encrypted and KBUILD_SIGN_PIN is not set",
    "hash": "--sign-hash 'md5' is not one of sha256, sha384, sha512",
    "no-cert": "--sign-key needs --sign-cert",
    "both": "--sign-key and --signatures both sign the modules",
    "signed-module": "is already signed",
    "bad-cert": "is not an X.509 certificate",
    "compressed": "is compressed: signatures apply to the uncompressed module",
}


@pytest.mark.parametrize("case", sorted(KEY_CASES))
def test_bad_keys_refused_with_one_line_and_nothing_written(
        case: str, keys: dict[str, KeyPair], modules: Path, signed: Path,
        tmp_path: Path) -> None:
    pair = keys.get(case, keys["rsa"])
    key, cert, extra = pair.key, pair.cert, []
    source = signed / "modules" if case == "signed-module" else modules
    if case == "compressed":
        source = tmp_path / "xz"
        source.mkdir()
        (source / "nvidia.ko.xz").write_bytes(lzma.compress((modules / "nvidia.ko").read_bytes()))
    if case == "mismatch":
        cert = keys["other"].cert
    elif case == "garbage":
        key = tmp_path / "garbage.pem"
        key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    elif case == "bad-cert":
        cert = keys["rsa"].key
    elif case == "hash":
        extra = ["--sign-hash=md5"]
    elif case == "both":
        extra = [f"--signatures={tmp_path}"]
    args = [f"--modules={source}", f"--out-dir={tmp_path / 'out'}", f"--sign-key={key}",
            *([] if case == "no-cert" else [f"--sign-cert={cert}"]), *extra]
    env = {k: v for k, v in os.environ.items() if k != "KBUILD_SIGN_PIN"}
    code, stdout, err = build(args, env=env | {"KBUILD_SIGN_PIN": ""})
    assert code == 2, (stdout, err)
    assert len(err.strip().splitlines()) == 1 and KEY_CASES[case] in err, err
    assert not (tmp_path / "out").exists()


def test_cli_exit_code_outside_the_test_runner(keys: dict[str, KeyPair], modules: Path,
                                               tmp_path: Path) -> None:
    """The installed command exits 2 with one line (not only under CliRunner)."""
    done = subprocess.run(["gpu-node-installer", "package", "build", f"--modules={modules}",
                           f"--out-dir={tmp_path / 'out'}", f"--sign-key={keys['rsa'].key}",
                           f"--sign-cert={keys['other'].cert}"],
                          capture_output=True, text=True, check=False,
                          env=os.environ | {"PATH": f"{Path(sys.executable).parent}:"
                                            f"{os.environ['PATH']}"})
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
