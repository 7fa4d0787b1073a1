"""Optional kernel modules beside NVIDIA's: GDRCopy's `gdrdrv` and GPUDirect Storage's `nvidia-fs`.

Both are built from their open sources against the same kernel build tree, compiler and
path maps as NVIDIA's modules (`compile.py`), after them, into the same modules directory;
the package lists them as `optional_modules` (loaded last, never failing the GPUs' install).

- `--gdrcopy SRC`: GDRCopy's tree (github.com/NVIDIA/gdrcopy, a directory or a tarball of
  one) with `src/gdrdrv/{gdrdrv.c,Makefile}`. Built as its `src/gdrdrv/Makefile` does:
  kbuild with `NVIDIA_SRC_DIR` (where `nv-p2p.h` is), `NVIDIA_IS_OPENSOURCE` (the
  flavour), `HAVE_VM_FLAGS_SET` and `HAVE_PROC_OPS` (the kernel's API, read here from the
  headers where GDRCopy's scripts compile a probe). NVIDIA's `Module.symvers` from the
  compile just done gives modpost the real `nvidia_p2p_*` versions (and depends=nvidia),
  so GDRCopy's `nv-p2p-dummy.ko`, which stands in for them, is not built.
- `--nvidia-fs SRC`: gds-nvidia-fs's tree with `src/{nvfs-core.c,Makefile,configure,
  GDS_VERSION}` (or those files at its top, as Debian's nvidia-fs-dkms lays them out).
  Its `configure` probes the kernel through `/lib/modules/<release>/build`, so it runs on
  a copy that looks there in the work dir, with `gcc` the kernel's compiler; NVIDIA's
  `Module.symvers` from the compile just done gives modpost the `nvidia_p2p_*` versions
  (src/nvfs-p2p.h calls nothing else of a module: nvfs-rdma.c calls no ib_core function),
  as its `create_nv.symvers.sh` does. NVIDIA documents GDS on the open modules only: a
  proprietary flavour is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.packages.builder.headers import KernelTree
from installer.packages.builder.inputs import PackageBuildError, file_sha256

GDRCOPY = "gdrdrv"
NVIDIA_FS = "nvidia-fs"
# the module names as modinfo and the manifest spell them
MODULE_NAMES = {GDRCOPY: "gdrdrv", NVIDIA_FS: "nvidia_fs"}
FLAGS = {GDRCOPY: "--gdrcopy", NVIDIA_FS: "--nvidia-fs"}
# (the directory make runs in, the files it must hold): GitHub's layouts, and Debian's flat
# nvidia-fs-dkms tree (/usr/src/nvidia-fs-<version>/nvfs-core.c ...)
_LAYOUTS = {GDRCOPY: (("src/gdrdrv", ("gdrdrv.c", "Makefile")),),
            NVIDIA_FS: (("src", ("nvfs-core.c", "Makefile", "configure")),
                        (".", ("nvfs-core.c", "Makefile", "configure")))}
_GDR_VERSION_RE = re.compile(r"#define\s+GDRDRV_(MAJOR|MINOR)_VERSION\s+(\d+)\s*$", re.M)
_SAFE_VERSION_RE = re.compile(r"^[0-9A-Za-z._-]{1,32}$")
_MAX_ERROR = 300


@dataclass(frozen=True)
class OptionalSource:
    """One optional module's unpacked sources: which part, where, version, provenance."""

    part: str
    root: Path
    subdir: str  # where make runs, in `root`
    version: str
    name: str
    sha256: str

    def provenance(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256}


def check_flavour(parts: tuple[str, ...], flavour: str | None) -> None:
    """nvidia-fs with the proprietary modules is refused (before anything is unpacked)."""
    if NVIDIA_FS in parts and flavour not in (None, "open"):
        raise PackageBuildError(
            f"--nvidia-fs needs NVIDIA's open kernel modules; --flavour {flavour} builds the "
            "proprietary ones, and GPUDirect Storage is documented for the open modules only",
            remedy="build with --flavour open (open sources), or leave out --nvidia-fs")


def unpack(part: str, path: Path, work: Path) -> OptionalSource:
    """The part's sources (a directory, or a tarball of one) checked for its layout."""
    flag = FLAGS[part]
    if not path.exists():
        raise PackageBuildError(f"{flag} {path} does not exist")
    if path.is_dir():
        base, sha = path, _tree_sha256(path)
    else:
        base, sha = work / f"{part}-src", file_sha256(path)
        try:
            with tarfile.open(path, mode="r:*") as archive:
                archive.extractall(base, filter="data")
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise PackageBuildError(f"{flag} {path}: cannot unpack it ({exc})",
                                    remedy="give the source tree or a tarball of it") from None
    found = next(((c, sub) for c in (base, *sorted(p for p in base.iterdir() if p.is_dir()))
                  for sub, files in _LAYOUTS[part]
                  if all((c / sub / f).is_file() for f in files)), None)
    if found is None:
        sub, files = _LAYOUTS[part][0]
        raise PackageBuildError(
            f"{flag} {path} is not {_what(part)}'s source tree (no "
            f"{' and '.join(f'{sub}/{f}' for f in files)})",
            remedy=f"give {_what(part)}'s sources ({_home(part)}), a checkout or its tarball")
    root, sub = found
    return OptionalSource(part, root, sub, _version(part, root / sub), path.name, sha)


def _what(part: str) -> str:
    return "GDRCopy" if part == GDRCOPY else "gds-nvidia-fs"


def _home(part: str) -> str:
    return "github.com/NVIDIA/gdrcopy" if part == GDRCOPY else "github.com/NVIDIA/gds-nvidia-fs"


def _version(part: str, where: Path) -> str:
    """GDS_VERSION (nvidia-fs), gdrdrv.h's GDRDRV_MAJOR/MINOR_VERSION (gdrdrv)."""
    if part == NVIDIA_FS:
        text = (where / "GDS_VERSION").read_text(errors="replace").strip() if (
            where / "GDS_VERSION").is_file() else ""
        return text if _SAFE_VERSION_RE.match(text) else "unknown"  # it reaches KCPPFLAGS
    header = where / "gdrdrv.h"
    found = dict(_GDR_VERSION_RE.findall(header.read_text(errors="replace"))
                 ) if header.is_file() else {}
    return f"{found['MAJOR']}.{found['MINOR']}" if len(found) == 2 else "unknown"


def _tree_sha256(root: Path) -> str:
    from installer.packages.builder.nvsource import tree_sha256

    return tree_sha256(root)


def nvidia_src_dir(tree: Path) -> Path:
    """Where NVIDIA's `nv-p2p.h` is in the module tree (both parts include it)."""
    found = sorted(tree.rglob("nv-p2p.h"))
    if found:
        return found[0].parent
    return tree / "nvidia" if (tree / "nvidia").is_dir() else tree


@dataclass(frozen=True)
class PartBuild:
    """What an optional part is compiled with: NVIDIA's tree and build, the kernel."""

    nvidia_tree: Path
    nvidia_build: Path
    flavour: str
    kernel: KernelTree
    compiler: str
    env: dict[str, str]
    make_args: tuple[str, ...]  # ARCH=/CROSS_COMPILE= for another arch's headers


def compile_part(source: OptionalSource, build: PartBuild, work: Path, out: Path,
                 log: Any) -> Path:
    """Compile one part in a copy of its tree under `work`; its .ko copied into `out`."""
    tree = work / f"{source.part}-build"
    shutil.copytree(source.root, tree, symlinks=True)
    where = tree / source.subdir
    kernel = build.kernel
    args = [f"NVIDIA_SRC_DIR={nvidia_src_dir(build.nvidia_tree)}", f"CC={build.compiler}",
            *build.make_args]
    env = dict(build.env)
    # its temp path mapped away like NVIDIA's tree: the same inputs give the same bytes
    env["KCFLAGS"] = f"{env.get('KCFLAGS', '')} -ffile-prefix-map={tree}=/usr/src/" \
                     f"{source.part}-{source.version}".strip()
    symvers = build.nvidia_build / "Module.symvers"
    if source.part == GDRCOPY:
        if symvers.is_file():  # NVIDIA's own symbol versions: depends=nvidia, no dummy
            args.append(f"KBUILD_EXTRA_SYMBOLS={symvers}")
            makefile = where / "Makefile"
            makefile.write_text(makefile.read_text(errors="replace").replace(
                "nv-p2p-dummy.o", ""))
        args += [f"NVIDIA_IS_OPENSOURCE={'y' if build.flavour == 'open' else 'n'}",
                 f"HAVE_VM_FLAGS_SET={_has(kernel, 'include/linux/mm.h', 'vm_flags_set')}",
                 f"HAVE_PROC_OPS={_has(kernel, 'include/linux/proc_fs.h', 'struct proc_ops')}"]
    else:
        _configure(where, kernel, build.compiler, work, env)
        if symvers.is_file():
            args.append(f"KBUILD_EXTRA_SYMBOLS={symvers}")
        args += ["CONFIG_NVFS_BATCH_SUPPORT=y", "CONFIG_NVFS_STATS=y"]
        version = source.version
        env["KCPPFLAGS"] = (f"-DCONFIG_NVFS_STATS=y -DGDS_VERSION={version} "
                            "-DNVFS_ENABLE_KERN_RDMA_SUPPORT -DNVFS_BATCH_SUPPORT=y")
        args.append("KBUILD_MODPOST_WARN=1")
    cmd = ["make", "-C", str(kernel.syssrc), f"KBUILD_OUTPUT={kernel.sysout}", f"M={where}",
           *args, "modules"]
    log.info("compiling optional module", part=source.part, release=kernel.release)
    done = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True,
                          errors="replace", check=False, stdin=subprocess.DEVNULL)
    ko = where / f"{source.part}.ko"
    if done.returncode != 0 or not ko.is_file():
        raise PackageBuildError(f"{FLAGS[source.part]}: {_what(source.part)} did not compile "
                                f"for {kernel.release}: {_first_error(done, where)}",
                                remedy=f"give {_what(source.part)} sources that support this "
                                       "kernel (a newer release)")
    shutil.copyfile(ko, out / ko.name)
    return out / ko.name


def _has(kernel: KernelTree, header: str, text: str) -> str:
    """'y' when the kernel's header declares `text` (GDRCopy's probe, answered by reading)."""
    for base in (kernel.syssrc, kernel.sysout):
        path = base / header
        if path.is_file() and text in path.read_text(errors="replace"):
            return "y"
    return "n"


def _configure(where: Path, kernel: KernelTree, compiler: str, work: Path,
               env: dict[str, str]) -> None:
    """gds-nvidia-fs's `configure <release>` (it writes config-host.h), looking for the
    kernel in the work dir instead of /lib/modules, with `gcc` the kernel's compiler."""
    modules = work / "nvfs-modules" / kernel.release
    modules.mkdir(parents=True)
    (modules / "build").symlink_to(kernel.sysout)
    script = (where / "configure").read_text(errors="replace")
    (where / "configure").write_text(script.replace("/lib/modules/$KVER", str(modules))
                                     .replace("/lib/modules/${KVER}", str(modules)))
    tools = work / "nvfs-bin"
    tools.mkdir()
    found = shutil.which(compiler)
    if found:
        (tools / "gcc").symlink_to(found)
    run_env = {**env, "PATH": f"{tools}{os.pathsep}{env.get('PATH', os.defpath)}"}
    done = subprocess.run(["bash", "configure", kernel.release], cwd=where, env=run_env,
                          capture_output=True, text=True, errors="replace", check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not (where / "config-host.h").is_file():
        raise PackageBuildError(f"--nvidia-fs: its configure failed for {kernel.release}: "
                                f"{_first_error(done, where)}",
                                remedy="give gds-nvidia-fs sources that support this kernel")


def _first_error(done: subprocess.CompletedProcess[str], where: Path) -> str:
    lines = [line.replace(f"{where}/", "") for line in (done.stdout + done.stderr
                                                        ).splitlines() if line.strip()]
    line = next((x for x in lines if "error:" in x or "ERROR:" in x or "*** " in x),
                lines[-1] if lines else f"exit {done.returncode}")
    return line.strip()[:_MAX_ERROR]
