// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in for nvidia-uvm.ko: a dynamic char major named "nvidia-uvm"
 * (minor 0 = /dev/nvidia-uvm, 1 = /dev/nvidia-uvm-tools) and a real symbol
 * dependency on the nvidia stand-in, so modinfo's depends= is genuine.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/fs.h>

const char *nvgni_core_version(void);

static int uvm_perf_prefetch_enable = 1;
module_param(uvm_perf_prefetch_enable, int, 0444);

static int uvm_major;

static int uvm_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open,
	.llseek = noop_llseek,
};

static int __init uvm_init(void)
{
	uvm_major = register_chrdev(0, "nvidia-uvm", &uvm_fops);
	if (uvm_major < 0)
		return uvm_major;
	pr_info("nvidia-uvm: Loaded the UVM driver, major device number %d (core %s)\n",
		uvm_major, nvgni_core_version());
	return 0;
}

static void __exit uvm_exit(void)
{
	unregister_chrdev(uvm_major, "nvidia-uvm");
}

module_init(uvm_init);
module_exit(uvm_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("gpu-node-installer test stand-in for nvidia-uvm.ko");
