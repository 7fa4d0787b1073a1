#!/bin/sh
# Stand-in of NVIDIA's conftest.sh `ib_peer_memory_symbols` test (kernel-open/conftest.sh,
# open-gpu-kernel-modules @ df1c9a3d): the peer-memory client is compiled in only when
# OFED's Module.symvers exports ib_register_peer_memory_client; it prints the define.
MLNX_OFED_KERNEL_DIR=/usr/src/ofa_kernel
tab='	'
for dir in "$MLNX_OFED_KERNEL_DIR/$KERNELRELEASE" "$MLNX_OFED_KERNEL_DIR/default"; do
    if grep -q "${tab}ib_register_peer_memory_client${tab}" "$dir/Module.symvers" 2>/dev/null; then
        echo "-DNV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT"
        exit 0
    fi
done
