/* The NVML stand-in's MIG: mode switching, GPU and compute instances, placements, and the
 * capability files a driver publishes (compiled into the same library as nvml_standin.c).
 *
 * Which GPUs have MIG, and with which sizes, comes from each GPU's FAKE_NVML_NAME(S) and
 * FAKE_NVML_MEMORY_MIB (see nvml_standin.c): a name with A100 (under 60 GiB: the 40GB sizes
 * 1g.5gb..7g.40gb, else the 80GB ones), H100 (under 87 GiB: 1g.10gb..7g.80gb, else the NVL
 * 94GB ones), H200, B200 or GB200 (no +me size) has MIG; any other GPU answers
 * NVML_ERROR_NOT_SUPPORTED (3). Every model has the same seven shapes (profile constant ->
 * NVML profile id, as nvidia-smi prints it): 1g (0 -> 19, starts 0..6, size 1, 7 of them),
 * 1g+me (7 -> 20, starts 0..6, size 1, one), 1g with double memory (9 -> 15, starts 0,2,4,6,
 * size 2, 4), 2g (1 -> 14, starts 0,2,4, size 2, 3), 3g (2 -> 9, starts 0,4, size 4, 2),
 * 4g (3 -> 5, start 0, size 4, 1), 7g (4 -> 0, start 0, size 8, 1); instances take memory
 * slots [start, start+size) of 8 and at most 7 compute slices in all. A GPU instance's id is
 * its place in the slot tree: 0 for size 8, 1 + start/4, 3 + start/2, 7 + start. Compute
 * instance profiles 0..4 (1, 2, 3, 4, 7 slices; id = constant) fit in their GPU instance's
 * slices; ids are the lowest free of 0..7.
 *
 * Environment (read on every call, like nvml_standin.c's):
 *   FAKE_NVML_MIG_DIR   directory holding the MIG state, one file per GPU ("gpu<i>": a line
 *                       "mode <current> <pending>", lines "gi <id> <profile constant>
 *                       <start>" and "ci <gi id> <ci id> <ci profile> <start>"), read and
 *                       rewritten atomically under an flock of "<dir>/lock" by every call,
 *                       so separate processes (a rerun) see one GPU state. Unset: every MIG
 *                       call answers NVML_ERROR_NOT_SUPPORTED (3). A missing file is MIG off,
 *                       no instances. A file "reset-gpu<i>" there is a GPU reset (or a
 *                       reboot): the next call on GPU i removes it, makes the pending mode
 *                       current and drops every instance, as a real reset does.
 *   FAKE_NVML_PROC_DIR  a test's /proc: the capability files are kept there as a driver
 *                       keeps them: "driver/nvidia-caps/mig-minors" (static: "config 1",
 *                       "monitor 2", then "gpu<g>/gi<i>/access <m>" and
 *                       "gpu<g>/gi<i>/ci<c>/access <m+1+c>" with m = 3 + 135*g + 9*i, for
 *                       g < 32, i < 15, c < 8), "driver/nvidia/capabilities/mig/config" and
 *                       ".../mig/monitor", and per instance "driver/nvidia/capabilities/
 *                       gpu<g>/mig/gi<i>/access" and ".../gi<i>/ci<c>/access" holding
 *                       "DeviceFileMinor: <m>\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
 *                       written when the instance is made and removed when it goes (g: the
 *                       GPU's index, the stand-in's device minor). Unset: none written.
 *   FAKE_NVML_MIG_BUSY  comma-separated GPU indexes something holds: a mode change and
 *                       destroying an instance there answer NVML_ERROR_IN_USE (19).
 * Mode changes: an A100 keeps a new mode pending (nvmlDeviceSetMigMode's activation status
 * NVML_ERROR_RESET_REQUIRED, 16) until a reset; every other model switches at once. MIG off
 * with GPU instances left answers NVML_ERROR_IN_USE (19); a GPU instance with compute
 * instances refuses destruction the same way. A full GPU, an overlapping or an n+1-th
 * instance answers NVML_ERROR_INSUFFICIENT_RESOURCES (23); a placement the profile does not
 * offer, NVML_ERROR_INVALID_ARGUMENT (2).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvml_standin.h"

#define GIS 15
#define CIS 8
#define NOT_SUPPORTED 3
#define INVALID 2
#define IN_USE 19
#define NO_ROOM 23

typedef struct { unsigned int start, size; } placement_t;
typedef struct { int gpu, id; } gi_t;
typedef struct { int gpu, gi, id; } ci_t;
typedef struct { nvmlDevice_t device; unsigned int id, profileId; placement_t placement; } gi_info_t;
typedef struct {
    nvmlDevice_t device; gi_t *gpuInstance; unsigned int id, profileId; placement_t placement;
} ci_info_t;

static gi_t gi_handles[64][GIS];
static ci_t ci_handles[64][GIS][CIS];

typedef struct {
    int current, pending;
    int gi_used[GIS], gi_profile[GIS], gi_start[GIS];
    int ci_used[GIS][CIS], ci_profile[GIS][CIS], ci_start[GIS][CIS];
} state_t;

/* ---- models and shapes ---- */

typedef struct { int constant, id, slices, size, max, mem_index; unsigned int starts; } shape_t;
static const shape_t SHAPES[] = {
    {0, 19, 1, 1, 7, 0, 0x7f}, {7, 20, 1, 1, 1, 0, 0x7f}, {9, 15, 1, 2, 4, 1, 0x55},
    {1, 14, 2, 2, 3, 2, 0x15}, {2, 9, 3, 4, 2, 3, 0x11}, {3, 5, 4, 4, 1, 4, 0x01},
    {4, 0, 7, 8, 1, 5, 0x01},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

typedef struct { const char *family; int below_mib; int gb[6]; int me; int reset; } model_t;
static const model_t MODELS[] = {
    {"A100", 61440, {5, 10, 10, 20, 20, 40}, 1, 1}, {"A100", 1 << 30, {10, 20, 20, 40, 40, 80}, 1, 1},
    {"H100", 89088, {10, 20, 20, 40, 40, 80}, 1, 0}, {"H100", 1 << 30, {12, 24, 24, 47, 47, 94}, 1, 0},
    {"H200", 1 << 30, {18, 35, 35, 71, 71, 141}, 1, 0}, {"GB200", 1 << 30, {24, 47, 47, 95, 95, 189}, 0, 0},
    {"B200", 1 << 30, {23, 45, 45, 90, 90, 180}, 1, 0},
};

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
typedef struct { unsigned long long total, free, used; } memory_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, memory_t *memory);

static const model_t *model_of(nvmlDevice_t device) {
    char name[96] = "";
    memory_t memory;
    nvmlDeviceGetName(device, name, sizeof name);
    nvmlDeviceGetMemoryInfo(device, &memory);
    long mib = (long)(memory.total >> 20);
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) {
        const char *hit = strstr(name, MODELS[i].family);
        if (!hit || (hit > name && hit[-1] == 'G') || mib >= MODELS[i].below_mib) continue;
        return &MODELS[i];
    }
    return NULL;
}

static const shape_t *shape_by(const model_t *model, int constant, int id) {
    for (int i = 0; i < NSHAPES; i++) {
        if (constant >= 0 && SHAPES[i].constant != constant) continue;
        if (id >= 0 && SHAPES[i].id != id) continue;
        if (SHAPES[i].constant == 7 && !model->me) return NULL;
        return &SHAPES[i];
    }
    return NULL;
}

static int gi_id_of(int start, int size) {
    return size == 8 ? 0 : size == 4 ? 1 + start / 4 : size == 2 ? 3 + start / 2 : 7 + start;
}

/* ---- files ---- */

static void mkdirs(const char *path) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(buf, 0755); *p = '/'; }
    mkdir(buf, 0755);
}

/* Write dir/name atomically, unless it already holds `text` (a read changes no file). */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[600], tmp[640], old[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *was = fopen(path, "r");
    if (was) {
        size_t n = fread(old, 1, sizeof old - 1, was);
        fclose(was);
        old[n] = 0;
        if (strcmp(old, text) == 0) return;
    }
    mkdirs(dir);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *file = fopen(tmp, "w");
    if (!file) return;
    fputs(text, file);
    fclose(file);
    rename(tmp, path);
}

static void cap_file(const char *dir, int minor) {
    char text[96];
    snprintf(text, sizeof text, "DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
             minor);
    write_file(dir, "access", text);
}

static void static_caps(const char *proc) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/driver/nvidia-caps", proc);
    snprintf(path, sizeof path, "%s/mig-minors", dir);
    if (access(path, F_OK) != 0) {
        size_t size = 160000, used = 0;
        char *text = malloc(size);
        if (!text) return;
        used += (size_t)snprintf(text, size, "config 1\nmonitor 2\n");
        for (int g = 0; g < 32; g++)
            for (int i = 0; i < GIS; i++) {
                int m = 3 + 135 * g + 9 * i;
                used += (size_t)snprintf(text + used, size - used, "gpu%d/gi%d/access %d\n", g, i, m);
                for (int c = 0; c < CIS; c++)
                    used += (size_t)snprintf(text + used, size - used, "gpu%d/gi%d/ci%d/access %d\n",
                                             g, i, c, m + 1 + c);
            }
        write_file(dir, "mig-minors", text);
        free(text);
    }
    snprintf(dir, sizeof dir, "%s/driver/nvidia/capabilities/mig", proc);
    write_file(dir, "config", "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n");
    write_file(dir, "monitor", "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
}

static void remove_cap(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/access", dir);
    unlink(path);
    rmdir(dir);
}

/* Make the per-instance capability files match the state of GPU g. */
static void sync_caps(int g, const state_t *s) {
    const char *proc = getenv("FAKE_NVML_PROC_DIR");
    if (!proc || !*proc) return;
    static_caps(proc);
    for (int i = 0; i < GIS; i++) {
        char gi_dir[512], ci_dir[560];
        snprintf(gi_dir, sizeof gi_dir, "%s/driver/nvidia/capabilities/gpu%d/mig/gi%d", proc, g, i);
        int m = 3 + 135 * g + 9 * i;
        for (int c = 0; c < CIS; c++) {
            snprintf(ci_dir, sizeof ci_dir, "%s/ci%d", gi_dir, c);
            if (s->gi_used[i] && s->ci_used[i][c]) cap_file(ci_dir, m + 1 + c);
            else if (access(ci_dir, F_OK) == 0) remove_cap(ci_dir);
        }
        if (s->gi_used[i]) cap_file(gi_dir, m);
        else if (access(gi_dir, F_OK) == 0) remove_cap(gi_dir);
    }
}

static const char *mig_dir(void) {
    const char *dir = getenv("FAKE_NVML_MIG_DIR");
    return dir && *dir ? dir : NULL;
}

static int lock_fd = -1;

/* Lock the state directory and load GPU g's state (applying a pending reset). */
static int load(int g, state_t *s) {
    const char *dir = mig_dir();
    char path[512];
    memset(s, 0, sizeof *s);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/lock", dir);
    lock_fd = open(path, O_CREAT | O_RDWR, 0644);
    if (lock_fd >= 0) flock(lock_fd, LOCK_EX);
    snprintf(path, sizeof path, "%s/gpu%d", dir, g);
    FILE *file = fopen(path, "r");
    char line[128];
    while (file && fgets(line, sizeof line, file)) {
        int a, b, c, d;
        if (sscanf(line, "mode %d %d", &a, &b) == 2) { s->current = a; s->pending = b; }
        else if (sscanf(line, "gi %d %d %d", &a, &b, &c) == 3 && a >= 0 && a < GIS) {
            s->gi_used[a] = 1; s->gi_profile[a] = b; s->gi_start[a] = c;
        } else if (sscanf(line, "ci %d %d %d %d", &a, &b, &c, &d) == 4 && a >= 0 && a < GIS
                   && b >= 0 && b < CIS) {
            s->ci_used[a][b] = 1; s->ci_profile[a][b] = c; s->ci_start[a][b] = d;
        }
    }
    if (file) fclose(file);
    snprintf(path, sizeof path, "%s/reset-gpu%d", dir, g);
    if (unlink(path) == 0) {
        int mode = s->pending;
        memset(s, 0, sizeof *s);
        s->current = s->pending = mode;
        return 1;
    }
    return 0;
}

static void unlock(void) {
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = -1;
}

static void save(int g, const state_t *s) {
    char name[32], text[8192];
    size_t used = (size_t)snprintf(text, sizeof text, "mode %d %d\n", s->current, s->pending);
    for (int i = 0; i < GIS; i++) {
        if (!s->gi_used[i]) continue;
        used += (size_t)snprintf(text + used, sizeof text - used, "gi %d %d %d\n", i,
                                 s->gi_profile[i], s->gi_start[i]);
        for (int c = 0; c < CIS; c++)
            if (s->ci_used[i][c])
                used += (size_t)snprintf(text + used, sizeof text - used, "ci %d %d %d %d\n", i, c,
                                         s->ci_profile[i][c], s->ci_start[i][c]);
    }
    snprintf(name, sizeof name, "gpu%d", g);
    write_file(mig_dir(), name, text);
    sync_caps(g, s);
}

/* Load for a read: the state, unlocked (a reset found is saved first). */
static void peek(int g, state_t *s) {
    if (load(g, s)) save(g, s);
    sync_caps(g, s);
    unlock();
}

static int busy(int g) {
    const char *list = getenv("FAKE_NVML_MIG_BUSY");
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (atoi(p) == g) return 1;
    return 0;
}

/* ---- the API ---- */

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

static nvmlReturn_t begin(nvmlDevice_t device, const model_t **model) {
    if (!initialized) return 1;
    if (!mig_dir()) return NOT_SUPPORTED;
    *model = model_of(device);
    return *model ? 0 : NOT_SUPPORTED;
}

/* begin() and the GPU-instance shape NVML's profile id names (INVALID when none). */
static nvmlReturn_t begin_shape(nvmlDevice_t device, unsigned int id, const model_t **m,
                                const shape_t **shape) {
    nvmlReturn_t r = begin(device, m);
    if (r) return r;
    *shape = shape_by(*m, -1, (int)id);
    return *shape ? 0 : INVALID;
}

static void profile_name(const model_t *m, const shape_t *shape, char *out, size_t size) {
    snprintf(out, size, "%dg.%dgb%s", shape->slices, m->gb[shape->mem_index],
             shape->constant == 7 ? "+me" : "");
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                  unsigned int *pending) {
    const model_t *m;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    state_t s;
    peek(device->index, &s);
    *current = (unsigned int)s.current; *pending = (unsigned int)s.pending;
    return 0;
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *status) {
    const model_t *m;
    nvmlReturn_t r = begin(device, &m);
    if (r) return r;
    if (mode > 1) return INVALID;
    state_t s;
    load(device->index, &s);
    int instances = 0;
    for (int i = 0; i < GIS; i++) instances += s.gi_used[i];
    if (busy(device->index) || (mode == 0 && instances)) r = IN_USE;
    else {
        s.pending = (int)mode;
        if (!m->reset) s.current = (int)mode;
        *status = s.current == s.pending ? 0 : 16; /* RESET_REQUIRED */
        save(device->index, &s);
    }
    unlock();
    return r;
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
    info->memorySizeMB = (unsigned long long)m->gb[shape->mem_index] * 1000ULL;
    char label[32];
    profile_name(m, shape, label, sizeof label);
    if (name) snprintf(name, size, "MIG %s", label);
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

static int add_gi(state_t *s, const shape_t *shape, int start) {
    int gid = gi_id_of(start, shape->size);
    s->gi_used[gid] = 1; s->gi_profile[gid] = shape->constant; s->gi_start[gid] = start;
    return gid;
}

/* Where an instance of `shape` could go now: its start, -1 when nowhere. */
static int free_start(const state_t *s, const model_t *m, const shape_t *shape, int want) {
    int slices, count = 0;
    unsigned int mask = used_slots(s, m, &slices);
    for (int i = 0; i < GIS; i++) count += s->gi_used[i] && s->gi_profile[i] == shape->constant;
    if (count >= shape->max || slices + shape->slices > 7) return -1;
    for (int start = 0; start < 8; start++) {
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
    for (unsigned int start = 0; start < 8; start++) {
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
        add_gi(&s, shape, start);
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
        int gid = add_gi(&s, shape, start);
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
    if (placement->start >= 8 || !(shape->starts >> placement->start & 1)
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

/* The GPU instance behind a handle, loaded (and locked when `lock`); INVALID when gone. */
static nvmlReturn_t gi_of(gi_t *gi, state_t *s, const model_t **m, const shape_t **shape,
                          int lock) {
    if (!initialized) return 1;
    if (!mig_dir() || !gi || gi->gpu < 0 || gi->gpu >= 64 || gi->id < 0 || gi->id >= GIS)
        return INVALID;
    *m = model_of(&gpus[gi->gpu]);
    if (!*m) return INVALID;
    if (lock) load(gi->gpu, s); else peek(gi->gpu, s);
    *shape = shape_by(*m, s->gi_profile[gi->id], -1);
    if (s->gi_used[gi->id] && *shape) return 0;
    if (lock) unlock();
    return INVALID;
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
    char label[32];
    profile_name(m, shape, label, sizeof label);
    if (name && slices == shape->slices) snprintf(name, size, "MIG %s", label);
    else if (name) snprintf(name, size, "MIG %dc.%s", slices, label);
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
