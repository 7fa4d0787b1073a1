"""Canonical's signed precompiled NVIDIA modules (Ubuntu's linux-restricted-modules) as input.

Canonical builds NVIDIA's modules for each Ubuntu kernel and signs them with the key that
kernel trusts, so a node under Secure Boot loads them with no key of ours. Their .debs put
each module at `lib/modules/<kernel>/kernel/nvidia-<branch>[srv][-open]/<module>.ko`
(docs/building-packages.md, "Ubuntu: Canonical's signed modules", cites the sources). This
reads such .debs (`package build --ubuntu-modules DEB`), keeps every module byte for byte,
and refuses one that is not built for the package's kernel (its `lib/modules/<kernel>`
directory, the `-<kernel>` end of the package name, `--kernel-release`, and its vermagic
must all agree) or does not carry a well-formed module signature (verified against
`--sign-cert` when given). The modules go into the package as a vendor's signed modules
(manifest `signatures`, origin `attached`), never re-signed; the load stage checks them as
it checks any signed module and the node's kernel verifies Canonical's signature.

Canonical's proprietary flavour ships unlinked objects (`bits/*.o`, a `BUILD` script) and
detached `bits/*.ko.sig` signatures that are linked into modules on the node; that layout is
refused with its own line (linking on the node is not done here).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from installer.packages.builder.inputs import (
    ModuleInfo,
    PackageBuildError,
    deb_control,
    extract_deb,
)
from installer.packages.builder.modsig import (
    CmsSignature,
    SignatureFormatError,
    parse_tail,
    strip_signature,
)
from installer.packages.builder.signing import SigningOptions, key_id, load_cert, verify
from installer.packages.signatures import SignatureEntry

PACKAGE_RE = re.compile(r"^linux-(?:modules|objects)-nvidia-(?P<branch>\d+)(?P<server>-server)?"
                        r"(?P<open>-open)?-(?P<kernel>\d[A-Za-z0-9._+~-]*)$")
MODULE_DIR_RE = re.compile(r"^nvidia-\d+(?:srv)?(?:-open)?$")
_MODULE_ROOTS = ("lib/modules", "usr/lib/modules")  # usr-merged trees move /lib to /usr/lib
_REMEDY = ("give Canonical's linux-modules-nvidia-<branch>[-server]-open-<kernel> .deb for "
           "the node's kernel (its modules linked and signed)")


@dataclass(frozen=True)
class UbuntuModules:
    """The modules taken from the .debs (flat, byte for byte) and the kernel they are for."""

    modules_dir: Path
    kernel_release: str
    origin: dict[str, str]  # module file name -> the .deb it came from


def _fail(message: str, remedy: str | None = None) -> PackageBuildError:
    return PackageBuildError(message, remedy=remedy)


def check_ubuntu_request(modules_dir: Path | None, nvidia_source: Path | None,
                         signing: SigningOptions) -> None:
    """The flags that cannot go with Canonical's modules (checked before anything is read)."""
    if modules_dir is not None or nvidia_source is not None:
        raise _fail("--ubuntu-modules are the package's modules: give no --modules or "
                    "--nvidia-source with them")
    if signing.key is not None or signing.signatures is not None or signing.resign:
        raise _fail("--ubuntu-modules are already signed by Canonical (the key Ubuntu's "
                    "kernels trust): give no --sign-key, --signatures or --resign",
                    remedy="drop the signing flags (--sign-cert alone verifies Canonical's "
                    "signatures against that certificate)")


def unpack(debs: tuple[Path, ...], work: Path, kernel_release: str | None) -> UbuntuModules:
    """Every module of the .debs copied flat into `work/modules`; refusals name the .deb."""
    out = work / "modules"
    out.mkdir(parents=True)
    kernels: set[str] = set()
    origin: dict[str, str] = {}
    for number, deb in enumerate(debs):
        kernel = _package_kernel(deb)
        tree = work / f"deb{number}"
        extract_deb(deb, tree)  # `..`, absolute names and links out are refused there
        for module in _module_files(deb, tree, kernel):
            if module.name in origin:
                raise _fail(f"two modules named {module.name} ({origin[module.name]} and "
                            f"{deb.name})", remedy="give one flavour's package per build")
            shutil.copyfile(module, out / module.name)
            origin[module.name] = deb.name
        kernels.add(kernel)
        shutil.rmtree(tree)
    if kernel_release is not None:
        kernels.discard(kernel_release)
        if kernels:
            raise _fail(f"--ubuntu-modules are for kernel {', '.join(sorted(kernels))}, not "
                        f"--kernel-release {kernel_release}", remedy=_REMEDY)
        kernels.add(kernel_release)
    if len(kernels) != 1:
        raise _fail(f"--ubuntu-modules are for several kernels ({', '.join(sorted(kernels))})",
                    remedy="build one package per kernel")
    return UbuntuModules(out, kernels.pop(), origin)


def _package_kernel(deb: Path) -> str:
    """The kernel release at the end of the package's name (linux-modules-nvidia-...-K)."""
    name = deb_control(deb).get("Package", "")
    match = PACKAGE_RE.match(name)
    if match is None:
        raise _fail(f"{deb.name} is not one of Canonical's NVIDIA module packages (Package: "
                    f"{name[:80] or 'none'})", remedy=_REMEDY)
    return match["kernel"]


def _module_files(deb: Path, tree: Path, kernel: str) -> list[Path]:
    """The package's `.ko` files: all under `<root>/<kernel>/kernel/nvidia-*/`, plain files."""
    found: list[Path] = []
    for root in (tree / r for r in _MODULE_ROOTS):
        if not root.is_dir() or os.path.realpath(root) != os.path.join(os.path.realpath(tree),
                                                                       root.relative_to(tree)):
            continue  # reached through a link (`lib -> usr/lib`): the other root has them
        for path in sorted(root.rglob("*")):
            if path.name.endswith((".ko", ".ko.xz", ".ko.gz", ".ko.zst")):
                found.append(_check_place(deb, tree, root, path, kernel))
    if found:
        return found
    signatures = [p for r in _MODULE_ROOTS for p in (tree / r).glob("*/kernel/*/bits/*")
                  if p.name.endswith(".ko.sig") or p.name == "BUILD"]
    if signatures:
        raise _fail(f"{deb.name} holds unlinked objects or detached signatures "
                    f"({signatures[0].relative_to(tree)}), which are linked into modules on "
                    "the node; that is not supported", remedy=_REMEDY)
    raise _fail(f"{deb.name} holds no kernel modules under lib/modules/{kernel}/kernel/nvidia-*/",
                remedy=_REMEDY)


def _check_place(deb: Path, tree: Path, root: Path, path: Path, kernel: str) -> Path:
    parts = PurePosixPath(path.relative_to(root).as_posix()).parts
    where = f"{deb.name}: {path.relative_to(tree)}"
    if len(parts) != 4 or parts[1] != "kernel" or not MODULE_DIR_RE.match(parts[2]):
        raise _fail(f"{where} is not at <kernel>/kernel/nvidia-<branch>/<module>.ko",
                    remedy=_REMEDY)
    if parts[0] != kernel:
        raise _fail(f"{where} is for kernel {parts[0]}, but the package is named for {kernel}",
                    remedy=_REMEDY)
    if path.is_symlink() or not path.is_file():
        raise _fail(f"{where} is not a plain file", remedy=_REMEDY)
    if not path.name.endswith(".ko"):
        raise _fail(f"{where} is compressed; Canonical's signed modules are plain .ko files",
                    remedy=_REMEDY)
    return path


def check_modules(found: UbuntuModules, modules: list[ModuleInfo], cert_path: Path | None
                  ) -> tuple[SignatureEntry, ...]:
    """Each module built for the kernel (vermagic) and signed (verified with `cert_path`
    when given): what the manifest records about its signer."""
    cert = load_cert(cert_path) if cert_path is not None else None
    entries = [_signed(found, module, cert) for module in modules]
    return tuple(sorted(entries, key=lambda e: e.file))


def _signed(found: UbuntuModules, module: ModuleInfo, cert: Any) -> SignatureEntry:
    where = f"module {module.path.name} of {found.origin.get(module.path.name, '?')}"
    if module.kernel_release != found.kernel_release:
        raise _fail(f"{where} is built for kernel {module.kernel_release or 'none'} (vermagic)"
                    f", not {found.kernel_release}", remedy=_REMEDY)
    try:
        body, tail = strip_signature(module.path.read_bytes())
        if not tail:
            raise _fail(f"{where} carries no module signature", remedy=_REMEDY)
        sig = parse_tail(tail)
    except SignatureFormatError as exc:
        raise _fail(f"{where} has a broken signature: {exc}", remedy=_REMEDY) from None
    if cert is not None:
        try:
            verify(sig, body, cert)
        except SignatureFormatError as exc:
            raise _fail(f"{where}: its signature does not verify against --sign-cert: {exc}",
                        remedy="give the certificate of the key that signed these modules "
                        "(the one the node's kernel trusts), and Canonical's unmodified "
                        ".deb") from None
    return _entry(module, sig, cert)


def _entry(module: ModuleInfo, sig: CmsSignature, cert: Any) -> SignatureEntry:
    """Who signed the module: the certificate's names when given, else what the signature
    itself names (issuer and serial, or key id)."""
    serial = f"{sig.serial:x}" if sig.serial is not None and sig.serial >= 0 else None
    return SignatureEntry(
        f"modules/{module.path.name}", "attached", sig.digest,
        cert.issuer.rfc4514_string() if cert is not None else sig.issuer_text, serial,
        cert.subject.rfc4514_string() if cert is not None else None,
        key_id(cert).hex() if cert is not None else (sig.key_id.hex() if sig.key_id else None))
