"""`package build`: make a driver package from NVIDIA's real bits, reproducibly.

The files (see `installer.packages.builder.inputs`) are hashed while copied into a new directory,
listed in a canonical manifest (sorted, fixed modes), and the directory is renamed into
place only when complete; the same inputs always give the same manifest digest. With
`--repo` the package goes to `<repo>/<kernel>/<driver>/<flavour>/` and `index.json` is
updated (atomically) with its manifest digest and any aliases asked for. With
`--nvidia-source` and `--kernel-headers` the modules are first compiled
(`installer.packages.builder.compile`) into a temp modules directory, then built as above;
`--nvidia-source` without headers makes a source package (`installer.packages.builder.source`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from installer.packages.builder.buildroot import AUTO, check_privileges
from installer.packages.builder.compile import Compiled, CompileRequest, compile_modules
from installer.packages.builder.daemons import DaemonInput, check_versions, merge, read_daemon
from installer.packages.builder.inputs import (
    OPEN_LICENSES,
    ModuleInfo,
    PackageBuildError,
    Picked,
    check_input_arch,
    extract_deb,
    extract_run,
    load_order,
    pick_user_files,
    scan_modules,
)
from installer.packages.builder.optional import (
    FLAGS,
    GDRCOPY,
    MODULE_NAMES,
    NVIDIA_FS,
    check_flavour,
)
from installer.packages.builder.publish import Identity, update_index, write_package, write_tarball
from installer.packages.builder.signing import (
    SigningOptions,
    apply,
    check_keys,
    check_options,
    signs,
)
from installer.packages.builder.source import build_source
from installer.packages.builder.ubuntumodules import check_modules, check_ubuntu_request, unpack
from installer.packages.manifest import (
    ARCHES,
    DRIVER_VERSION_RE,
    FLAVOURS,
    KERNEL_RELEASE_RE,
    Manifest,
    manifest_to_dict,
    sha256_hex,
)
from installer.packages.repository import (
    package_path,
)

__all__ = ["BuildRequest", "BuildResult", "PackageBuildError", "SigningOptions", "build",
           "check_request"]
_ALIAS_NAMES = ("default", "latest")


@dataclass(frozen=True)
class BuildRequest:
    """What to build from, what identity to give it, where to write it."""

    debs: tuple[Path, ...] = ()
    trees: tuple[Path, ...] = ()
    run_files: tuple[Path, ...] = ()
    modules_dir: Path | None = None
    driver_version: str | None = None
    kernel_release: str | None = None
    flavour: str | None = None
    arch: str = "x86_64"
    os: dict[str, str] | None = None
    output: Path | None = None
    repo: Path | None = None
    index: bool = True  # with repo: update index.json (a --shard leaves it to `package index`)
    aliases: tuple[str, ...] = ()
    tarball: Path | None = None
    force: bool = False
    signing: SigningOptions = field(default_factory=SigningOptions)
    nvidia_source: Path | None = None
    kernel_headers: tuple[Path, ...] = ()
    patches: tuple[Path, ...] = ()
    jobs: int | None = None
    jobserver: tuple[int, int] | None = None  # many builds at once: make's shared job pool
    build_root: str | None = None
    build_root_cache: Path | None = None
    debian_mirror: str | None = None
    compile_cache: Path | None = None  # compiled modules kept by their inputs' key
    ima: tuple[tuple[str, bytes], ...] = ()  # (firmware file name, IMA signature)
    daemons: tuple[tuple[str, Path], ...] = ()  # (nv-fabricmanager|nvlsm|..., its input)
    ubuntu_modules: tuple[Path, ...] = ()  # Canonical's signed module .debs (ubuntumodules)
    gdrcopy: Path | None = None  # GDRCopy's sources: gdrdrv, an optional module (optional.py)
    nvidia_fs: Path | None = None  # gds-nvidia-fs's sources: nvidia-fs, an optional module

    @property
    def optional_parts(self) -> tuple[tuple[str, Path], ...]:
        """(part, sources) of the optional modules to compile beside NVIDIA's."""
        return tuple((part, path) for part, path in ((GDRCOPY, self.gdrcopy),
                                                     (NVIDIA_FS, self.nvidia_fs))
                     if path is not None)


@dataclass(frozen=True)
class BuildResult:
    """The package written: its manifest, digest and where it went."""

    manifest: Manifest
    digest: str
    directory: Path
    tarball: Path | None = None
    index: Path | None = None
    aliases: dict[str, str] = field(default_factory=dict)

    def log_fields(self) -> dict[str, Any]:
        return {"package": self.manifest.key, "files": len(self.manifest.files),
                "digest": self.digest[:12]}

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "digest": self.digest,
                "tarball": str(self.tarball) if self.tarball else None,
                "index": str(self.index) if self.index else None, "aliases": self.aliases,
                "manifest": manifest_to_dict(self.manifest)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        m = self.manifest
        lines = [f"built {m.driver_version} {m.flavour} for {m.kernel_release} ({m.arch}): "
                 f"{len(m.files)} files, {m.total_size / 1e6:.1f} MB, modules "
                 f"{', '.join(x.name for x in m.modules) or 'none'}",
                 f"directory {self.directory}", f"digest sha256:{self.digest}"]
        if self.tarball:
            lines.append(f"tarball {self.tarball}")
        if self.index:
            lines.append(f"index {self.index}"
                         + (f" (aliases {json.dumps(self.aliases)})" if self.aliases else ""))
        return "\n".join(lines)


def build(request: BuildRequest) -> BuildResult:
    """Validate the request, gather the files, write the package (and index, tarball)."""
    check_request(request)
    if request.nvidia_source is not None and not request.kernel_headers:  # for no kernel yet
        return BuildResult(*build_source(request, _user_trees, _destination))
    with tempfile.TemporaryDirectory(prefix="gni-build-") as work:
        roots = _user_trees(request, Path(work))
        picked, links = pick_user_files(roots, request.arch)
        daemons = _daemons(request, Path(work))
        modules_dir, provenance = request.modules_dir, None
        vendor = (unpack(request.ubuntu_modules, Path(work) / "ubuntu", request.kernel_release)
                  if request.ubuntu_modules else None)
        if vendor is not None:
            modules_dir = vendor.modules_dir
        if request.nvidia_source is not None:
            compiled = _compile(request, Path(work) / "compile", picked)
            modules_dir, provenance = compiled.modules_dir, compiled.provenance
        modules = scan_modules(modules_dir) if modules_dir else []
        vendor_signed = check_modules(vendor, modules, request.signing.cert) if vendor else None
        _check_contents(request.arch, picked, modules)
        identity = _identity(request, picked, modules)
        check_versions(daemons, identity.driver_version)
        load_order(modules)  # a cycle is refused before anything is written
        destination = _destination(request, identity)
        modules, signatures = ((modules, vendor_signed) if vendor_signed is not None
                               else apply(request.signing, modules, Path(work)))
        # compiled here (--gdrcopy, --nvidia-fs) or given among --modules: never the driver's
        optional = [name for name in MODULE_NAMES.values() if any(m.name == name
                                                                  for m in modules)]
        manifest, data = write_package(destination, identity, request.arch, request.os,
                                       merge(picked, daemons), links, modules,
                                       [m for m in load_order(modules)
                                        if m.name not in optional], signatures, provenance,
                                       ima=dict(request.ima),
                                       repo=request.repo if request.index else None,
                                       daemons=tuple(d.entry() for d in daemons),
                                       optional=tuple(m for name in optional
                                                      for m in modules if m.name == name))
    digest = sha256_hex(data)
    tarball = write_tarball(destination, request.tarball) if request.tarball else None
    index, aliases = (update_index(request.repo, manifest, digest, request.aliases)
                      if request.repo and request.index else (None, {}))
    return BuildResult(manifest, digest, destination, tarball, index, aliases)


def _fail(message: str, remedy: str | None = None) -> PackageBuildError:
    return PackageBuildError(message, remedy=remedy)


def check_request(request: BuildRequest) -> None:
    """Every refusal that needs no unpacking (also run once for a whole many-kernel build)."""
    if not (request.debs or request.trees or request.run_files or request.modules_dir
            or request.nvidia_source or request.ubuntu_modules):
        raise _fail("nothing to build from",
                    remedy="give --deb, --tree, --run, --modules and/or --nvidia-source")
    if request.nvidia_source is not None and request.modules_dir is not None:
        raise _fail("give either --modules (built modules) or --nvidia-source (compile them)")
    if request.kernel_headers and request.nvidia_source is None:
        raise _fail("--kernel-headers needs --nvidia-source (the sources to compile against "
                    "those headers)")
    if request.patches and request.nvidia_source is None:
        raise _fail("--patch needs --nvidia-source")
    if request.compile_cache is not None and not request.kernel_headers:
        raise _fail("--compile-cache needs --nvidia-source with --kernel-headers (it keeps "
                    "compiled modules)")
    if request.compile_cache is not None and request.compile_cache.exists() and not (
            request.compile_cache.is_dir()):
        raise _fail(f"--compile-cache {request.compile_cache} is not a directory",
                    remedy="give a directory (made when missing)")
    for patch in request.patches:
        if not patch.is_file():
            raise _fail(f"patch {patch} does not exist")
    if request.build_root is not None:
        _check_build_root(request)
    if (request.output is None) == (request.repo is None):
        raise _fail("say where to write the package: exactly one of --out-dir or --repo")
    if request.arch not in ARCHES:
        raise _fail(f"--arch {request.arch!r} is not one of {', '.join(ARCHES)}")
    for alias in request.aliases:
        if alias not in _ALIAS_NAMES and not (alias.isdigit() and 3 <= len(alias) <= 4):
            raise _fail(f"--alias {alias!r} is not default, latest or a branch like 535")
    if request.aliases and request.repo is None:
        raise _fail("--alias needs --repo (aliases live in the repository's index.json)")
    for path in (*request.debs, *request.trees, *request.run_files, *request.ubuntu_modules,
                 *(source for _, source in request.daemons)):
        if not path.exists():
            raise _fail(f"input {path} does not exist")
    for path in (*request.debs, *request.run_files, *request.ubuntu_modules):
        check_input_arch(path, request.arch)
    if request.daemons and request.nvidia_source is not None and not request.kernel_headers:
        raise _fail("a source package carries no daemons (--fabricmanager, --nvlsm, "
                    "--persistenced)", remedy="build packages for kernels (--kernel-headers) "
                    "with the daemons, or leave them out")
    if request.ubuntu_modules:
        check_ubuntu_request(request.modules_dir, request.nvidia_source, request.signing)
    else:
        check_options(request.signing)
    _check_source_package(request)
    _check_optional(request)
    check_keys(request.signing)


def _check_optional(request: BuildRequest) -> None:
    """gdrdrv and nvidia-fs compile beside NVIDIA's modules, on this machine."""
    for part, path in request.optional_parts:
        flag = FLAGS[part]
        if request.nvidia_source is None or not request.kernel_headers:
            raise _fail(f"{flag} needs --nvidia-source with --kernel-headers (it compiles "
                        "against the same headers as NVIDIA's modules, after them)")
        if request.build_root is not None:
            raise _fail(f"{flag} compiles on this machine, not under --build-root",
                        remedy="install the kernel's compiler here and leave out --build-root")
        if not path.exists():
            raise _fail(f"{flag} {path} does not exist")
    check_flavour(tuple(part for part, _ in request.optional_parts), request.flavour)


def _check_source_package(request: BuildRequest) -> None:
    """Modules to sign come from --modules or are compiled here (--nvidia-source with
    --kernel-headers); without headers the sources make a source package, which needs the
    user-mode files and has no modules to sign (nodes compile them)."""
    compiles = request.nvidia_source is not None and bool(request.kernel_headers)
    if request.nvidia_source is not None and not compiles and not (
            request.debs or request.trees or request.run_files):
        raise _fail("a source package needs the user-mode files too, and no --deb, --run or "
                    "--tree is given", remedy="also give --deb, --run or --tree (or "
                    "--kernel-headers, to compile the modules for a kernel)")
    if not signs(request.signing) or compiles or request.modules_dir is not None:
        return
    flag = "--sign-key" if request.signing.key is not None else "--signatures"
    if request.nvidia_source is not None:
        raise _fail(f"{flag}: a source package has no modules to sign (nodes compile them)",
                    remedy="give --kernel-headers to compile the modules here and sign them")
    raise _fail(f"{flag}: there are no modules to sign",
                remedy="give --modules (built modules), or --nvidia-source with "
                       "--kernel-headers (compiled here, then signed)")


def _check_build_root(request: BuildRequest) -> None:
    """What can be told before unpacking anything (the compiler is checked with the headers)."""
    if request.nvidia_source is None:
        raise _fail("--build-root needs --nvidia-source (it is where the modules compile)")
    if request.build_root != AUTO and not Path(request.build_root or "").is_dir():
        raise _fail(f"--build-root {request.build_root} does not exist or is not a directory",
                    remedy="make one (docs/building-packages.md: mmdebstrap), or pass "
                           "--build-root auto")
    check_privileges()


def _user_trees(request: BuildRequest, work: Path) -> list[Path]:
    """Every user-mode input as a directory tree (debs and .run files unpacked into `work`)."""
    roots = list(request.trees)
    for number, deb in enumerate(request.debs):
        target = work / f"deb{number}"
        extract_deb(deb, target)
        roots.append(target)
    for number, run_file in enumerate(request.run_files):
        target = work / f"run{number}"
        extract_run(run_file, target)
        roots.append(target)
    return roots


def _daemons(request: BuildRequest, work: Path) -> list[DaemonInput]:
    """Each daemon input unpacked into its own folder of `work`, its files picked."""
    return [read_daemon(name, source, work / f"daemon-{name}", request.arch)
            for name, source in request.daemons]


def _compile(request: BuildRequest, work: Path, picked: list[Picked]) -> Compiled:
    """Compile the modules (every refusal first) into `work`; they are then built as usual."""
    work.mkdir()
    return compile_modules(CompileRequest(
        request.nvidia_source or Path(), request.kernel_headers, request.flavour, request.arch,
        request.patches, request.jobs, frozenset(_library_versions(picked)),
        request.jobserver, request.build_root, request.build_root_cache,
        request.debian_mirror, request.compile_cache, request.optional_parts),
        work, structlog.get_logger("package-build"))


def _library_versions(picked: list[Picked]) -> set[str]:
    tails = (p.relpath.rsplit(".so.", 1)[1] for p in picked if ".so." in p.relpath)
    return {tail for tail in tails if DRIVER_VERSION_RE.match(tail)}


def _check_contents(arch: str, picked: list[Picked], modules: list[ModuleInfo]) -> None:
    """Something of the package's arch was found, and no module is built for another arch."""
    foreign = [m for m in modules if m.arch != arch]
    if foreign:
        raise _fail(f"module {foreign[0].path} is built for {foreign[0].arch or 'an unknown arch'}"
                    f", not {arch}", remedy="pass --arch to match the modules, or other modules")
    if not picked and not modules:
        raise _fail(f"the inputs hold no {arch} driver files (libraries, nvidia-* binaries, "
                    "firmware, modules)", remedy="check the inputs and --arch")


def _agree(what: str, given: str | None, found: set[str], flag: str) -> str:
    """One value for an identity field: the flag, else what the inputs say (all the same)."""
    if given is not None:
        found.discard(given)
        if found:
            raise _fail(f"{flag} {given} disagrees with the inputs, which say "
                        f"{', '.join(sorted(found))}")
        return given
    if len(found) != 1:
        raise _fail(f"cannot tell the {what} from the inputs ("
                    + (f"they say {', '.join(sorted(found))}" if found else "they do not say")
                    + ")", remedy=f"pass {flag}")
    return found.pop()


def _identity(request: BuildRequest, picked: list[Picked], modules: list[ModuleInfo]
              ) -> Identity:
    versions = _library_versions(picked)
    versions |= {m.version for m in modules if m.version and DRIVER_VERSION_RE.match(m.version)}
    kernels = {m.kernel_release for m in modules if m.kernel_release}
    flavours = {"open" if m.license in OPEN_LICENSES else "proprietary"
                for m in modules if m.name == "nvidia" and m.license}
    identity = Identity(
        _agree("driver version", request.driver_version, versions, "--driver-version"),
        _agree("kernel release", request.kernel_release, kernels, "--kernel-release"),
        _agree("module flavour", request.flavour, flavours, "--flavour"))
    if not DRIVER_VERSION_RE.match(identity.driver_version):
        raise _fail(f"driver version {identity.driver_version!r} is not like 535.261.03")
    if not KERNEL_RELEASE_RE.match(identity.kernel_release):
        raise _fail(f"kernel release {identity.kernel_release!r} is not a kernel release")
    if identity.flavour not in FLAVOURS:
        raise _fail(f"flavour {identity.flavour!r} is not one of {', '.join(FLAVOURS)}")
    return identity


def _destination(request: BuildRequest, identity: Identity) -> Path:
    if request.repo is not None:
        target = request.repo / package_path(identity.kernel_release, identity.driver_version,
                                             identity.flavour, request.arch)
    else:
        assert request.output is not None
        target = request.output
    if target.exists() and not request.force and any(target.iterdir()):
        raise _fail(f"{target} already exists and is not empty",
                    remedy="pass --force to replace it, or pick another --out-dir")
    return target


