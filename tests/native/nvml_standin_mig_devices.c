/* The NVML stand-in's MIG device handles: what nvidia-ctk and device plugins enumerate
 * (compiled into the same library as nvml_standin_mig.c, whose header has the state).
 *
 * A MIG device is one compute instance of one GPU instance. GPU g's MIG devices are its
 * compute instances in (GI id, CI id) order: nvmlDeviceGetMigDeviceHandleByIndex(g, i) is
 * the i-th of them (NVML_ERROR_NOT_FOUND, 6, past the last or with MIG off), and
 * nvmlDeviceGetMaxMigDeviceCount answers 7 on a MIG model. On a MIG handle:
 * nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId give its ids,
 * nvmlDeviceGetDeviceHandleFromMigDeviceHandle its GPU, nvmlDeviceIsMigDeviceHandle 1, and
 * nvmlDeviceGetUUID (nvml_standin.c asks mig_uuid first) a UUID of NVIDIA's MIG form,
 * "MIG-5fa0c2d4-00<gi>-4<ci>00-8000-<g, 12 digits>" (gi, ci in two and one hex digits), the
 * same in every process while the instance lives. Any other call on a MIG handle acts on its
 * GPU (the handle's `index` is the GPU's).
 */
#include <stdio.h>
#include <string.h>

#include "nvml_standin_mig.h"

typedef struct { gpu_t head; int gpu, gi, ci; } mig_t; /* head first: a mig_t* is a handle */

static mig_t mig_handles[64][GIS * CIS];

static mig_t *mig_of(nvmlDevice_t device) {
    mig_t *first = &mig_handles[0][0], *past = first + 64 * GIS * CIS;
    mig_t *mig = (mig_t *)(void *)device;
    return mig >= first && mig < past ? mig : NULL;
}

SHARED int mig_uuid(nvmlDevice_t device, char *out, unsigned int length, nvmlReturn_t *r) {
    mig_t *mig = mig_of(device);
    if (!mig) return 0;
    char text[96];
    snprintf(text, sizeof text, "MIG-5fa0c2d4-00%02x-4%x00-8000-%012d", mig->gi, mig->ci,
             mig->gpu);
    if (strlen(text) + 1 > length) { *r = 7; return 1; } /* INSUFFICIENT_SIZE */
    memcpy(out, text, strlen(text) + 1);
    *r = 0;
    return 1;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    const model_t *m;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    *count = 7;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *out) {
    const model_t *m;
    if (mig_of(device)) return INVALID;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    int g = device->index;
    state_t s;
    peek(g, &s);
    unsigned int seen = 0;
    for (int i = 0; s.current && i < GIS; i++)
        for (int c = 0; s.gi_used[i] && c < CIS; c++) {
            if (!s.ci_used[i][c] || seen++ != index) continue;
            mig_handles[g][i * CIS + c] = (mig_t){{g}, g, i, c};
            *out = &mig_handles[g][i * CIS + c].head;
            return 0;
        }
    return 6; /* NOT_FOUND */
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    *is_mig = mig_of(device) != NULL;
    return 0;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    mig_t *mig = mig_of(device);
    if (!mig) return NOT_SUPPORTED;
    *id = (unsigned int)mig->gi;
    return 0;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    mig_t *mig = mig_of(device);
    if (!mig) return NOT_SUPPORTED;
    *id = (unsigned int)mig->ci;
    return 0;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device,
                                                           nvmlDevice_t *parent) {
    mig_t *mig = mig_of(device);
    if (!mig) return INVALID;
    *parent = &gpus[mig->gpu];
    return 0;
}

/* nvmlDeviceGetAttributes_v2 (nvml.h: "currently only supports MIG device handles";
 * NOT_SUPPORTED on a GPU's own handle): the MIG device's GPU-instance profile figures, as
 * nvmlDeviceGetGpuInstanceProfileInfo gives them in nvml_standin_mig_instances.c
 * (memorySizeMB, 14 multiprocessors and one copy engine per slice), and its compute
 * instance, the full one, spans the same slices. INVALID once the instance is gone. */
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} attributes_t;

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, attributes_t *out) {
    mig_t *mig = mig_of(device);
    if (!mig) return NOT_SUPPORTED;
    const model_t *m;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    state_t s;
    peek(mig->gpu, &s);
    if (!s.current || !s.gi_used[mig->gi] || !s.ci_used[mig->gi][mig->ci]) return INVALID;
    const shape_t *shape = shape_by(m, s.gi_profile[mig->gi], -1);
    if (!shape) return INVALID;
    memset(out, 0, sizeof *out);
    out->multiprocessorCount = 14u * (unsigned int)shape->slices;
    out->sharedCopyEngineCount = (unsigned int)shape->slices;
    out->gpuInstanceSliceCount = (unsigned int)shape->slices;
    out->computeInstanceSliceCount = (unsigned int)shape->slices;
    out->memorySizeMB = (unsigned long long)memory_gb(shape) * 1000ULL;
    return 0;
}
