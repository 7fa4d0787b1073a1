"""Compile and sign in one command, and the real kernel reads the signatures.

`gpu-node-installer package build --nvidia-source ... --kernel-headers ... --sign-key K
--sign-cert C` (the CLI, in a subprocess) compiles real kernel-module sources against
Debian's real 6.1 headers .debs with the kernel's own Kbuild and gcc-12, then signs what it
compiled with a throw-away key made here by the real openssl: once for one kernel
(`--out-dir`, the single-build path) and once with `--flavour both` (`--repo`, the
many-build path: two builds sharing one make jobserver). The sources are the tier's own
module sources (tests/kernel/modules, in NVIDIA's layout by `nvsources.mini_source`; the
proprietary tree's `nvidia` declares NVIDIA's licence, as NVIDIA's does): they compile in
seconds, where NVIDIA's real 535 sources take minutes and go through the same compile and
signing code (test_signing_kernel.py signs those, compiled by the same CLI, with --modules).

Every module is checked with the real `openssl cms -verify` and kmod's `modinfo`; then one
guest boot with `module.sig_enforce=1` offers each to `finit_module` (scenarios.py's
`raw_loads`): the kernel must parse every signature and refuse it for its key (errno 129,
"Loading of module with unavailable key is rejected"), where the same compiled module
without its signature is refused as unsigned.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nvsources import mini_source
from signing_keys import KeyPair, make_key, modinfo, openssl_verify

from installer.packages.builder.modsig import MARKER, strip_signature
from installer.packages.manifest import parse_manifest

from . import assets, signed
from .assets import Kernel

pytestmark = pytest.mark.timeout(1200)
VERSION = "535.261.03"
CLI = (sys.executable, "-m", "installer")
MODULES = ("nvidia.ko", "nvidia-uvm.ko", "nvidia-modeset.ko", "nvidia-drm.ko")
PACKAGES = ("one", "both-open", "both-proprietary")


def _build(kernel: Kernel, pair: KeyPair, *args: str) -> None:
    done = subprocess.run([*CLI, "package", "build",
                           *(f"--kernel-headers={h}" for h in assets.headers_debs(kernel)),
                           "--jobs=2", f"--sign-key={pair.key}", f"--sign-cert={pair.cert}",
                           *args], capture_output=True, text=True, timeout=900, check=False,
                          env=assets.build_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"event": "modules compiled"' in done.stderr  # compiled here, not given


@pytest.fixture(scope="module")
def built(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[KeyPair, dict[str, Path]]:
    """The throw-away key, and each package's directory by name (PACKAGES)."""
    work = tmp_path_factory.mktemp("compile-sign")
    pair = make_key(work / "keys", "throwaway")
    _build(kernel, pair, f"--nvidia-source={mini_source(work / 'nvidia-src')}",
           f"--out-dir={work / 'one'}")
    run_tree = work / f"NVIDIA-Linux-x86_64-{VERSION}"
    proprietary = mini_source(run_tree / "kernel")
    nvidia_c = proprietary / "nvidia.c"
    text = nvidia_c.read_text()
    assert 'MODULE_LICENSE("GPL")' in text
    nvidia_c.write_text(text.replace('MODULE_LICENSE("GPL")', 'MODULE_LICENSE("NVIDIA")'))
    mini_source(run_tree / "kernel-open")
    _build(kernel, pair, f"--nvidia-source={run_tree}", "--flavour=both",
           f"--repo={work / 'repo'}")
    base = work / "repo" / kernel.release / VERSION
    return pair, {"one": work / "one", "both-open": base / "open",
                  "both-proprietary": base / "proprietary"}


@pytest.mark.parametrize("name", PACKAGES)
def test_compiled_modules_signed_and_verified(kernel: Kernel, name: str, tmp_path: Path,
                                              built: tuple[KeyPair, dict[str, Path]]) -> None:
    pair, packages = built
    package = packages[name]
    manifest = parse_manifest((package / "manifest.json").read_bytes())
    flavour = "proprietary" if name == "both-proprietary" else "open"
    assert (manifest.kernel_release, manifest.driver_version, manifest.flavour) == (
        kernel.release, VERSION, flavour)
    assert manifest.provenance is not None and manifest.provenance["compiler"].startswith(
        "gcc-12 (Debian 12.2.0")
    assert sorted(e.file for e in manifest.signatures) == sorted(f"modules/{m}"
                                                                 for m in MODULES)
    assert {(e.origin, e.subject) for e in manifest.signatures} == {("signed", pair.subject)}
    for module in MODULES:
        path = package / "modules" / module
        assert path.read_bytes().endswith(MARKER)
        done = openssl_verify(path, pair.cert, tmp_path / module)
        assert done.returncode == 0, done.stderr
        info = modinfo(path)
        assert (info["sig_id"], info["signer"]) == ("PKCS#7", "throwaway module signing key")
        assert info["vermagic"].startswith(kernel.release + " ")
        assert info["version"] == VERSION
    licence = modinfo(package / "modules" / "nvidia.ko")["license"]
    assert licence == ("NVIDIA" if flavour == "proprietary" else "GPL")


@pytest.fixture(scope="module")
def enforced(kernel: Kernel, built: tuple[KeyPair, dict[str, Path]],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One boot with module.sig_enforce=1: every signed module, then the unsigned control
    (the one-kernel package's nvidia.ko with its signature taken off)."""
    _, packages = built
    out = tmp_path_factory.mktemp("guest-compile-sign")
    mods = out / "modules"  # inside the shared out dir: visible in the guest for certain
    cases = []
    for name, package in packages.items():
        (mods / name).mkdir(parents=True)
        for module in MODULES:
            (mods / name / module).write_bytes((package / "modules" / module).read_bytes())
            cases.append((f"{name}/{module}", str(mods / name / module)))
    unsigned = strip_signature((packages["one"] / "modules" / "nvidia.ko").read_bytes())[0]
    (mods / "unsigned-nvidia.ko").write_bytes(unsigned)
    cases.append(("unsigned", str(mods / "unsigned-nvidia.ko")))
    return signed.enforced_loads(kernel, out, cases)


def test_guest_enforces_signatures(enforced: dict[str, Any]) -> None:
    assert enforced["sig_enforce"] == "Y"
    assert "module.sig_enforce=1" in enforced["cmdline"]
    assert len(enforced["cases"]) == len(PACKAGES) * len(MODULES) + 1


@pytest.mark.parametrize("case", [f"{p}/{m}" for p in PACKAGES for m in MODULES])
def test_kernel_parses_the_signature_and_rejects_the_key(enforced: dict[str, Any],
                                                         case: str) -> None:
    signed.assert_rejected_for_key(enforced["cases"][case])


def test_the_compiled_module_unsigned_is_rejected_as_unsigned(enforced: dict[str, Any]
                                                              ) -> None:
    signed.assert_rejected_as_unsigned(enforced["cases"]["unsigned"])
