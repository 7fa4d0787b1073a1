"""Compile NVIDIA's kernel modules from sources against one kernel's headers, reproducibly.

NVIDIA's own recipe: `make -C <tree> modules SYSSRC=<sources> SYSOUT=<build tree>
KERNEL_UNAME=<release> CC=<the kernel's compiler> -jN` (the Makefile hands over to the
kernel's Kbuild; proprietary `nvidia.ko` links `nv-kernel.o_binary`). Everything that could
make two builds differ is pinned: the build runs in a fresh temp dir whose paths are mapped
away (`-ffile-prefix-map` via KCFLAGS), with fixed KBUILD_BUILD_* values, SOURCE_DATE_EPOCH,
locale and time zone. Every refusal (arch, version, compiler, patch) comes before make runs;
a compile failure names the first compiler error and its file, not make's output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from installer.packages.builder.buildroot import CHROOT_PATH, BuildRoot, resolve
from installer.packages.builder.compilecache import compile_key, compiler_identity, lookup, store
from installer.packages.builder.headers import (
    KERNEL_ARCHES,
    KernelTree,
    prepare_headers,
    which_compiler,
)
from installer.packages.builder.inputs import PackageBuildError, elf_machine, file_sha256
from installer.packages.builder.nvsource import NvSource, unpack_source
from installer.packages.builder.optional import (
    OptionalSource,
    PartBuild,
    check_flavour,
    compile_part,
)
from installer.packages.builder.optional import unpack as unpack_part

MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")
OPTIONAL = ("nvidia-peermem",)
BUILD_EPOCH = "0"
_ERROR_RE = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?:fatal )?error: "
                       r"(?P<text>.*)$")
_NOT_FOUND_RE = re.compile(r"^/bin/sh: \d+: (?P<tool>[\w.+-]+): not found$")
_LINKED_RE = re.compile(r"^\s*LD \[M\]\s+(?P<path>\S+\.ko)\s*$")
_ERROR_TAIL = 12


class ModuleCompileError(PackageBuildError):
    """NVIDIA's sources did not compile against these headers (exit 2: fix the inputs)."""

    default_remedy = ("check that the sources support this kernel (a newer driver, or "
                      "--patch with the fix)")


@dataclass(frozen=True)
class CompileRequest:
    """What to compile: sources, headers, flavour and how."""

    source: Path
    headers: tuple[Path, ...]
    flavour: str | None = None
    arch: str = "x86_64"
    patches: tuple[Path, ...] = ()
    jobs: int | None = None
    user_versions: frozenset[str] = frozenset()
    jobserver: tuple[int, int] | None = None  # a GNU make jobserver's pipe, shared by builds
    build_root: str | None = None  # a root directory, or "auto" (see buildroot.py)
    build_root_cache: Path | None = None
    mirror: str | None = None
    compile_cache: Path | None = None  # compiled modules kept by their inputs' key
    optional: tuple[tuple[str, Path], ...] = ()  # (gdrdrv|nvidia-fs, its sources): optional.py


@dataclass(frozen=True)
class Compiled:
    """The modules built (in `modules_dir`), their identity and provenance."""

    modules_dir: Path
    version: str
    release: str
    flavour: str
    provenance: dict[str, Any]
    seconds: float


def compile_modules(request: CompileRequest, work: Path, log: Any,
                    stream: TextIO | None = None) -> Compiled:
    """Check everything, then compile into `work/modules` (`work` must be empty and private)."""
    work = work.resolve()
    source = unpack_source(request.source, work / "in")
    flavour, tree = source.tree(request.flavour)
    kernel = prepare_headers(request.headers, work / "in")
    _check(request, source, kernel)
    _check_prebuilt(tree, request.arch)
    check_flavour(tuple(part for part, _ in request.optional), flavour)
    parts = [unpack_part(part, path, work / "in") for part, path in request.optional]
    root = (resolve(request.build_root, kernel, request.build_root_cache, request.mirror, log)
            if request.build_root else None)
    compiler = root.compiler if root else which_compiler(kernel)
    patches = [{"name": p.name, "sha256": file_sha256(p)} for p in request.patches]
    build = work / "build" / f"nvidia-{source.version}"
    shutil.copytree(tree, build, symlinks=True)
    for patch in request.patches:
        _apply(patch, build)
    modules = [m for m in MODULES + OPTIONAL if (build / m).is_dir() or m in MODULES]
    provenance = _provenance(source, kernel, patches, root)
    key = _cache_key(request, source, flavour, kernel, compiler, provenance, modules)
    if parts:
        provenance["optional_sources"] = [p.provenance() for p in parts]
    out = work / "modules"
    out.mkdir()
    part_build = PartBuild(tree, build, flavour, kernel, compiler,
                           build_env(_maps(work, build, kernel)), tuple(_cross_args(kernel)))
    # gdrdrv and nvidia-fs need this compile's Module.symvers, which the cache does not keep
    if not parts and _restore(request.compile_cache, key, modules, out, log):
        return Compiled(out, source.version, kernel.release, flavour, provenance, 0.0)
    started = time.monotonic()
    made = root.mount_point(work) if root else []
    try:
        _make(build, kernel, compiler, modules, request.jobserver or request.jobs or
              os.cpu_count() or 1, _maps(work, build, kernel), log, stream or sys.stderr,
              root, work)
    finally:
        BuildRoot.cleanup(made)
    for module in modules:
        ko = build / f"{module}.ko"
        if not ko.is_file():
            raise ModuleCompileError(f"make succeeded but {module}.ko was not built")
        shutil.copyfile(ko, out / ko.name)
    if request.compile_cache and key:
        store(request.compile_cache, key, sorted(out.glob("*.ko")),
              {"release": kernel.release, "version": source.version, "flavour": flavour})
        log.info("compile cached", release=kernel.release, key=key[:16])
    _compile_parts(parts, part_build, work, out, log)
    return Compiled(out, source.version, kernel.release, flavour, provenance,
                    time.monotonic() - started)


def _compile_parts(parts: list[OptionalSource], build: PartBuild, work: Path, out: Path,
                   log: Any) -> None:
    """The optional modules (gdrdrv, nvidia-fs), after NVIDIA's, beside them in `out`."""
    for part in parts:
        compile_part(part, build, work, out, log)


def _provenance(source: NvSource, kernel: KernelTree, patches: list[dict[str, str]],
                root: BuildRoot | None) -> dict[str, Any]:
    """What the modules were made from, as the manifest records it."""
    provenance: dict[str, Any] = {
        "nvidia_source": {"name": source.name, "version": source.package_version or
                          source.version, "sha256": source.sha256},
        "kernel_headers": sorted(kernel.inputs, key=lambda item: item["name"]) or
        [{"name": kernel.sysout.name, "version": kernel.release, "sha256": ""}],
        "compiler": kernel.cc_version_text or kernel.compiler,
        "patches": patches,
    }
    if root:
        provenance["build_root"] = root.provenance
    return provenance


def _restore(cache: Path | None, key: str | None, modules: list[str], out: Path,
             log: Any) -> bool:
    """Copy a cached compile's modules into `out`; False when there is none to copy."""
    hit = lookup(cache, key, modules) if cache and key else None
    if hit is None:
        return False
    for path in hit.modules:
        shutil.copyfile(path, out / path.name)
    log.info("compile cache hit", release=hit.record.get("release"), key=(key or "")[:16],
             cache=str(cache))
    return True


def _cache_key(request: CompileRequest, source: NvSource, flavour: str, kernel: KernelTree,
               compiler: str, provenance: dict[str, Any], modules: list[str]) -> str | None:
    """The compile cache's key (compilecache.py says what is in it); None when not cached."""
    if request.compile_cache is None:
        return None
    return compile_key({
        "source_sha256": source.sha256, "version": source.version, "flavour": flavour,
        "headers": provenance["kernel_headers"], "release": kernel.release,
        "arch": request.arch, "modules": modules,
        "compiler": compiler_identity(compiler, provenance.get("build_root")),
        "patches": [patch["sha256"] for patch in provenance["patches"]],
    })


def _check(request: CompileRequest, source: NvSource, kernel: KernelTree) -> None:
    if kernel.arch is not None and kernel.arch != request.arch:
        raise PackageBuildError(f"kernel headers {kernel.release} are for {kernel.arch}, not "
                                f"--arch {request.arch}",
                                remedy="pass the headers of a kernel of that arch, or --arch "
                                       f"{kernel.arch}")
    others = sorted(request.user_versions - {source.version})
    if others:
        raise PackageBuildError(
            f"the NVIDIA sources are version {source.version} but the user-mode files are "
            f"{', '.join(others)}", remedy="give sources and user-mode files of one version")


def _check_prebuilt(tree: Path, arch: str) -> None:
    """NVIDIA's prebuilt objects (`nv-kernel.o_binary`, ...) are per arch: sources for
    another arch would fail late in the link, so they are refused before make."""
    for blob in sorted(tree.glob("*/*.o_binary")):
        found = elf_machine(blob)
        if found is not None and found != arch:
            raise PackageBuildError(
                f"the NVIDIA sources are for {found} ({blob.name} is a {found} object), not "
                f"{arch}", remedy=f"give NVIDIA's {arch} sources (Debian: the {arch} "
                                  "nvidia-kernel-source package; NVIDIA: its .run for the arch)")


def patch_applies(patch: Path, tree: Path) -> bool:
    """Whether `patch -p1 --dry-run` applies cleanly in the module tree (changes nothing)."""
    if shutil.which("patch") is None:
        raise PackageBuildError("patch not found", remedy="apt-get install patch")
    done = subprocess.run(["patch", "-p1", "--batch", "--forward", "--dry-run", "-r", "-",
                           "-i", str(patch.resolve())], cwd=tree, capture_output=True,
                          check=False, stdin=subprocess.DEVNULL)
    return done.returncode == 0


def _apply(patch: Path, tree: Path) -> None:
    """`patch -p1` in the module tree; checked with --dry-run first so a failure changes nothing."""
    if shutil.which("patch") is None:
        raise PackageBuildError("patch not found", remedy="apt-get install patch")
    for dry in (True, False):
        done = subprocess.run(["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch",
                               "-r", "-", *(["--dry-run"] if dry else []), "-i",
                               str(patch.resolve())], cwd=tree, capture_output=True,
                              text=True, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            lines = [line for line in (done.stdout + done.stderr).splitlines()
                     if "FAILED" in line or "can't find" in line or "malformed" in line
                     or "Only garbage" in line or "Reversed" in line]
            detail = (lines or (done.stdout + done.stderr).strip().splitlines() or ["?"])[0]
            raise PackageBuildError(f"patch {patch.name} does not apply: {detail.strip()}",
                                    remedy="make the patch -p1 relative to the module tree "
                                           "(where Kbuild is) of these sources")


def _maps(work: Path, build: Path, kernel: KernelTree) -> list[str]:
    """Prefix maps that turn every temp path into a fixed one (longest prefix first)."""
    pairs = {build: Path("/usr/src") / build.name,
             kernel.sysout: Path("/usr/src") / kernel.sysout.name,
             kernel.syssrc: Path("/usr/src") / kernel.syssrc.name,
             work / "in" / "headers": Path("/")}
    ordered = sorted(pairs.items(), key=lambda kv: len(str(kv[0])))
    return [f"-ffile-prefix-map={old}={new}" for old, new in ordered]


def build_env(maps: list[str]) -> dict[str, str]:
    """The environment of a reproducible kernel-module build."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MAKE", "KBUILD_", "KCFLAGS", "CFLAGS", "LDFLAGS"))}
    env.update(KBUILD_BUILD_TIMESTAMP="1970-01-01 00:00:00 UTC", KBUILD_BUILD_USER="gni",
               KBUILD_BUILD_HOST="gni", KBUILD_BUILD_VERSION="1",
               SOURCE_DATE_EPOCH=BUILD_EPOCH, LC_ALL="C", TZ="UTC",
               KCFLAGS=" ".join(maps))
    return env


def _make(build: Path, kernel: KernelTree, compiler: str, modules: list[str],
          jobs: int | tuple[int, int], maps: list[str], log: Any, stream: TextIO,
          root: BuildRoot | None, work: Path) -> None:
    """make -jN, or make as a client of a shared jobserver (no -j: it takes tokens)."""
    env, fds = build_env(maps), tuple[int, ...]()
    if isinstance(jobs, tuple):
        fds = jobs
        env["MAKEFLAGS"] = f"-j --jobserver-fds={jobs[0]},{jobs[1]} " \
                           f"--jobserver-auth={jobs[0]},{jobs[1]}"
    cmd = ["make", "-C", str(build), *([] if fds else [f"-j{jobs}"]), "modules",
           f"SYSSRC={kernel.syssrc}",
           f"SYSOUT={kernel.sysout}", f"KERNEL_UNAME={kernel.release}", f"CC={compiler}",
           f"NV_KERNEL_MODULES={' '.join(modules)}", *_cross_args(kernel)]
    if root:  # same paths inside: work is bind-mounted where it is outside
        cmd, env["PATH"] = root.command(work, cmd), CHROOT_PATH
    elif shutil.which("make") is None:
        raise PackageBuildError("make not found", remedy="apt-get install make")
    tty = stream.isatty()
    started = time.monotonic()
    log.info("compiling modules", modules=modules, release=kernel.release,
             jobs="shared jobserver" if fds else jobs, compiler=kernel.cc_version_text,
             build_root=str(root.path) if root else None)
    kept: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", env=env, cwd=build, pass_fds=fds,
                          stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            kept.append(line.rstrip("\n"))
            if len(kept) > 20000:
                del kept[:10000]
            linked = _LINKED_RE.match(line)
            if linked:
                name = Path(linked["path"]).name
                elapsed = round(time.monotonic() - started, 1)
                if tty:
                    stream.write(f"compiled {name} for {kernel.release} ({elapsed:.0f} s)\n")
                    stream.flush()
                else:
                    log.info("module compiled", module=name, release=kernel.release,
                             elapsed_s=elapsed)
        rc = proc.wait()
    if rc != 0:
        raise ModuleCompileError(_first_error(kept, build, kernel, rc))
    log.info("modules compiled", release=kernel.release,
             elapsed_s=round(time.monotonic() - started, 1))


def _cross_args(kernel: KernelTree) -> list[str]:
    """`ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu-` when the headers are for another arch
    (kbuild then takes ld, objcopy, ... of the target; its host tools stay native)."""
    if not kernel.cross or kernel.arch is None:
        return []
    return [f"ARCH={KERNEL_ARCHES[kernel.arch]}", f"CROSS_COMPILE={kernel.cross_prefix}"]


def _first_error(lines: list[str], build: Path, kernel: KernelTree, rc: int) -> str:
    """`compiling nvidia/nv-pci.c failed: 123: error: ...` (paths shown relative)."""
    for line in lines:
        match = _ERROR_RE.match(line.strip())
        if match:
            where = match["file"]
            for base, shown in ((str(build) + "/", ""), (str(kernel.sysout) + "/", ""),
                                (str(kernel.syssrc) + "/", "")):
                where = where.replace(base, shown)
            return (f"compile failed in {where} line {match['line']}: error: "
                    f"{match['text'][:300]}")
    missing = next((m for line in lines if (m := _NOT_FOUND_RE.search(line.strip()))), None)
    if missing:
        return (f"make exited {rc}: {missing['tool']} not found (the kernel's build runs it; "
                "install it where make runs)")
    tail = [line for line in lines if line.strip()][-_ERROR_TAIL:]
    last = next((line for line in reversed(tail) if "rror" in line), tail[-1] if tail else "")
    return f"make exited {rc}: {last.strip()[:300]}"
