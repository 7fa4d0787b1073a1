// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in for nvidia-drm.ko: depends on nvidia-modeset and on the
 * kernel's own drm and drm_kms_helper modules (real symbol references), so
 * the installer must resolve host modules through modules.dep first.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <drm/drm_drv.h>
#include <drm/drm_probe_helper.h>

const char *nvgni_modeset_version(void);

static bool modeset;
module_param(modeset, bool, 0444);

/* Taking the addresses is enough to make modpost record the dependencies. */
static void *const host_symbols[] __used = {
	(void *)drm_dev_register,
	(void *)drm_kms_helper_poll_init,
};

static int __init nvdrm_init(void)
{
	pr_info("nvidia-drm: test stand-in over modeset %s (%zu host symbols)\n",
		nvgni_modeset_version(), ARRAY_SIZE(host_symbols));
	return 0;
}

static void __exit nvdrm_exit(void)
{
}

module_init(nvdrm_init);
module_exit(nvdrm_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("gpu-node-installer test stand-in for nvidia-drm.ko");
