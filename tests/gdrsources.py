"""Stated fixtures for `package build --gdrcopy` / `--nvidia-fs`: trees in the upstream layouts.

GDRCopy and gds-nvidia-fs are in neither Debian's nor PyPI's archives, so the tests do not
compile the real sources. `gdrcopy_fixture` writes a gdrdrv-SHAPED module in GDRCopy's
layout (github.com/NVIDIA/gdrcopy at fcec3ce0bb40a97a6cc45dd4afeec4bccb509712):
`src/gdrdrv/Makefile` with the same kbuild half (obj-m of `nv-p2p-dummy.o` and `gdrdrv.o`,
`-I$(NVIDIA_SRC_DIR)`, the `NVIDIA_IS_OPENSOURCE` switch), `gdrdrv.h` with its
`GDRDRV_MAJOR/MINOR_VERSION`, and a `gdrdrv.c` that does what matters to the installer: it
registers the char device "gdrdrv" with a dynamic major (gdrdrv.c `register_chrdev(
gdrdrv_major, DEVNAME, ...)`, DEVNAME "gdrdrv") and calls a symbol of the stand-in
`nvidia` (tests/kernel/modules/nvidia.c `nvgni_core_version`, standing for
`nvidia_p2p_get_pages`), so modpost records depends=nvidia. Like GDRCopy's
`nv-p2p-dummy.c`, a dummy module exports that symbol only so modpost knows its version; it
is not shipped. `nvfs_fixture` is gds-nvidia-fs's layout (src/nvfs-core.c, Makefile,
configure, GDS_VERSION); with `compiles=True` it is an nvidia-fs-shaped module whose
`configure` probes the headers as the real one does.
"""

from __future__ import annotations

from pathlib import Path

GDR_VERSION = "2.6"

_KBUILD = """\
# gdrdrv-shaped fixture: the kbuild half of GDRCopy's src/gdrdrv/Makefile
ifneq ($(KERNELRELEASE),)
obj-m := nv-p2p-dummy.o
obj-m += gdrdrv.o
ccflags-y += -I$(NVIDIA_SRC_DIR)
ifeq ($(NVIDIA_IS_OPENSOURCE),y)
ccflags-y += -DGDRDRV_OPENSOURCE_NVIDIA
endif
endif
"""

_HEADER = """\
#ifndef __GDRDRV_H__
#define __GDRDRV_H__
#define GDRDRV_MAJOR_VERSION    2
#define GDRDRV_MINOR_VERSION    6
#define GDRDRV_STR(x) #x
#define GDRDRV_TOSTRING(x) GDRDRV_STR(x)
#define GDRDRV_VERSION_STRING GDRDRV_TOSTRING(GDRDRV_MAJOR_VERSION) "." \\
    GDRDRV_TOSTRING(GDRDRV_MINOR_VERSION)
#endif
"""

_DRIVER = """\
/* gdrdrv-shaped test fixture (not GDRCopy's code): a char device "gdrdrv" with a dynamic
 * major, minor 0 only, and a call into the stand-in nvidia module. */
#include <linux/module.h>
#include <linux/fs.h>
#include "gdrdrv.h"

#define DEVNAME "gdrdrv"
extern const char *nvgni_core_version(void);
static int gdrdrv_major = 0;

static int gdrdrv_open(struct inode *inode, struct file *filp)
{
	return MINOR(inode->i_rdev) >= 1 ? -ENODEV : 0;
}

static const struct file_operations gdrdrv_fops = {
	.owner = THIS_MODULE,
	.open = gdrdrv_open,
};

static int __init gdrdrv_init(void)
{
	int result = register_chrdev(gdrdrv_major, DEVNAME, &gdrdrv_fops);
	if (result < 0)
		return result;
	if (gdrdrv_major == 0)
		gdrdrv_major = result;
	pr_info(DEVNAME ": loading gdrdrv %s over NVIDIA %s\\n", GDRDRV_VERSION_STRING,
		nvgni_core_version());
	return 0;
}

static void __exit gdrdrv_cleanup(void)
{
	unregister_chrdev(gdrdrv_major, DEVNAME);
}

module_init(gdrdrv_init);
module_exit(gdrdrv_cleanup);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION(GDRDRV_VERSION_STRING);
"""

_DUMMY = """\
/* Like GDRCopy's nv-p2p-dummy.c: exports the NVIDIA symbol gdrdrv calls, with the same
 * signature, so modpost records the same symbol version; built, never shipped. */
#include <linux/module.h>
const char *nvgni_core_version(void)
{
	return "dummy";
}
EXPORT_SYMBOL(nvgni_core_version);
MODULE_LICENSE("MIT");
"""


def gdrcopy_fixture(dest: Path, *, broken: bool = False) -> Path:
    """A GDRCopy-layout tree whose gdrdrv compiles against real headers in seconds
    (`broken`: its gdrdrv.c does not compile)."""
    gdrdrv = dest / "src" / "gdrdrv"
    gdrdrv.mkdir(parents=True)
    (gdrdrv / "Makefile").write_text(_KBUILD)
    (gdrdrv / "gdrdrv.h").write_text(_HEADER)
    (gdrdrv / "gdrdrv.c").write_text(_DRIVER + ("int broken(void) { return nope; }\n"
                                                if broken else ""))
    (gdrdrv / "nv-p2p-dummy.c").write_text(_DUMMY)
    (dest / "README.md").write_text("gdrdrv-shaped test fixture in GDRCopy's layout\n")
    return dest


def nvfs_fixture(dest: Path, *, compiles: bool = False) -> Path:
    """gds-nvidia-fs's layout; with `compiles`, an nvidia-fs-SHAPED module that builds: a
    `configure` of the real one's shape (KVER from $1, `MODULES_DIR=/lib/modules/$KVER`,
    one kbuild probe through `$MODULES_DIR/build`, `config-host.h` written), and an
    `nvfs-core.c` that includes it, registers the char device "nvidia-fs" and calls the
    stand-in nvidia (as nvfs-p2p.h's nvidia_p2p_* calls do)."""
    src = dest / "src"
    src.mkdir(parents=True)
    (src / "GDS_VERSION").write_text(f"{NVFS_VERSION}\n")
    if not compiles:
        for name in ("nvfs-core.c", "Makefile", "configure"):
            (src / name).write_text("/* layout only */\n")
        return dest
    (src / "Makefile").write_text(_NVFS_KBUILD)
    (src / "configure").write_text(_NVFS_CONFIGURE)
    (src / "nvfs-core.c").write_text(_NVFS_CORE)
    return dest


NVFS_VERSION = "1.17.1.22"

_NVFS_KBUILD = """\
# nvidia-fs-shaped fixture: the kbuild half of gds-nvidia-fs's src/Makefile
obj-m += nvidia-fs.o
ccflags-y += -Wall
ccflags-y += -I$(NVIDIA_SRC_DIR)
nvidia-fs-y = nvfs-core.o
"""

_NVFS_CONFIGURE = """\
#!/bin/bash
# nvidia-fs-shaped fixture of gds-nvidia-fs's configure: one probe, config-host.h
_KVER=$1
export KVER=${_KVER}
export MODULES_DIR=/lib/modules/$KVER
export KDIR=$MODULES_DIR/build
rm -rf build && mkdir -p build
echo "obj-m += test.o" > build/Makefile
printf '#include <linux/module.h>\\n#include <linux/proc_fs.h>\\n' > build/test.c
printf 'MODULE_LICENSE("GPL v2");\\nstatic const struct proc_ops ops;\\n' >> build/test.c
echo "#ifndef CONFIG_HOST_H" > config-host.h
echo "#define CONFIG_HOST_H" >> config-host.h
if make -C $KDIR M=$PWD/build modules > config.log 2>&1; then
    echo "#define HAVE_PROC_OPS 1" >> config-host.h
fi
echo "#endif" >> config-host.h
rm -rf build
"""

_NVFS_CORE = """\
/* nvidia-fs-shaped test fixture (not gds-nvidia-fs's code) */
#include <linux/module.h>
#include <linux/fs.h>
#include "config-host.h"

#define DEVICE_NAME "nvidia-fs"
#define STR(x) #x
#define XSTR(x) STR(x)
extern const char *nvgni_core_version(void);
static int major_number;
static const struct file_operations nvfs_dev_fops = { .owner = THIS_MODULE };

static int __init nvfs_init(void)
{
#ifndef HAVE_PROC_OPS
#error configure did not run against these headers
#endif
	major_number = register_chrdev(0, DEVICE_NAME, &nvfs_dev_fops);
	if (major_number < 0)
		return major_number;
	pr_info("nvidia_fs: GDS " XSTR(GDS_VERSION) " over NVIDIA %s\\n", nvgni_core_version());
	return 0;
}

static void __exit nvfs_exit(void)
{
	unregister_chrdev(major_number, DEVICE_NAME);
}

module_init(nvfs_init);
module_exit(nvfs_exit);
MODULE_LICENSE("GPL v2");
MODULE_VERSION(XSTR(GDS_VERSION));
"""
