// SPDX-License-Identifier: GPL-2.0
/*
 * Test stand-in shaped like NVIDIA's nvidia-peermem.c (open-gpu-kernel-modules @ df1c9a3d):
 * with NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT it registers a peer-memory client with OFED's
 * ib_core (ib_register_peer_memory_client, declared by OFED's rdma/peer_mem.h), so modpost
 * records the CRC OFED's Module.symvers lists; without it, init fails with -EINVAL, as
 * NVIDIA's does.
 */
#include <linux/module.h>
#include <linux/errno.h>

#if defined(NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT)
#include <rdma/peer_mem.h>

static struct peer_memory_client gni_client = { .name = "nv_mem" };
static void *gni_handle;
#endif

static int __init gni_peermem_init(void)
{
#if defined(NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT)
	gni_handle = ib_register_peer_memory_client(&gni_client, NULL);
	return gni_handle ? 0 : -EINVAL;
#else
	return -EINVAL;
#endif
}

static void __exit gni_peermem_exit(void)
{
#if defined(NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT)
	ib_unregister_peer_memory_client(gni_handle);
#endif
}

module_init(gni_peermem_init);
module_exit(gni_peermem_exit);
MODULE_LICENSE("Dual BSD/GPL");
MODULE_VERSION(NV_VERSION_STRING);
