"""NVIDIA-shaped kernel-module sources and kernel build trees for `package build` tests.

`mini_source` is a real module tree in NVIDIA's layout (a `Kbuild` naming the version, a
`Makefile` taking `SYSSRC`/`SYSOUT` like NVIDIA's) whose modules are tests/kernel/modules'
stand-ins: it compiles against real headers in seconds. `fake_headers` is a kernel build tree
that is only good enough to be refused (or accepted) before anything compiles; `make_deb`
packs a tree with Debian's real `dpkg-deb --build`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

MODULES_SRC = Path(__file__).resolve().parent / "kernel" / "modules"
CC_TEXT = "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
_MAKEFILE = """\
ifneq ($(KERNELRELEASE),)
include $(src)/Kbuild
else
modules:
\t$(MAKE) -C $(SYSSRC) KBUILD_OUTPUT=$(SYSOUT) M=$(CURDIR) modules
endif
"""


def mini_source(dest: Path, version: str = "535.261.03") -> Path:
    """The stand-in modules as an NVIDIA module tree of `version`."""
    dest.mkdir(parents=True)
    for source in sorted(MODULES_SRC.glob("*.c")):
        shutil.copyfile(source, dest / source.name)
    (dest / "Kbuild").write_text(f'ccflags-y += -DNV_VERSION_STRING=\\"{version}\\"\n'
                                 "obj-m := nvidia.o nvidia-uvm.o nvidia-modeset.o nvidia-drm.o\n")
    (dest / "Makefile").write_text(_MAKEFILE)
    return dest


def fake_headers(dest: Path, release: str, *, arch: str = "x86_64",
                 cc_text: str = CC_TEXT) -> Path:
    """A build tree `dest` whose utsrelease.h says `release` (nothing in it compiles)."""
    (dest / "include" / "generated").mkdir(parents=True)
    (dest / "scripts").mkdir()
    (dest / "include" / "generated" / "utsrelease.h").write_text(
        f'#define UTS_RELEASE "{release}"\n')
    config = "CONFIG_X86_64=y\n" if arch == "x86_64" else "CONFIG_ARM64=y\n"
    (dest / ".config").write_text(f'CONFIG_CC_VERSION_TEXT="{cc_text}"\n{config}')
    (dest / "Makefile").write_text("# a complete tree\nall:\n")
    return dest


def make_deb(root: Path, package: str, version: str, out: Path, *,
             arch: str = "amd64", compression: str = "xz") -> Path:
    """`root` (the package's files) as a real .deb made by dpkg-deb, its members compressed
    with `compression` (dpkg-deb -Z: xz as Debian, zstd as Ubuntu, gzip, none)."""
    (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: {arch}\n"
        "Maintainer: tests <tests@example.invalid>\nDescription: test package\n")
    target = out / f"{package}_{version}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build",
                    str(root), str(target)], check=True, capture_output=True)
    return target


def repack_deb(deb: Path, compression: str, out: Path) -> Path:
    """A real .deb (its files and control) packed again by dpkg-deb with `compression`:
    Debian's NVIDIA packages in the shape Ubuntu builds them (`-Zzstd`)."""
    tree = out / (deb.name + ".tree")
    subprocess.run(["dpkg-deb", "--raw-extract", str(deb), str(tree)], check=True)
    target = out / deb.name
    subprocess.run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build",
                    str(tree), str(target)], check=True, capture_output=True)
    shutil.rmtree(tree)
    return target


_KBUILD_C = """\
#define INFO(key, value) static const char info_##key[] \\
    __attribute__((section(".modinfo"), used, aligned(1))) = #key "=" value
INFO(name, NAME);
INFO(vermagic, RELEASE " SMP preempt mod_unload modversions ");
INFO(version, VERSION);
INFO(license, LICENSE);
#ifdef BROKEN
int broken(void) { return undeclared_thing; }
#endif
"""
_KBUILD_MAKEFILE = """\
# a stand-in of the kernel's Kbuild: each module is a real gcc object with real .modinfo,
# one make target each (so make runs them in parallel), start/end times in jobs.log
LICENSE := $(shell grep -qs 'MODULE_LICENSE("NVIDIA")' $(M)/nvidia/nv-frontend.c \\
             && echo NVIDIA || echo GPL)
modules: $(NV_KERNEL_MODULES)
$(NV_KERNEL_MODULES):
\t@echo "start $$(date +%s.%N)" >> $(CURDIR)/jobs.log
\t$(CC) -c -o $(M)/$@.ko -DNAME='"$(subst -,_,$@)"' -DRELEASE='"{release}"' \\
\t  -DVERSION='"{version}"' -DLICENSE='"$(LICENSE)"' {extra} $(CURDIR)/modinfo.c
\t@sleep {sleep}
\t@echo "end $$(date +%s.%N)" >> $(CURDIR)/jobs.log
.PHONY: modules $(NV_KERNEL_MODULES)
"""


def fake_kbuild(dest: Path, release: str, *, version: str = "535.261.03",
                broken: bool = False, sleep: float = 0) -> Path:
    """A build tree whose `make modules` really runs gcc: each module an ELF object with
    the .modinfo of `release` (and the nvidia licence the sources declare); `broken` makes
    gcc fail with a real compiler error; each module's job takes `sleep` s more and logs
    its start and end in `dest/jobs.log`. Fast stand-in headers for many-kernel builds."""
    fake_headers(dest, release)
    (dest / "modinfo.c").write_text(_KBUILD_C)
    (dest / "Makefile").write_text(_KBUILD_MAKEFILE.format(
        release=release, version=version, extra="-DBROKEN" if broken else "", sleep=sleep))
    return dest


def proprietary_source(dest: Path, version: str = "535.261.03") -> Path:
    """`mini_source` declaring NVIDIA's licence (nvidia/nv-frontend.c): proprietary."""
    mini_source(dest, version)
    (dest / "nvidia").mkdir()
    (dest / "nvidia" / "nv-frontend.c").write_text('MODULE_LICENSE("NVIDIA");\n')
    return dest


def refused_build(out: Path, *args: str, env: dict[str, str] | None = None,
                  prefix: tuple[str, ...] = ()) -> str:
    """`package build ... --out-dir OUT` (the CLI, in a subprocess) refused: exit 2, one
    `error(config):` line (returned), nothing published."""
    done = subprocess.run([*prefix, sys.executable, "-m", "installer", "package", "build",
                           *args, f"--out-dir={out}"], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **(env or {})})
    assert not out.exists() or not any(out.iterdir()), "something was published"
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error(config): "), lines
    return lines[0]
