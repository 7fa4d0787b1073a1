"""`package build --ubuntu-modules`: Canonical's signed precompiled modules, kept as signed.

The .debs are made by the real dpkg-deb in Canonical's layout (tests/ubuntudebs.py); the
modules are signed by the real openssl as the kernel's sign-file signs, with a throw-away
key standing in for Canonical's; the user-mode files are NVIDIA's real 535 libraries and
nvidia-smi (Debian's, repacked at Ubuntu's paths). The package must hold the modules byte
for byte, record them as a vendor's signed modules, and `install` must load them on a node
that enforces module signatures with no key of ours. Every refusal is one line, exit 2.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import artifacts
import pytest
from click.testing import CliRunner
from cosbucket import firmware_bytes, sign_module
from e2e import KERNEL, events, make_scene, run_cli, standin_env
from native import build_standins
from nvsources import make_deb
from signing_keys import KeyPair, make_key, openssl_verify
from ubuntudebs import (
    MODULE_DIR,
    modules_deb,
    modules_package_name,
    objects_deb,
    signed_modules,
    user_debs,
)

from installer.cli import cli
from installer.packages.builder.modsig import TAIL_OVERHEAD, strip_signature
from installer.packages.manifest import parse_manifest

VERSION = "535.261.03"
LOAD_ORDER = ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


def build(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["package", "build", *args])
    return result.exit_code, result.stdout, result.stderr


def refused(done: tuple[int, str, str], *causes: str) -> str:
    code, out, err = done
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert out == ""
    for cause in causes:
        assert cause in lines[0], (cause, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    base = tmp_path_factory.mktemp("keys")
    return {"canonical": make_key(base, "canonical"), "other": make_key(base, "other")}


@dataclass(frozen=True)
class Inputs:
    modules: dict[str, bytes]  # <module>.ko -> its signed bytes
    deb: Path  # linux-modules-nvidia-535-server-open-<kernel>
    user: list[Path]  # libnvidia-compute, nvidia-utils, nvidia-firmware


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, KeyPair]) -> Inputs:
    """Canonical-shaped .debs: the signed modules and the user-mode packages."""
    base = tmp_path_factory.mktemp("debs")
    pair = keys["canonical"]
    modules = signed_modules(KERNEL, VERSION, pair.key, pair.cert, base)
    tree = artifacts.nvidia_tree(VERSION) / artifacts.LIB_DIR
    libraries = {stem: tree / f"{stem}.{VERSION}" for stem in ("libcuda.so", "libnvidia-ml.so")}
    smi = artifacts.nvidia_tree(VERSION) / "usr/lib/nvidia/current/nvidia-smi"
    firmware = {"gsp_ga10x.bin": firmware_bytes(VERSION, "gsp_ga10x.bin")}
    return Inputs(modules, modules_deb(base, KERNEL, modules),
                  user_debs(base, VERSION, libraries, smi, firmware))


def _args(modules_deb_path: Path, user: list[Path], out: Path, *extra: str) -> list[str]:
    return [f"--ubuntu-modules={modules_deb_path}", *(f"--deb={d}" for d in user),
            f"--out-dir={out}", *extra]


class TestAssemble:
    def test_modules_kept_byte_for_byte_as_a_vendors_signed_modules(
            self, inputs: Inputs, keys: dict[str, KeyPair], tmp_path: Path) -> None:
        out = tmp_path / "pkg"
        code, stdout, err = build(*_args(inputs.deb, inputs.user, out))
        assert code == 0, err
        assert f"built {VERSION} open for {KERNEL}" in stdout
        manifest = parse_manifest((out / "manifest.json").read_bytes())
        assert (manifest.driver_version, manifest.kernel_release, manifest.flavour) == (
            VERSION, KERNEL, "open")
        assert [m.name for m in manifest.modules] == LOAD_ORDER
        modules = inputs.modules
        for name, data in modules.items():  # nvidia-peermem shipped, not listed
            assert (out / "modules" / name).read_bytes() == data
            entry = manifest.file(f"modules/{name}")
            assert entry.sha256 == hashlib.sha256(data).hexdigest()
        signers = {s.file: s for s in manifest.signatures}
        assert sorted(signers) == sorted(f"modules/{name}" for name in modules)
        for entry in signers.values():
            assert (entry.origin, entry.hash, entry.issuer, entry.subject) == (
                "attached", "sha256", keys["canonical"].subject, None)
        check = openssl_verify(out / "modules" / "nvidia.ko", keys["canonical"].cert,
                               tmp_path / "verify")
        assert check.returncode == 0, check.stderr
        kinds = {e.path: e.kind for e in manifest.files}
        assert kinds[f"lib64/libcuda.so.{VERSION}"] == "library"
        assert kinds["bin/nvidia-smi"] == "binary"
        assert kinds[f"firmware/nvidia/{VERSION}/gsp_ga10x.bin"] == "firmware"

    def test_sign_cert_verifies_and_names_the_subject(self, inputs: Inputs,
                                                      keys: dict[str, KeyPair],
                                                      tmp_path: Path) -> None:
        out = tmp_path / "pkg"
        code, _, err = build(*_args(inputs.deb, inputs.user, out,
                                    f"--sign-cert={keys['canonical'].cert}",
                                    f"--kernel-release={KERNEL}"))
        assert code == 0, err
        manifest = parse_manifest((out / "manifest.json").read_bytes())
        assert {s.subject for s in manifest.signatures} == {keys["canonical"].subject}

    def test_same_inputs_same_digest(self, inputs: Inputs, tmp_path: Path) -> None:
        first = build(*_args(inputs.deb, inputs.user, tmp_path / "a", "--output=json"))
        second = build(*_args(inputs.deb, inputs.user, tmp_path / "b", "--output=json"))
        assert first[0] == second[0] == 0, first[2] + second[2]
        assert json.loads(first[1])["digest"] == json.loads(second[1])["digest"]


    def test_usr_merged_tree_linking_lib_to_usr_lib(self, inputs: Inputs,
                                                    tmp_path: Path) -> None:
        root = tmp_path / "root"
        target = root / "usr/lib/modules" / KERNEL / "kernel" / MODULE_DIR
        target.mkdir(parents=True)
        for name, data in inputs.modules.items():
            (target / name).write_bytes(data)
        (root / "lib").symlink_to("usr/lib")
        deb = make_deb(root, modules_package_name(KERNEL), "1.0", tmp_path)
        code, _, err = build(*_args(deb, inputs.user, tmp_path / "pkg"))
        assert code == 0, err
        manifest = parse_manifest((tmp_path / "pkg" / "manifest.json").read_bytes())
        assert [m.name for m in manifest.modules] == LOAD_ORDER


class TestRefused:
    def test_module_built_for_another_kernel(self, inputs: Inputs,
                                             keys: dict[str, KeyPair], tmp_path: Path) -> None:
        pair = keys["canonical"]
        modules = signed_modules(KERNEL, VERSION, pair.key, pair.cert, tmp_path,
                                 vermagic={"nvidia-uvm": "5.15.0-1048-gke"})
        deb = modules_deb(tmp_path, KERNEL, modules)
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg")),
                f"module nvidia-uvm.ko of {deb.name} is built for kernel 5.15.0-1048-gke "
                f"(vermagic), not {KERNEL}", "fix: give Canonical's")
        assert not (tmp_path / "pkg").exists()

    def test_kernel_release_names_another_kernel(self, inputs: Inputs,
                                                 tmp_path: Path) -> None:
        refused(build(*_args(inputs.deb, inputs.user, tmp_path / "pkg",
                             "--kernel-release=5.15.0-1050-gke")),
                f"--ubuntu-modules are for kernel {KERNEL}, not --kernel-release "
                "5.15.0-1050-gke")

    def test_unsigned_module(self, inputs: Inputs, tmp_path: Path) -> None:
        modules = dict(inputs.modules)
        modules["nvidia.ko"] = strip_signature(modules["nvidia.ko"])[0]
        deb = modules_deb(tmp_path, KERNEL, modules)
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg")),
                f"module nvidia.ko of {deb.name} carries no module signature")
        assert not (tmp_path / "pkg").exists()

    @pytest.mark.parametrize("spoil", ["length", "der"])
    def test_broken_signature(self, inputs: Inputs, tmp_path: Path,
                              spoil: str) -> None:
        modules = dict(inputs.modules)
        data = bytearray(modules["nvidia-drm.ko"])
        if spoil == "length":  # the trailer's DER length no longer fits the file
            data[-len(b"~Module signature appended~\n") - 1] ^= 0x7F
        else:  # the DER's outer tag
            body, tail = strip_signature(bytes(data))
            data = bytearray(body + b"\x31" + tail[1:])
        modules["nvidia-drm.ko"] = bytes(data)
        deb = modules_deb(tmp_path, KERNEL, modules)
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg")),
                f"module nvidia-drm.ko of {deb.name} has a broken signature")

    def test_signature_value_changed_fails_against_the_cert(
            self, inputs: Inputs, keys: dict[str, KeyPair], tmp_path: Path) -> None:
        modules = dict(inputs.modules)
        data = bytearray(modules["nvidia.ko"])
        data[-TAIL_OVERHEAD - 5] ^= 0x01  # inside the RSA signature value
        modules["nvidia.ko"] = bytes(data)
        deb = modules_deb(tmp_path, KERNEL, modules)
        args = _args(deb, inputs.user, tmp_path / "pkg")
        assert build(*args)[0] == 0  # well formed: only the certificate can tell
        refused(build(*args, "--force", f"--sign-cert={keys['canonical'].cert}"),
                f"module nvidia.ko of {deb.name}: its signature does not verify against "
                "--sign-cert", "does not match")

    def test_signed_by_another_key_fails_against_the_cert(
            self, inputs: Inputs, keys: dict[str, KeyPair], tmp_path: Path) -> None:
        modules = dict(inputs.modules)
        body = strip_signature(modules["nvidia-uvm.ko"])[0]
        modules["nvidia-uvm.ko"] = sign_module(body, keys["other"].key, keys["other"].cert,
                                               tmp_path / "sign")
        deb = modules_deb(tmp_path, KERNEL, modules)
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg",
                             f"--sign-cert={keys['canonical'].cert}")),
                "nvidia-uvm.ko", "does not verify against --sign-cert", "names another signer")

    def test_objects_to_link_on_the_node(self, inputs: Inputs, tmp_path: Path
                                         ) -> None:
        deb = objects_deb(tmp_path, KERNEL)
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg")),
                f"{deb.name} holds unlinked objects or detached signatures",
                "linked into modules on the node; that is not supported")

    def test_directory_of_another_kernel(self, inputs: Inputs, tmp_path: Path
                                         ) -> None:
        deb = modules_deb(tmp_path, KERNEL, inputs.modules,
                          directory_kernel="5.15.0-1048-gke")
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg")),
                "is for kernel 5.15.0-1048-gke, but the package is named for " + KERNEL)

    def test_not_a_restricted_modules_package(self, inputs: Inputs,
                                              tmp_path: Path) -> None:
        deb = modules_deb(tmp_path, KERNEL, inputs.modules,
                          package="nvidia-kernel-open")
        refused(build(*_args(deb, inputs.user, tmp_path / "pkg")),
                f"{deb.name} is not one of Canonical's NVIDIA module packages "
                "(Package: nvidia-kernel-open)")

    @pytest.mark.parametrize("flag", ["--sign-key", "--modules"])
    def test_flags_that_do_not_go_with_it(self, inputs: Inputs,
                                          keys: dict[str, KeyPair], tmp_path: Path,
                                          flag: str) -> None:
        extra = ([f"--sign-key={keys['other'].key}", f"--sign-cert={keys['other'].cert}"]
                 if flag == "--sign-key" else [f"--modules={tmp_path}"])
        line = refused(build(*_args(inputs.deb, inputs.user, tmp_path / "pkg", *extra)))
        assert "--ubuntu-modules" in line and flag in line


def test_install_loads_them_where_signatures_are_enforced(
        inputs: Inputs, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    """The package goes through the ordinary install path: the fake kernel enforces
    signatures (module.sig_enforce=Y) and the node has no key of ours."""
    scene = make_scene(tmp_path)
    pair = keys["canonical"]
    stems = ("nvidia", "nvidia-uvm", "nvidia-modeset")  # the sample node has no drm loaded
    modules = signed_modules(KERNEL, VERSION, pair.key, pair.cert, tmp_path, stems=stems)
    (tmp_path / "debs").mkdir()
    deb = modules_deb(tmp_path / "debs", KERNEL, modules)
    built = build_standins(tmp_path / "standins")
    user = user_debs(tmp_path / "user", VERSION,
                     {"libcuda.so": built / "libcuda.so.1",
                      "libnvidia-ml.so": built / "libnvidia-ml.so.1"}, None, {})
    code, _, err = build(f"--ubuntu-modules={deb}", *(f"--deb={d}" for d in user),
                         f"--repo={scene.repo}", "--alias=default")
    assert code == 0, err
    enforce = scene.root / "sys/module/module/parameters/sig_enforce"
    enforce.parent.mkdir(parents=True, exist_ok=True)
    enforce.write_text("Y\n")
    done = run_cli(["install", *scene.args("--mirror", f"file://{scene.repo}")],
                   standin_env(VERSION))
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = (scene.root / "proc" / "modules").read_text()
    for name in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
        assert f"{name} " in loaded, loaded
    drivers = scene.install_dir / "drivers"
    for name, data in modules.items():  # Canonical's signed modules, byte for byte
        assert (drivers / name).read_bytes() == data
    assert (scene.install_dir / ".ready.json").is_file()
    assert not [e for e in events(done.stderr) if e.get("level") == "error"]
