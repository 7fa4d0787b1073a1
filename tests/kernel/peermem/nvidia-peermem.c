// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in shaped like NVIDIA's nvidia-peermem: it imports from ib_core (a client
 * registered with ib_register_client) and from nvidia (the stand-in's nvgni_core_version),
 * so modpost records depends=nvidia,ib_core, as the real module's .modinfo says, and its
 * __versions holds the CRC of ib_register_client from the kernel's Module.symvers. The
 * installer must load it after nvidia and ib_core, and only while those CRCs match.
 */
#include <linux/module.h>
#include <rdma/ib_verbs.h>

extern const char *nvgni_core_version(void);

static int gni_add(struct ib_device *device)
{
	return 0;
}

static void gni_remove(struct ib_device *device, void *client_data)
{
}

static struct ib_client gni_client = {
	.name = "nvidia_peermem_standin",
	.add = gni_add,
	.remove = gni_remove,
};

static int __init gni_peermem_init(void)
{
	pr_info("nvidia-peermem stand-in for nvidia %s\n", nvgni_core_version());
	return ib_register_client(&gni_client);
}

static void __exit gni_peermem_exit(void)
{
	ib_unregister_client(&gni_client);
}

module_init(gni_peermem_init);
module_exit(gni_peermem_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION(NV_VERSION_STRING);
