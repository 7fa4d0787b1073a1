/* The NVML stand-in's MIG: mode switching, GPU and compute instances, placements, and the
 * capability files a driver publishes (compiled into the same library as nvml_standin.c).
 * This file holds the models, the state and the files, and the mode calls; the instance
 * calls are in nvml_standin_mig_instances.c, the MIG device handles (index, UUID
 * `MIG-...`, GI/CI ids) in nvml_standin_mig_devices.c, the shared types in
 * nvml_standin_mig.h.
 *
 * The calls, their structs, return codes and activation status follow NVML's own header,
 * NVIDIA/go-nvml `gen/nvml/nvml.h` at 2f9e261fe40a7a1c54783d66805e8920564763b4
 * (nvmlDeviceGetMigMode, nvmlDeviceSetMigMode, nvmlDeviceGetGpuInstanceProfileInfo(V),
 * nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDeviceCreateGpuInstance(WithPlacement),
 * nvmlGpuInstanceGetComputeInstanceProfileInfo(V), nvmlComputeInstanceDestroy, and the
 * nvmlReturn_t values); the models' sizes and placements come from NVIDIA's MIG User Guide
 * and mig-parted, as cited in nvml_standin_mig_models.c.
 *
 * Which GPUs have MIG, and with which sizes, comes from each GPU's FAKE_NVML_NAME(S) and
 * FAKE_NVML_MEMORY_MIB (see nvml_standin.c) looked up in nvml_standin_mig_models.c (NVIDIA's
 * published tables, transcribed there with their sources); any other GPU answers
 * NVML_ERROR_NOT_SUPPORTED (3). Instances take memory slots [start, start+size) of the
 * model's 8 (or 4) and at most 7 (or 4) compute slices in all. A GPU instance's id is its
 * place in the slot tree: slots/size - 1 + start/size (on 8 slots: 0 for size 8, 1 + start/4,
 * 3 + start/2, 7 + start). Compute instance profiles 0..4 (1, 2, 3, 4, 7 slices; id =
 * constant) fit in their GPU instance's slices; ids are the lowest free of 0..7.
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
 *   FAKE_NVML_MIG_PROFILES  "<constant>:<count>,...": the driver offers another count
 *                       of these GPU instance profiles per GPU than the table (a board
 *                       whose profiles differ from the published ones), and enforces it.
 *   FAKE_NVML_MIG_BUSY  comma-separated GPU indexes something holds: a mode change and
 *                       destroying an instance there answer NVML_ERROR_IN_USE (19).
 * Mode changes: an A100 keeps a new mode pending (nvmlDeviceSetMigMode's activation status
 * NVML_ERROR_RESET_REQUIRED, 16) until a reset; every other model switches at once. MIG off
 * with GPU instances left answers NVML_ERROR_IN_USE (19); a GPU instance with compute
 * instances refuses destruction the same way. A full GPU, an overlapping or an n+1-th
 * instance answers NVML_ERROR_INSUFFICIENT_RESOURCES (23); a placement the profile does not
 * offer, NVML_ERROR_INVALID_ARGUMENT (2).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvml_standin_mig.h"

gi_t gi_handles[64][GIS];

/* ---- models and shapes ---- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
typedef struct { unsigned long long total, free, used; } memory_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, memory_t *memory);

/* Is `word` in `name` as a word of its own (GH200 is not an H200, H200 not an H20)? */
static int has_word(const char *name, const char *word) {
    size_t n = strlen(word);
    for (const char *hit = strstr(name, word); hit; hit = strstr(hit + 1, word)) {
        int before = hit > name && isalnum((unsigned char)hit[-1]);
        if (!before && !isalnum((unsigned char)hit[n])) return 1;
    }
    return 0;
}

SHARED const model_t *model_of(nvmlDevice_t device) {
    char name[96] = "";
    memory_t memory;
    nvmlDeviceGetName(device, name, sizeof name);
    nvmlDeviceGetMemoryInfo(device, &memory);
    long mib = (long)(memory.total >> 20);
    for (const model_t *m = MIG_MODELS; m->family; m++)
        if (has_word(name, m->family) && mib < m->below_mib) return m;
    return NULL;
}

/* FAKE_NVML_MIG_PROFILES ("<constant>:<count>,..."): a board whose driver offers another
 * count of these profiles per GPU than the published table. NULL: no override. */
static const shape_t *overridden(const shape_t *shape) {
    static shape_t copies[0x12];
    const char *list = getenv("FAKE_NVML_MIG_PROFILES");
    int constant, count, used;
    while (list && sscanf(list, "%i:%i%n", &constant, &count, &used) == 2) {
        if (constant == shape->constant && constant >= 0 && constant < 0x12) {
            copies[constant] = *shape;
            copies[constant].max = count;
            return &copies[constant];
        }
        list += used + (list[used] == ',');
    }
    return NULL;
}

SHARED const shape_t *shape_by(const model_t *model, int constant, int id) {
    for (const shape_t *shape = model->shapes; shape->name; shape++) {
        if (constant >= 0 && shape->constant != constant) continue;
        if (id >= 0 && shape->id != id) continue;
        const shape_t *other = overridden(shape);
        return other ? other : shape;
    }
    return NULL;
}

SHARED int gi_id_of(const model_t *m, int start, int size) {
    return m->slots / size - 1 + start / size;
}

SHARED int memory_gb(const shape_t *shape) {
    return atoi(strchr(shape->name, '.') + 1);
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
SHARED int load(int g, state_t *s) {
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

SHARED void unlock(void) {
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = -1;
}

SHARED void save(int g, const state_t *s) {
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
SHARED void peek(int g, state_t *s) {
    if (load(g, s)) save(g, s);
    sync_caps(g, s);
    unlock();
}

SHARED int busy(int g) {
    const char *list = getenv("FAKE_NVML_MIG_BUSY");
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (atoi(p) == g) return 1;
    return 0;
}

SHARED nvmlReturn_t begin(nvmlDevice_t device, const model_t **model) {
    if (!initialized) return 1;
    if (!mig_dir()) return NOT_SUPPORTED;
    *model = model_of(device);
    return *model ? 0 : NOT_SUPPORTED;
}

/* begin() and the GPU-instance shape NVML's profile id names (INVALID when none). */
SHARED nvmlReturn_t begin_shape(nvmlDevice_t device, unsigned int id, const model_t **m,
                                const shape_t **shape) {
    nvmlReturn_t r = begin(device, m);
    if (r) return r;
    *shape = shape_by(*m, -1, (int)id);
    return *shape ? 0 : INVALID;
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

/* The GPU instance behind a handle, loaded (and locked when `lock`); INVALID when gone. */
SHARED nvmlReturn_t gi_of(gi_t *gi, state_t *s, const model_t **m, const shape_t **shape,
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
