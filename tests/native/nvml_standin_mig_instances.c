/* The NVML stand-in's MIG GPU and compute instances (see nvml_standin_mig.c's header for
 * the rules and the environment; compiled into the same library). */
#include <stdio.h>
#include <string.h>

#include "nvml_standin_mig.h"

static ci_t ci_handles[64][GIS][CIS];

#define GI_PROFILE_COUNT 0x12
#define CI_PROFILE_COUNT 0x9
static const int CI_SLICES[5] = {1, 2, 3, 4, 7};

#define GI_PROFILE_FIELDS \
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, \
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount; \
    unsigned long long memorySizeMB;
typedef struct { GI_PROFILE_FIELDS } gi_profile_t;
typedef struct { unsigned int version; GI_PROFILE_FIELDS char name[96]; } gi_profile_v2_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} ci_profile_t;
typedef struct { unsigned int version; ci_profile_t info; char name[96]; } ci_profile_v2_t;
_Static_assert(sizeof(gi_profile_v2_t) == 0x98 && __builtin_offsetof(gi_profile_v2_t, name) == 56,
               "nvmlGpuInstanceProfileInfo_v2_t");
_Static_assert(sizeof(ci_profile_v2_t) == 0x88 && __builtin_offsetof(ci_profile_v2_t, name) == 40,
               "nvmlComputeInstanceProfileInfo_v2_t");

typedef struct { unsigned long long total, free, used; } memory_info_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, memory_info_t *memory);

/* A profile's memorySizeMB (MiB) as a driver reports it: its memory slots' share of the
 * device's memory, a little under it (an A100-SXM4-40GB of 40536 MiB answers 4864 for
 * 1g.5gb, 0.96 of an eighth; an H100 80GB HBM3 of 81559 MiB 9984 for 1g.10gb, 0.98), so
 * go-nvlib's getMigMemorySizeGB (mig-parted's vendor tree @ bd7160f4, go-nvlib/pkg/nvlib/
 * device/mig_profile.go) turns it back into the GB of NVIDIA's name. */
static unsigned long long profile_mib(nvmlDevice_t device, const model_t *m,
                                      const shape_t *shape) {
    memory_info_t memory;
    nvmlDeviceGetMemoryInfo(device, &memory);
    return (memory.total >> 20) * (unsigned long long)shape->size * 97ULL /
           ((unsigned long long)m->slots * 100ULL);
}

static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned int constant, gi_profile_t *info,
                               char *name, size_t size) {
    const model_t *m;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    if (constant >= GI_PROFILE_COUNT) return INVALID;
    const shape_t *shape = shape_by(m, (int)constant, -1);
    state_t s;
    peek(device->index, &s);
    if (!shape || !s.current) return NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->id = (unsigned int)shape->id;
    info->sliceCount = (unsigned int)shape->slices;
    info->instanceCount = (unsigned int)shape->max;
    info->multiprocessorCount = 14u * (unsigned int)shape->slices;
    info->copyEngineCount = (unsigned int)shape->slices;
    info->memorySizeMB = profile_mib(device, m, shape);
    if (name) snprintf(name, size, "MIG %s", shape->name);
    return 0;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 gi_profile_t *info) {
    return gi_profile(device, profile, info, NULL, 0);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  gi_profile_v2_t *info) {
    if (info->version != 0x02000098u) return 25; /* ARGUMENT_VERSION_MISMATCH */
    gi_profile_t v1;
    nvmlReturn_t r = gi_profile(device, profile, &v1, info->name, sizeof info->name);
    if (r) return r;
    info->id = v1.id; info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount; info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount; info->memorySizeMB = v1.memorySizeMB;
    return 0;
}

static unsigned int used_slots(const state_t *s, const model_t *m, int *slices) {
    unsigned int mask = 0;
    *slices = 0;
    for (int i = 0; i < GIS; i++) {
        if (!s->gi_used[i]) continue;
        const shape_t *shape = shape_by(m, s->gi_profile[i], -1);
        if (!shape) continue;
        mask |= ((1u << shape->size) - 1) << s->gi_start[i];
        *slices += shape->slices;
    }
    return mask;
}

static int add_gi(state_t *s, const model_t *m, const shape_t *shape, int start) {
    int gid = gi_id_of(m, start, shape->size);
    s->gi_used[gid] = 1; s->gi_profile[gid] = shape->constant; s->gi_start[gid] = start;
    return gid;
}

/* Where an instance of `shape` could go now: its start, -1 when nowhere. */
static int free_start(const state_t *s, const model_t *m, const shape_t *shape, int want) {
    int slices, count = 0;
    unsigned int mask = used_slots(s, m, &slices);
    for (int i = 0; i < GIS; i++) count += s->gi_used[i] && s->gi_profile[i] == shape->constant;
    if (count >= shape->max || slices + shape->slices > COMPUTE_SLICES(m)) return -1;
    for (int start = 0; start < m->slots; start++) {
        if (want >= 0 && start != want) continue;
        unsigned int need = ((1u << shape->size) - 1) << start;
        if ((shape->starts >> start & 1) && !(mask & need)) return start;
    }
    return -1;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
        unsigned int id, placement_t *placements, unsigned int *count) {
    const model_t *m; const shape_t *shape;
    nvmlReturn_t r = begin_shape(device, id, &m, &shape);
    if (r) return r;
    unsigned int n = 0;
    for (unsigned int start = 0; start < (unsigned int)m->slots; start++) {
        if (!(shape->starts >> start & 1)) continue;
        if (placements && n >= *count) return 7; /* INSUFFICIENT_SIZE */
        if (placements) placements[n] = (placement_t){start, (unsigned int)shape->size};
        n++;
    }
    *count = n;
    return 0;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int id,
                                                       unsigned int *count) {
    const model_t *m; const shape_t *shape;
    nvmlReturn_t r = begin_shape(device, id, &m, &shape);
    if (r) return r;
    state_t s;
    peek(device->index, &s);
    if (!s.current) return NOT_SUPPORTED;
    *count = 0;
    for (int start; (start = free_start(&s, m, shape, -1)) >= 0; (*count)++) {
        add_gi(&s, m, shape, start);
    }
    return 0;
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned int id, int want, gi_t **out) {
    const model_t *m; const shape_t *shape;
    nvmlReturn_t r = begin_shape(device, id, &m, &shape);
    if (r) return r;
    int g = device->index;
    state_t s;
    load(g, &s);
    int start = s.current ? free_start(&s, m, shape, want) : -1;
    if (!s.current) r = NOT_SUPPORTED;
    else if (start < 0) r = NO_ROOM;
    else {
        int gid = add_gi(&s, m, shape, start);
        save(g, &s);
        gi_handles[g][gid] = (gi_t){g, gid};
        *out = &gi_handles[g][gid];
    }
    unlock();
    return r;
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int id, gi_t **out) {
    return create_gi(device, id, -1, out);
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int id,
        const placement_t *placement, gi_t **out) {
    const model_t *m; const shape_t *shape;
    nvmlReturn_t r = begin_shape(device, id, &m, &shape);
    if (r) return r;
    if (placement->start >= (unsigned int)m->slots || !(shape->starts >> placement->start & 1)
        || placement->size != (unsigned int)shape->size) return INVALID;
    return create_gi(device, id, (int)placement->start, out);
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int id, gi_t **array,
                                       unsigned int *count) {
    const model_t *m; const shape_t *shape;
    nvmlReturn_t r = begin_shape(device, id, &m, &shape);
    if (r) return r;
    int g = device->index;
    state_t s;
    peek(g, &s);
    if (!s.current) return NOT_SUPPORTED;
    *count = 0;
    for (int i = 0; i < GIS; i++) {
        if (!s.gi_used[i] || s.gi_profile[i] != shape->constant) continue;
        gi_handles[g][i] = (gi_t){g, i};
        array[(*count)++] = &gi_handles[g][i];
    }
    return 0;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, gi_t **out) {
    const model_t *m;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    state_t s;
    peek(device->index, &s);
    if (id >= GIS || !s.gi_used[id]) return 6; /* NOT_FOUND */
    gi_handles[device->index][id] = (gi_t){device->index, (int)id};
    *out = &gi_handles[device->index][id];
    return 0;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(gi_t *gi, gi_info_t *info) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 0);
    if (r) return r;
    info->device = &gpus[gi->gpu];
    info->id = (unsigned int)gi->id;
    info->profileId = (unsigned int)shape->id;
    info->placement = (placement_t){(unsigned int)s.gi_start[gi->id], (unsigned int)shape->size};
    return 0;
}

nvmlReturn_t nvmlGpuInstanceDestroy(gi_t *gi) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 1);
    if (r) return r;
    int computes = 0;
    for (int c = 0; c < CIS; c++) computes += s.ci_used[gi->id][c];
    if (busy(gi->gpu) || computes) r = IN_USE;
    else {
        s.gi_used[gi->id] = 0;
        save(gi->gpu, &s);
    }
    unlock();
    return r;
}

static nvmlReturn_t ci_profile(gi_t *gi, unsigned int constant, ci_profile_t *info, char *name,
                               size_t size) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 0);
    if (r) return r;
    if (constant >= CI_PROFILE_COUNT) return INVALID;
    if (constant > 4 || CI_SLICES[constant] > shape->slices) return NOT_SUPPORTED;
    int slices = CI_SLICES[constant];
    memset(info, 0, sizeof *info);
    info->id = constant;
    info->sliceCount = (unsigned int)slices;
    info->instanceCount = (unsigned int)(shape->slices / slices);
    info->multiprocessorCount = 14u * (unsigned int)slices;
    (void)m;
    if (name && slices == shape->slices) snprintf(name, size, "MIG %s", shape->name);
    else if (name) snprintf(name, size, "MIG %dc.%s", slices, shape->name);
    return 0;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_t *gi, unsigned int profile,
        unsigned int engine, ci_profile_t *info) {
    (void)engine;
    return ci_profile(gi, profile, info, NULL, 0);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi_t *gi, unsigned int profile,
        unsigned int engine, ci_profile_v2_t *info) {
    (void)engine;
    if (info->version != 0x02000088u) return 25;
    return ci_profile(gi, profile, &info->info, info->name, sizeof info->name);
}

static int ci_room(const state_t *s, int gid, const shape_t *shape, unsigned int constant) {
    int used = 0, same = 0;
    for (int c = 0; c < CIS; c++) {
        if (!s->ci_used[gid][c]) continue;
        used += CI_SLICES[s->ci_profile[gid][c]];
        same += s->ci_profile[gid][c] == (int)constant;
    }
    int slices = CI_SLICES[constant];
    int by_slices = (shape->slices - used) / slices, by_count = shape->slices / slices - same;
    return by_slices < by_count ? by_slices : by_count;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi_t *gi, unsigned int id,
                                                                unsigned int *count) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 0);
    if (r) return r;
    if (id > 4) return INVALID;
    if (CI_SLICES[id] > shape->slices) return NOT_SUPPORTED;
    *count = (unsigned int)ci_room(&s, gi->id, shape, id);
    return 0;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(gi_t *gi, unsigned int id, ci_t **out) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 1);
    if (r) return r;
    int cid = -1, start = 0;
    for (int c = CIS - 1; c >= 0; c--) {
        if (!s.ci_used[gi->id][c]) cid = c;
        else start += CI_SLICES[s.ci_profile[gi->id][c]];
    }
    if (id > 4 || CI_SLICES[id] > shape->slices) r = INVALID;
    else if (cid < 0 || ci_room(&s, gi->id, shape, id) < 1) r = NO_ROOM;
    else {
        s.ci_used[gi->id][cid] = 1; s.ci_profile[gi->id][cid] = (int)id;
        s.ci_start[gi->id][cid] = start;
        save(gi->gpu, &s);
        ci_handles[gi->gpu][gi->id][cid] = (ci_t){gi->gpu, gi->id, cid};
        *out = &ci_handles[gi->gpu][gi->id][cid];
    }
    unlock();
    return r;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(gi_t *gi, unsigned int id, ci_t **array,
                                                unsigned int *count) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 0);
    if (r) return r;
    if (id > 4) return INVALID;
    *count = 0;
    for (int c = 0; c < CIS; c++) {
        if (!s.ci_used[gi->id][c] || s.ci_profile[gi->id][c] != (int)id) continue;
        ci_handles[gi->gpu][gi->id][c] = (ci_t){gi->gpu, gi->id, c};
        array[(*count)++] = &ci_handles[gi->gpu][gi->id][c];
    }
    return 0;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(gi_t *gi, unsigned int id, ci_t **out) {
    state_t s; const model_t *m; const shape_t *shape;
    nvmlReturn_t r = gi_of(gi, &s, &m, &shape, 0);
    if (r) return r;
    if (id >= CIS || !s.ci_used[gi->id][id]) return 6;
    ci_handles[gi->gpu][gi->id][id] = (ci_t){gi->gpu, gi->id, (int)id};
    *out = &ci_handles[gi->gpu][gi->id][id];
    return 0;
}

/* The compute instance behind a handle (its GPU instance loaded); INVALID when gone. */
static nvmlReturn_t ci_of(ci_t *ci, state_t *s, int lock) {
    const model_t *m; const shape_t *shape;
    if (!ci || ci->id < 0 || ci->id >= CIS) return INVALID;
    gi_t gi = {ci->gpu, ci->gi};
    nvmlReturn_t r = gi_of(&gi, s, &m, &shape, lock);
    if (r) return r;
    if (s->ci_used[ci->gi][ci->id]) return 0;
    if (lock) unlock();
    return INVALID;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(ci_t *ci, ci_info_t *info) {
    state_t s;
    nvmlReturn_t r = ci_of(ci, &s, 0);
    if (r) return r;
    int profile = s.ci_profile[ci->gi][ci->id];
    info->device = &gpus[ci->gpu];
    info->gpuInstance = &gi_handles[ci->gpu][ci->gi];
    gi_handles[ci->gpu][ci->gi] = (gi_t){ci->gpu, ci->gi};
    info->id = (unsigned int)ci->id;
    info->profileId = (unsigned int)profile;
    info->placement = (placement_t){(unsigned int)s.ci_start[ci->gi][ci->id],
                                    (unsigned int)CI_SLICES[profile]};
    return 0;
}

nvmlReturn_t nvmlComputeInstanceDestroy(ci_t *ci) {
    state_t s;
    nvmlReturn_t r = ci_of(ci, &s, 1);
    if (r) return r;
    if (busy(ci->gpu)) r = IN_USE;
    else {
        s.ci_used[ci->gi][ci->id] = 0;
        save(ci->gpu, &s);
    }
    unlock();
    return r;
}
