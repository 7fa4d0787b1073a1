"""Compile and sign in one command: `package build --nvidia-source ... --kernel-headers ...
--sign-key K --sign-cert C`, for one kernel, a matrix of kernels and `--flavour both`.

The CLI runs in a subprocess (real exit code, real stderr). The header trees are
`nvsources.fake_kbuild` stand-ins whose `make modules` really runs gcc (an ELF object with
a real `.modinfo` per module, and a line in `jobs.log` per compile job), the keys are
throw-away ones made by the real `openssl req -x509`, and every signature is checked by the
real `openssl cms -verify` against the unsigned module it was made for. Nothing boots: the
real-kernel tier (tests/kernel/test_compile_sign_kernel.py) has the kernel parse them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nvsources import fake_kbuild, mini_source, proprietary_source
from signing_keys import KeyPair, make_key, openssl_verify

from installer.packages.builder.modsig import MARKER, strip_signature
from installer.packages.manifest import parse_manifest

CLI = (sys.executable, "-m", "installer")
VERSION = "535.261.03"
FIRST, SECOND = "6.1.0-57-amd64", "6.1.0-56-amd64"
MODULES = ["nvidia-drm.ko", "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "package", "build", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def _errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error(")]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    base = tmp_path_factory.mktemp("keys")
    return {"rsa": make_key(base, "rsa"), "other": make_key(base, "other")}


def _sign_args(pair: KeyPair, cert: Path | None = None) -> list[str]:
    return [f"--sign-key={pair.key}", f"--sign-cert={cert or pair.cert}"]


def _check_signed(package: Path, pair: KeyPair, work: Path) -> dict[str, bytes]:
    """Every module of the package carries a signature the real openssl verifies against
    the module's unsigned bytes with `pair`'s certificate; the manifest lists each signer.
    Returns the unsigned modules by name."""
    manifest = parse_manifest((package / "manifest.json").read_bytes())
    names = sorted(p.name for p in (package / "modules").iterdir())
    assert names == MODULES
    assert sorted(e.file for e in manifest.signatures) == [f"modules/{n}" for n in names]
    assert {e.origin for e in manifest.signatures} == {"signed"}
    assert {e.subject for e in manifest.signatures} == {pair.subject}
    unsigned = {}
    for name in names:
        data = (package / "modules" / name).read_bytes()
        assert data.endswith(MARKER), name
        done = openssl_verify(package / "modules" / name, pair.cert, work / name)
        assert done.returncode == 0, (name, done.stderr)
        assert "Verification successful" in done.stderr, done.stderr
        unsigned[name] = strip_signature(data)[0]
    return unsigned


def test_one_kernel_compiled_then_signed(tmp_path: Path, keys: dict[str, KeyPair]) -> None:
    """The signed modules are the compiled ones plus a signature: the same command without
    signing gives exactly the unsigned bytes (the compile is reproducible)."""
    headers = fake_kbuild(tmp_path / "h57", FIRST)
    source = proprietary_source(tmp_path / "kernel")
    signed, plain = tmp_path / "signed", tmp_path / "plain"
    done = _cli(f"--nvidia-source={source}", f"--kernel-headers={headers}",
                f"--out-dir={signed}", *_sign_args(keys["rsa"]))
    assert done.returncode == 0, done.stderr[-2000:]
    unsigned = _check_signed(signed, keys["rsa"], tmp_path / "verify")
    done = _cli(f"--nvidia-source={source}", f"--kernel-headers={headers}",
                f"--out-dir={plain}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert unsigned == {p.name: p.read_bytes() for p in (plain / "modules").iterdir()}
    assert not parse_manifest((plain / "manifest.json").read_bytes()).signatures
    manifest = parse_manifest((signed / "manifest.json").read_bytes())
    assert (manifest.kernel_release, manifest.driver_version, manifest.flavour) == (
        FIRST, VERSION, "proprietary")
    assert manifest.provenance is not None  # still a compiled package


def test_two_kernels_each_signed(tmp_path: Path, keys: dict[str, KeyPair]) -> None:
    repo = tmp_path / "repo"
    done = _cli(f"--nvidia-source={proprietary_source(tmp_path / 'kernel')}",
                f"--kernel-headers={fake_kbuild(tmp_path / 'h57', FIRST)}",
                f"--kernel-headers={fake_kbuild(tmp_path / 'h56', SECOND)}", "--jobs=2",
                f"--repo={repo}", *_sign_args(keys["rsa"]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("built 2 of 2 packages")
    packages = json.loads((repo / "index.json").read_text())["packages"]
    assert sorted(p["kernel_release"] for p in packages) == [SECOND, FIRST]
    for release in (FIRST, SECOND):
        package = repo / release / VERSION / "proprietary"
        _check_signed(package, keys["rsa"], tmp_path / "verify" / release)
        assert parse_manifest((package / "manifest.json").read_bytes()).kernel_release == (
            release)


def test_both_flavours_each_signed(tmp_path: Path, keys: dict[str, KeyPair]) -> None:
    """An extracted .run (kernel/ proprietary, kernel-open/ open), `--flavour both`."""
    run_tree = tmp_path / f"NVIDIA-Linux-x86_64-{VERSION}"
    proprietary_source(run_tree / "kernel")
    mini_source(run_tree / "kernel-open")
    repo = tmp_path / "repo"
    headers = fake_kbuild(tmp_path / "h", FIRST)
    done = _cli(f"--nvidia-source={run_tree}", f"--kernel-headers={headers}", "--flavour=both",
                f"--repo={repo}", *_sign_args(keys["rsa"]), "--sign-hash=sha384")
    assert done.returncode == 0, done.stderr[-2000:]
    unsigned = {}
    for flavour in ("open", "proprietary"):
        package = repo / FIRST / VERSION / flavour
        unsigned[flavour] = _check_signed(package, keys["rsa"], tmp_path / "verify" / flavour)
        manifest = parse_manifest((package / "manifest.json").read_bytes())
        assert manifest.flavour == flavour
        assert {e.hash for e in manifest.signatures} == {"sha384"}
    assert unsigned["open"] != unsigned["proprietary"]  # each flavour its own modules


def test_vendor_signatures_attached_to_compiled_modules(tmp_path: Path,
                                                        keys: dict[str, KeyPair]) -> None:
    """A vendor compiles reproducibly and ships detached tails: `--signatures` attaches them
    to what this command compiles, giving the vendor's signed modules byte for byte."""
    headers = fake_kbuild(tmp_path / "h57", FIRST)
    source = proprietary_source(tmp_path / "kernel")
    vendor, attached, sigs = tmp_path / "vendor", tmp_path / "attached", tmp_path / "sigs"
    done = _cli(f"--nvidia-source={source}", f"--kernel-headers={headers}",
                f"--out-dir={vendor}", *_sign_args(keys["rsa"]))
    assert done.returncode == 0, done.stderr[-2000:]
    sigs.mkdir()
    for module in (vendor / "modules").iterdir():
        (sigs / f"{module.name}.sig").write_bytes(strip_signature(module.read_bytes())[1])
    done = _cli(f"--nvidia-source={source}", f"--kernel-headers={headers}",
                f"--out-dir={attached}", f"--signatures={sigs}",
                f"--sign-cert={keys['rsa'].cert}")
    assert done.returncode == 0, done.stderr[-2000:]
    for module in (vendor / "modules").iterdir():
        assert (attached / "modules" / module.name).read_bytes() == module.read_bytes()
    manifest = parse_manifest((attached / "manifest.json").read_bytes())
    assert {e.origin for e in manifest.signatures} == {"attached"}
    assert len(manifest.signatures) == len(MODULES)


@pytest.mark.parametrize("kernels", [1, 2])
def test_wrong_key_refused_before_anything_compiles(tmp_path: Path, keys: dict[str, KeyPair],
                                                    kernels: int) -> None:
    """A key that does not match the certificate is told at once, not after the compile:
    no compile job ran (the stand-in headers log each one), nothing is published."""
    trees = [fake_kbuild(tmp_path / f"h{n}", release)
             for n, release in enumerate((FIRST, SECOND)[:kernels])]
    where = f"--repo={tmp_path / 'repo'}" if kernels > 1 else f"--out-dir={tmp_path / 'out'}"
    done = _cli(f"--nvidia-source={proprietary_source(tmp_path / 'kernel')}",
                *(f"--kernel-headers={t}" for t in trees), where,
                *_sign_args(keys["rsa"], keys["other"].cert))
    assert done.returncode == 2, done.stderr[-2000:]
    errors = _errors(done)
    assert len(errors) == 1 and "does not match --sign-cert" in errors[0], done.stderr
    assert not any((t / "jobs.log").exists() for t in trees)
    assert not (tmp_path / "repo").exists() and not (tmp_path / "out").exists()


MISSING = {
    # (extra args, what the line must say): without headers nothing is compiled here
    "source-package": (["--tree={tree}"], "--sign-key: a source package has no modules to "
                       "sign (nodes compile them); fix: give --kernel-headers"),
    "user-mode-only": (["--tree={tree}"], "--sign-key: there are no modules to sign; fix: "
                       "give --modules (built modules), or --nvidia-source with "
                       "--kernel-headers"),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_nothing_to_sign_says_what_to_add(tmp_path: Path, keys: dict[str, KeyPair],
                                          case: str) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    extra, wanted = MISSING[case]
    args = [a.format(tree=tree) for a in extra]
    if case == "source-package":
        args.append(f"--nvidia-source={proprietary_source(tmp_path / 'kernel')}")
    done = _cli(*args, f"--out-dir={tmp_path / 'out'}", *_sign_args(keys["rsa"]))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert wanted in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_no_user_mode_inputs_named_not_modules(tmp_path: Path, keys: dict[str, KeyPair]
                                               ) -> None:
    """Sources without headers and without --deb/--tree/--run: the missing user-mode inputs
    are what the line names (the adversarial suite runs this in its sandbox too)."""
    done = _cli(f"--nvidia-source={proprietary_source(tmp_path / 'kernel')}",
                f"--out-dir={tmp_path / 'out'}", *_sign_args(keys["rsa"]))
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "a source package needs the user-mode files too, and no --deb, --run or --tree " \
           "is given" in lines[0]
    assert "--modules" not in lines[0]
    assert not (tmp_path / "out").exists()
