// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in for nvidia-modeset.ko: no device of its own (nvidia owns
 * 195:254), just a symbol dependency on nvidia and an exported symbol for
 * the nvidia-drm stand-in, so the load order is dictated by the kernel.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>

const char *nvgni_core_version(void);

static int hdmi_deepcolor = 1;
module_param(hdmi_deepcolor, int, 0444);

const char *nvgni_modeset_version(void)
{
	return nvgni_core_version();
}
EXPORT_SYMBOL(nvgni_modeset_version);

static int __init modeset_init(void)
{
	pr_info("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver %s (test stand-in)\n",
		nvgni_core_version());
	return 0;
}

static void __exit modeset_exit(void)
{
}

module_init(modeset_init);
module_exit(modeset_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("gpu-node-installer test stand-in for nvidia-modeset.ko");
