// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in for NVIDIA's nvidia.ko: only the kernel-visible surface the
 * installer relies on (char major 195, /proc/driver/nvidia, NVreg_* params,
 * MODULE_VERSION, the nvidia-caps major), so the load stage can be exercised
 * on a real kernel without a GPU.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/fs.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>

#define NV_MAJOR 195
#define NV_MAX_FAKE_GPUS 4

static int NVreg_EnableGpuFirmware = 18;
module_param(NVreg_EnableGpuFirmware, int, 0444);
static int NVreg_ModifyDeviceFiles = 1;
module_param(NVreg_ModifyDeviceFiles, int, 0444);
static int NVreg_DeviceFileMode = 0666;
module_param(NVreg_DeviceFileMode, int, 0444);
static int NVreg_EnableMSI = 1;
module_param(NVreg_EnableMSI, int, 0444);
static int NVreg_RestrictProfilingToAdminUsers = 1;
module_param(NVreg_RestrictProfilingToAdminUsers, int, 0444);
static int NVreg_EnableStreamMemOPs;
module_param(NVreg_EnableStreamMemOPs, int, 0444);
static char *NVreg_RegistryDwords = "";
module_param(NVreg_RegistryDwords, charp, 0444);
/* How many fake GPUs to list under /proc/driver/nvidia/gpus (test only). */
static int gni_fake_gpus = 1;
module_param(gni_fake_gpus, int, 0444);

static int caps_major;
static struct proc_dir_entry *nv_proc;

/* Modules that depend on nvidia call this, so modpost records depends=nvidia. */
const char *nvgni_core_version(void)
{
	return NV_VERSION_STRING;
}
EXPORT_SYMBOL(nvgni_core_version);

static int nv_open(struct inode *inode, struct file *file)
{
	return 0;
}

/* .owner pins the module while a file is open, like the real driver. */
static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nv_open,
	.llseek = noop_llseek,
};

#ifdef GNI_OPEN_FLAVOUR
#define NVRM_KIND "NVIDIA UNIX Open Kernel Module for x86_64"
#else
#define NVRM_KIND "NVIDIA UNIX x86_64 Kernel Module"
#endif

static int version_show(struct seq_file *m, void *v)
{
	seq_printf(m, "NVRM version: " NVRM_KIND "  %s  Tue Jan  7 00:00:00 UTC 2025\n",
		   NV_VERSION_STRING);
	seq_puts(m, "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n");
	return 0;
}

static int information_show(struct seq_file *m, void *v)
{
	long minor = (long)m->private;

	seq_puts(m, "Model: \t\t Tesla T4\n");
	seq_puts(m, "IRQ:   \t\t 11\n");
	seq_printf(m, "GPU UUID: \t GPU-00000000-0000-0000-0000-00000000000%ld\n", minor);
	seq_printf(m, "Video BIOS: \t 90.04.38.00.03\n");
	seq_puts(m, "Bus Type: \t PCIe\n");
	seq_puts(m, "DMA Size: \t 47 bits\n");
	seq_puts(m, "DMA Mask: \t 0x7fffffffffff\n");
	seq_printf(m, "Bus Location: \t 0000:00:%02lx.0\n", 0x1e - minor);
	seq_printf(m, "Device Minor: \t %ld\n", minor);
	seq_puts(m, "GPU Excluded:\t No\n");
	return 0;
}

static int cap_show(struct seq_file *m, void *v)
{
	long minor = (long)m->private;

	seq_printf(m, "DeviceFileMinor: %ld\n", minor);
	seq_printf(m, "DeviceFileMode: %d\n", minor == 1 ? 0400 : 0444);
	seq_puts(m, "DeviceFileModify: 1\n");
	return 0;
}

static int nv_create_proc(void)
{
	struct proc_dir_entry *gpus, *gpu, *caps, *mig;
	char name[16];
	long i;

	nv_proc = proc_mkdir("driver/nvidia", NULL);
	if (!nv_proc)
		return -ENOMEM;
	if (!proc_create_single("version", 0444, nv_proc, version_show))
		return -ENOMEM;
	gpus = proc_mkdir("gpus", nv_proc);
	if (!gpus)
		return -ENOMEM;
	for (i = 0; i < gni_fake_gpus && i < NV_MAX_FAKE_GPUS; i++) {
		snprintf(name, sizeof(name), "0000:00:%02lx.0", 0x1e - i);
		gpu = proc_mkdir(name, gpus);
		if (!gpu || !proc_create_single_data("information", 0444, gpu,
						     information_show, (void *)i))
			return -ENOMEM;
	}
	caps = proc_mkdir("capabilities", nv_proc);
	mig = caps ? proc_mkdir("mig", caps) : NULL;
	if (!mig ||
	    !proc_create_single_data("config", 0444, mig, cap_show, (void *)1L) ||
	    !proc_create_single_data("monitor", 0444, mig, cap_show, (void *)2L))
		return -ENOMEM;
	return 0;
}

static int __init nv_init(void)
{
	int ret;

	ret = register_chrdev(NV_MAJOR, "nvidia-frontend", &nv_fops);
	if (ret < 0)
		return ret;
	caps_major = register_chrdev(0, "nvidia-caps", &nv_fops);
	if (caps_major < 0) {
		ret = caps_major;
		goto out_frontend;
	}
	ret = nv_create_proc();
	if (ret)
		goto out_proc;
	pr_info("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  %s (test stand-in)\n",
		NV_VERSION_STRING);
	return 0;

out_proc:
	proc_remove(nv_proc);
	unregister_chrdev(caps_major, "nvidia-caps");
out_frontend:
	unregister_chrdev(NV_MAJOR, "nvidia-frontend");
	return ret;
}

static void __exit nv_exit(void)
{
	proc_remove(nv_proc);
	unregister_chrdev(caps_major, "nvidia-caps");
	unregister_chrdev(NV_MAJOR, "nvidia-frontend");
}

module_init(nv_init);
module_exit(nv_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(NV_VERSION_STRING);
MODULE_DESCRIPTION("gpu-node-installer test stand-in for nvidia.ko");
