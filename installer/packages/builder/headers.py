"""Kernel build trees for `package build --kernel-headers`: .debs, tarballs or directories.

Debian's `linux-headers-<release>` (arch) package is not usable alone: its `Makefile`
includes `/usr/src/linux-headers-<...>-common/Makefile` by absolute path and its `scripts`
link into `linux-kbuild-X.Y`. All given .debs are unpacked into one root (as dpkg would lay
them out), the Makefile's include is pointed into that root, and every tree with
`include/generated/utsrelease.h` and a `.config` becomes a `KernelTree`. The release is the
tree's `UTS_RELEASE`; a package or directory named for another release is refused.
A `kernel-devel` RPM (RHEL, Rocky, Amazon Linux 2023) holds a whole tree (`rpmheaders`).
"""

from __future__ import annotations

import dataclasses
import platform
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from installer.packages.builder.inputs import (
    PackageBuildError,
    deb_control,
    extract_deb,
    file_sha256,
)
from installer.packages.builder.rpmheaders import is_rpm, read_header, unpack_kernel_devel

_UTS_RE = re.compile(r'#define\s+UTS_RELEASE\s+"([^"]+)"')
_INCLUDE_RE = re.compile(r"^include\s+(/\S+)/Makefile\s*$", re.M)
_CONFIG_ARCHES = (("CONFIG_X86_64=y", "x86_64"), ("CONFIG_ARM64=y", "aarch64"))
# Debian's GNU triplet and the kernel's ARCH= of each arch a package can be for.
TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
KERNEL_ARCHES = {"x86_64": "x86_64", "aarch64": "arm64"}


def host_arch() -> str:
    """The arch this machine runs (`uname -m`: x86_64, aarch64)."""
    return platform.machine()


@dataclass(frozen=True)
class KernelTree:
    """One kernel's build tree: SYSOUT (config, generated headers), SYSSRC (the sources)."""

    release: str
    sysout: Path
    syssrc: Path
    arch: str | None
    cc_version_text: str
    inputs: tuple[dict[str, str], ...]

    @property
    def cross(self) -> bool:
        """Whether these headers are for another arch than this machine's (cross-compile)."""
        return self.arch is not None and self.arch != host_arch() and self.arch in TRIPLETS

    @property
    def cross_prefix(self) -> str:
        """Kbuild's CROSS_COMPILE (`aarch64-linux-gnu-`), empty for a native build."""
        return f"{TRIPLETS[self.arch]}-" if self.cross and self.arch else ""

    @property
    def compiler(self) -> str:
        """The compiler command to build with: the kernel's (`gcc-12`, from its config), as
        the cross compiler of the headers' arch when that is not this machine's (Debian's
        arm64 kernel names `gcc-12`; on x86_64 that is `aarch64-linux-gnu-gcc-12`)."""
        named = self.cc_version_text.split()[0] if self.cc_version_text else "gcc"
        prefix = self.cross_prefix
        return named if not prefix or named.startswith(prefix) else prefix + named

    @property
    def compiler_package(self) -> str:
        """Debian's package of that compiler: `x86_64-linux-gnu-gcc-14` is in `gcc-14`,
        the cross compiler `aarch64-linux-gnu-gcc-12` in `gcc-12-aarch64-linux-gnu`."""
        found = re.search(r"(?:^|-)(gcc-\d+)$", self.compiler)
        if not found:
            return self.compiler
        return f"{found[1]}-{self.cross_prefix[:-1]}" if self.cross_prefix else found[1]


def group_headers(paths: tuple[Path, ...]) -> dict[str, tuple[Path, ...]]:
    """Split `--kernel-headers` by kernel release, without unpacking anything.

    A `linux-headers-<release>` .deb starts a release; Debian's shared companions go to
    every release they serve (`linux-headers-<abi>-common*` to releases `<abi>-*`,
    `linux-kbuild-X.Y` to releases `X.Y.*`; Ubuntu's `linux-headers-<ver>-<abi>` to its
    `<ver>-<abi>-<flavour>` releases; any other .deb, like a derivative kernel's
    `linux-gcp-headers-<ver>-<abi>`, to all). A directory is its own
    release (its `UTS_RELEASE`), and so is a tarball (named by its file name).
    """
    releases: dict[str, list[Path]] = {}
    shared: list[tuple[Path, str]] = []
    for path in sorted(paths):
        if not path.exists():
            raise PackageBuildError(f"--kernel-headers {path} does not exist")
        if path.is_dir():
            releases.setdefault(_dir_release(path), []).append(path)
        elif is_rpm(path):  # kernel-devel: a whole tree in one package
            releases.setdefault(read_header(path).kernel_release, []).append(path)
        elif path.open("rb").read(8) != b"!<arch>\n":
            releases.setdefault(path.name, []).append(path)
        else:
            name = deb_control(path).get("Package", path.name)
            release = name.removeprefix("linux-headers-")
            if name.startswith("linux-headers-") and not re.search(r"-common(-\w+)?$", name):
                releases.setdefault(release, []).append(path)
            elif name.startswith("linux-headers-"):
                shared.append((path, re.sub(r"-common(-\w+)?$", "", release) + "-"))
            elif name.startswith("linux-kbuild-"):
                shared.append((path, name.removeprefix("linux-kbuild-") + "."))
            else:
                shared.append((path, ""))
    for common in [r for r in releases if any(o.startswith(f"{r}-") for o in releases)]:
        # Ubuntu's linux-headers-<ver>-<abi>: the common tree of its -<flavour> releases
        shared += [(path, f"{common}-") for path in releases.pop(common)]
    if not releases:  # only companions: one group, which prepare_headers will refuse
        return {"": tuple(path for path, _ in shared)}
    return {release: tuple(sorted([*own, *(p for p, prefix in shared
                                           if release.startswith(prefix))]))
            for release, own in releases.items()}


def _dir_release(path: Path) -> str:
    uts = path / "include" / "generated" / "utsrelease.h"
    found = _UTS_RE.search(uts.read_text(errors="replace")) if uts.is_file() else None
    return found[1] if found else path.name


def prepare_headers(paths: tuple[Path, ...], work: Path) -> KernelTree:
    """Make the given headers one usable build tree (one kernel per build; many kernels
    are split by `group_headers` first)."""
    root = work / "headers"
    claims: dict[Path, str] = {}  # tree -> the release its package or directory name claims
    inputs: list[dict[str, str]] = []
    trees: list[Path] = []
    for path in sorted(paths):
        if not path.exists():
            raise PackageBuildError(f"--kernel-headers {path} does not exist")
        if path.is_dir():
            trees.append(path)
            inputs.append({"name": path.name, "version": "", "sha256": ""})
            continue
        sha = file_sha256(path)
        if is_rpm(path):
            claimed, provenance = unpack_kernel_devel(path, root, sha)
            claims.update(claimed)
            inputs.append(provenance)
        elif path.open("rb").read(8) == b"!<arch>\n":
            control = deb_control(path)
            package = control.get("Package", path.name)
            before = _src_dirs(root)
            extract_deb(path, root, skip_outside_links=True)
            for new in _src_dirs(root) - before:
                if package.startswith("linux-headers-"):
                    claims[new] = package.removeprefix("linux-headers-")
            inputs.append({"name": package, "version": control.get("Version", ""),
                           "sha256": sha})
        else:
            _untar(path, root)  # laid out like the .debs: relative links keep working
            inputs.append({"name": path.name, "version": "", "sha256": sha})
    unpacked = {p.parents[2] for p in root.glob("**/include/generated/utsrelease.h")}
    found = [t for t in [*trees, *sorted(unpacked)] if _is_build_tree(t)]
    if not found:
        raise PackageBuildError(
            "--kernel-headers hold no kernel build tree (include/generated/utsrelease.h "
            "and .config)", remedy="give linux-headers-<release> with its -common and "
                                   "linux-kbuild packages, or /lib/modules/<release>/build")
    kernels = [_tree(t, root, claims.get(t), tuple(inputs)) for t in found]
    releases = sorted({k.release for k in kernels})
    if len(releases) != 1:
        raise PackageBuildError(f"one --kernel-headers input holds {len(releases)} kernels "
                                f"({', '.join(releases)})",
                                remedy="give each kernel's headers as its own .debs, "
                                       "tarball or directory")
    for kernel in kernels[1:]:
        if kernel.sysout != kernels[0].sysout:
            raise PackageBuildError(f"two build trees for {releases[0]}: {kernels[0].sysout}"
                                    f" and {kernel.sysout}")
    release = releases[0]  # a directory's provenance is its release
    return dataclasses.replace(kernels[0], inputs=tuple(
        dict(item, version=item["version"] or release) for item in inputs))


def _src_dirs(root: Path) -> set[Path]:
    src = root / "usr" / "src"
    return {p for p in src.iterdir() if p.is_dir()} if src.is_dir() else set()


def _untar(tarball: Path, dest: Path) -> None:
    try:
        with tarfile.open(tarball, mode="r:*") as archive:
            archive.extractall(dest, filter="data")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise PackageBuildError(f"--kernel-headers {tarball}: cannot unpack it ({exc})"
                                ) from None


def _is_build_tree(path: Path) -> bool:
    return (path / "include" / "generated" / "utsrelease.h").is_file() and (
        path / ".config").is_file()


def _tree(sysout: Path, root: Path, claim: str | None, inputs: tuple[dict[str, str], ...]
          ) -> KernelTree:
    uts = _UTS_RE.search((sysout / "include" / "generated" / "utsrelease.h").read_text(
        errors="replace"))
    if not uts:
        raise PackageBuildError(f"{sysout}: include/generated/utsrelease.h has no UTS_RELEASE")
    release = uts[1]
    name_claim = claim or (sysout.name.removeprefix("linux-headers-")
                           if sysout.name.startswith("linux-headers-") else None)
    if name_claim is not None and name_claim != release:
        raise PackageBuildError(
            f"kernel headers {sysout.name} claim release {name_claim} but were built for "
            f"{release} (include/generated/utsrelease.h)",
            remedy="give the headers package of the kernel you mean")
    config = (sysout / ".config").read_text(errors="replace")
    cc = re.search(r'^CONFIG_CC_VERSION_TEXT="([^"]*)"', config, re.M)
    arch = next((name for line, name in _CONFIG_ARCHES if line in config), None)
    syssrc = _syssrc(sysout, root)
    for link in ("scripts", "include"):
        if not (syssrc / link).exists() and not (sysout / link).exists():
            raise PackageBuildError(
                f"kernel headers {sysout.name}: {link}/ is missing (a dangling link?)",
                remedy=f"also give linux-kbuild-{'.'.join(release.split('.')[:2])} and the "
                       "-common headers package")
    return KernelTree(release, sysout, syssrc, arch, cc[1] if cc else "", inputs)


def _syssrc(sysout: Path, root: Path) -> Path:
    """Where the tree's Makefile points (Debian's -common), rewritten into `root` if needed."""
    makefile = sysout / "Makefile"
    text = makefile.read_text(errors="replace") if makefile.is_file() else ""
    include = _INCLUDE_RE.search(text)
    if not include or len(text) > 4096:
        return sysout  # a full tree: sources and output are one
    target = Path(include[1])
    if (target / "Makefile").is_file() and not sysout.is_relative_to(root):
        return target  # an installed /usr/src tree given as a directory
    inside = root / target.relative_to("/")
    if not (inside / "Makefile").is_file():
        raise PackageBuildError(f"kernel headers {sysout.name} need {target.name}, which is "
                                "not among --kernel-headers",
                                remedy=f"also give the {target.name} package")
    if sysout.is_relative_to(root):
        makefile.unlink()  # may be a hard link to the cache: write a new file
        makefile.write_text(text.replace(f"include {target}/", f"include {inside}/"))
    return inside


def which_compiler(tree: KernelTree) -> str:
    """The compiler's path, or a refusal naming the Debian package to install (or a root of
    the kernel's distro: its kbuild tools may also need that distro's glibc)."""
    path = shutil.which(tree.compiler)
    if path is None:
        built = f"was built with {tree.cc_version_text or tree.compiler}"
        if tree.cross:
            built = f"is {tree.arch}, {built} (cross-compiled here with its {tree.arch} build)"
        raise PackageBuildError(
            f"{tree.compiler} not found: kernel {tree.release} {built} and its modules must "
            "be too",
            remedy=f"apt-get install {tree.compiler_package}, or compile in a root of the "
                   "kernel's distro: --build-root auto")
    return path
