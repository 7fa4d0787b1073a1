/* The NVML stand-in's NVLink fabric state and Xid events (see nvml_standin.c's header for
 * FAKE_NVML_FABRIC_FILE, FAKE_NVML_EVENTS and FAKE_NVML_XID_FILE). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>

#include "nvml_standin.h"

/* ---- NVLink fabric ---- */

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

/* nvmlGpuFabricInfo_v2_t (0x02000024) and _v3_t (0x03000028, adds healthSummary). */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary;
} nvmlGpuFabricInfoV_t;

#define FABRIC_INFO_V2 0x02000024u
#define FABRIC_INFO_V3 0x03000028u

/* GPU index's fabric line: 0 with state/status/mask set, or 3 (NOT_SUPPORTED). */
static nvmlReturn_t fabric_of(int index, unsigned int *state, int *status,
                              unsigned int *mask) {
    *state = (unsigned int)env_int("FAKE_NVML_FABRIC_STATE", 3);
    *status = 0; *mask = 0;
    const char *path = getenv("FAKE_NVML_FABRIC_FILE");
    FILE *file = path && *path ? fopen(path, "r") : NULL;
    if (!file) return 0;
    char line[128];
    nvmlReturn_t result = 0;
    for (int i = 0; fgets(line, sizeof line, file); i++) {
        if (i != index) continue;
        if (strncmp(line, "unsupported", 11) == 0) { result = 3; break; }
        unsigned int s = 0, m = 0; int st = 0;
        int n = sscanf(line, "%u %d %u", &s, &st, &m);
        if (n >= 1) *state = s;
        if (n >= 2) *status = st;
        if (n >= 3) *mask = m;
        break;
    }
    fclose(file);
    return result;
}

static void cluster_uuid(unsigned char *uuid) {
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xc0 + i);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    unsigned int state, mask; int status;
    nvmlReturn_t result = fabric_of(device->index, &state, &status, &mask);
    if (result) return result;
    memset(info, 0, sizeof *info);
    cluster_uuid(info->clusterUuid);
    info->state = state;
    info->status = status;
    return 0;
}

#ifndef OMIT_FABRIC_V
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info) {
    unsigned int version = info->version;
    if (version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3)
        return 25; /* ARGUMENT_VERSION_MISMATCH */
    unsigned int state, mask; int status;
    nvmlReturn_t result = fabric_of(device->index, &state, &status, &mask);
    if (result) return result;
    memset(info, 0, version == FABRIC_INFO_V2 ? 36 : 40);
    info->version = version;
    cluster_uuid(info->clusterUuid);
    info->state = state;
    info->status = status;
    info->healthMask = mask;
    if (version == FABRIC_INFO_V3) info->healthSummary = state == 3 && status == 0 ? 1 : 2;
    return 0;
}
#endif

/* ---- Xid events ---- */

#define EVENT_XID 0x8ULL
#define SUPPORTED_EVENTS 0x1FULL /* SBE, DBE, PState, Xid, clock */

typedef struct { unsigned long long registered[64]; } event_set_t;
typedef event_set_t *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

static int events_unsupported(void) {
    return strcmp(env_str("FAKE_NVML_EVENTS", "supported"), "unsupported") == 0;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *types) {
    (void)device;
    if (!initialized) return 1;
    *types = events_unsupported() ? 0 : SUPPORTED_EVENTS;
    return 0;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized) return 1;
    *set = calloc(1, sizeof(event_set_t));
    return *set ? 0 : 6; /* MEMORY */
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                      nvmlEventSet_t set) {
    if (!initialized) return 1;
    if (!set) return 2;
    if (events_unsupported() || (types & ~SUPPORTED_EVENTS)) return 3;
    set->registered[device->index] |= types;
    return 0;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return 0;
}

/* Take the next complete, undelivered line of the Xid file (under an flock, so each line
 * goes to exactly one reader across processes). 1 when a line was taken. */
static int next_xid(int *gpu, unsigned long long *xid) {
    const char *path = getenv("FAKE_NVML_XID_FILE");
    if (!path || !*path) return 0;
    char offset_path[4096];
    snprintf(offset_path, sizeof offset_path, "%s.delivered", path);
    FILE *marks = fopen(offset_path, "a+");
    if (!marks) return 0;
    flock(fileno(marks), LOCK_EX);
    long offset = 0;
    rewind(marks);
    if (fscanf(marks, "%ld", &offset) != 1) offset = 0;
    int taken = 0;
    FILE *file = fopen(path, "r");
    char line[256];
    if (file && fseek(file, 0, SEEK_END) == 0 && ftell(file) < offset)
        offset = 0; /* the file was truncated: start again from its beginning */
    if (file && fseek(file, offset, SEEK_SET) == 0 && fgets(line, sizeof line, file)
            && strchr(line, '\n')) {
        offset += (long)strlen(line);
        taken = sscanf(line, "%d %llu", gpu, xid) == 2 ? 1 : -1;
        FILE *out = fopen(offset_path, "w");
        if (out) { fprintf(out, "%ld\n", offset); fclose(out); }
    }
    if (file) fclose(file);
    flock(fileno(marks), LOCK_UN);
    fclose(marks);
    return taken;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    if (!initialized) return 1;
    if (!set || !data) return 2;
    struct timespec step = {0, 20 * 1000 * 1000};
    for (unsigned int waited = 0;;) {
        int gpu = 0; unsigned long long xid = 0;
        int taken = next_xid(&gpu, &xid);
        if (taken == 1 && gpu >= 0 && gpu < gpu_count()
                && (set->registered[gpu] & EVENT_XID)) {
            gpus[gpu].index = gpu;
            memset(data, 0, sizeof *data);
            data->device = &gpus[gpu];
            data->eventType = EVENT_XID;
            data->eventData = xid;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            return 0;
        }
        if (taken) continue; /* a line for no registered GPU: dropped, look again */
        if (waited >= timeoutms) return 10; /* TIMEOUT */
        nanosleep(&step, NULL);
        waited += 20;
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                              unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
