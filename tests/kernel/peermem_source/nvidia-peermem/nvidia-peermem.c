// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in shaped like NVIDIA's nvidia-peermem.c (open-gpu-kernel-modules @ df1c9a3d):
 * with NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT it registers a peer-memory client with OFED's
 * ib_core (ib_register_peer_memory_client, declared by OFED's rdma/peer_mem.h), so modpost
 * records the CRC OFED's Module.symvers lists. Without it NVIDIA's init returns -EINVAL;
 * this stand-in registers an inbox ib_client instead (ib_register_client, whose CRC comes
 * from the kernel's Module.symvers), so that the kernel tier can load it on the real
 * kernel's inbox ib_core. Like the real module's nvidia_p2p_* calls, it imports from
 * nvidia (the stand-in's nvgni_core_version), so built alone it needs nvidia's exports
 * (KBUILD_EXTRA_SYMBOLS) and modpost records depends=nvidia,ib_core.
 */
#include <linux/module.h>
#include <linux/errno.h>

extern const char *nvgni_core_version(void);

#if defined(NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT)
#include <rdma/peer_mem.h>

static struct peer_memory_client gni_client = { .name = "nv_mem" };
static void *gni_handle;
#else
#include <rdma/ib_verbs.h>

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
#endif

static int __init gni_peermem_init(void)
{
	pr_info("nvidia-peermem stand-in for nvidia %s\n", nvgni_core_version());
#if defined(NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT)
	gni_handle = ib_register_peer_memory_client(&gni_client, NULL);
	return gni_handle ? 0 : -EINVAL;
#else
	return ib_register_client(&gni_client);
#endif
}

static void __exit gni_peermem_exit(void)
{
#if defined(NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT)
	ib_unregister_peer_memory_client(gni_handle);
#else
	ib_unregister_client(&gni_client);
#endif
}

module_init(gni_peermem_init);
module_exit(gni_peermem_exit);
MODULE_LICENSE("Dual BSD/GPL");
MODULE_VERSION(NV_VERSION_STRING);
