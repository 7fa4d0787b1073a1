/* A stand-in for NVIDIA's libnvidia-ml.so.1, so the real pynvml runs with no GPU.
 *
 * Behaviour comes from environment variables, read on every call:
 *   FAKE_NVML_INIT_ERROR    NVML return code for nvmlInitWithFlags (e.g. 9, 18)
 *   FAKE_NVML_INIT_FAILURES a file holding N: the next N inits fail with 9 (a module that
 *                           is still coming up), each decrementing N
 *   FAKE_NVML_GPUS          number of GPUs (default 1)
 *   FAKE_NVML_DRIVER        driver version string (default 535.261.03)
 *   FAKE_NVML_CUDA          CUDA driver version as an int (default 12020)
 *   FAKE_NVML_NAME          GPU name (default "NVIDIA A100-SXM4-40GB")
 *   FAKE_NVML_NAMES         comma-separated names per GPU index (a mixed node); an index
 *                           past the list takes the last name
 *   FAKE_NVML_NAME_HEX      "<index>:<hex bytes>[,...]": that GPU's name is these raw bytes
 *                           (e.g. "1:4e56ff" for "NV\xff", not UTF-8: the real pynvml's
 *                           convertStrBytes then raises UnicodeDecodeError)
 *   FAKE_NVML_UUID_HEX      the same for nvmlDeviceGetUUID
 *   FAKE_NVML_MEMORY_MIB    comma-separated total memory per GPU in MiB (default 40960)
 *   FAKE_NVML_COMPUTE       comma-separated compute capability per GPU, "8.0" (default);
 *                           "unsupported" makes the query return NOT_SUPPORTED
 *   FAKE_NVML_BUS_IDS       comma-separated PCI bus ids (default 00000000:1<i>:00.0)
 *   FAKE_NVML_DEVICE_ERROR  "<index>:<code>": nvmlDeviceGetHandleByIndex fails there
 *   FAKE_NVML_ECC           "unsupported" makes nvmlDeviceGetEccMode return NOT_SUPPORTED
 *   FAKE_NVML_PENDING_PAGES "1": retired pages pending on every GPU
 *   FAKE_NVML_FABRIC_STATE  NVSwitch fabric state of every GPU (default 3, completed), for
 *                           GPUs the fabric file does not name
 *   FAKE_NVML_FABRIC_FILE   per-GPU fabric, re-read on every call: line i is GPU i's
 *                           "<state> <status> [healthMask]" (state as NVML's 0..3:
 *                           not-supported, not-started, in-progress, completed; status an
 *                           NVML return code), or "unsupported" (the call itself returns
 *                           NOT_SUPPORTED, as on pre-Hopper GPUs). The daemon stand-ins
 *                           (tests/native/daemons.py) rewrite it atomically.
 *   FAKE_NVML_PERSISTENCE_FILE  persistence mode is enabled while this file holds "1"
 *                           (nvidia-persistenced's stand-in writes it); unset: enabled
 *   FAKE_NVML_EVENTS        "unsupported": no event types supported (Xid falls back to kmsg)
 *   FAKE_NVML_XID_FILE      Xid events: lines "<gpu index> <xid>" appended to it; each line
 *                           is delivered once across all processes (the consumed byte offset
 *                           is kept in "<file>.delivered") by nvmlEventSetWait(_v2) to an
 *                           event set registered for nvmlEventTypeXidCriticalError on that
 *                           GPU; Wait sleeps in 20 ms steps up to its timeout, then returns
 *                           NVML_ERROR_TIMEOUT (10)
 * The fabric and Xid event parts live in nvml_standin_fabric.c, the metrics' readings
 * (FAKE_NVML_METRICS_FILE: UUIDs, utilisation samples, memory used, temperature, power, ECC
 * counts, remapped rows) in nvml_standin_metrics.c (both compiled into the same library).
 * Built with -DOMIT_DRIVER_VERSION it lacks nvmlSystemGetDriverVersion (NVML error 13);
 * with -DOMIT_FABRIC_V it lacks nvmlDeviceGetGpuFabricInfoV (callers fall back).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_standin.h"

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

gpu_t gpus[64];
int initialized;

int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

const char *env_str(const char *name, const char *fallback) {
    const char *value = getenv(name);
    return value && *value ? value : fallback;
}

int gpu_count(void) {
    int count = env_int("FAKE_NVML_GPUS", 1);
    return count < 0 ? 0 : (count > 64 ? 64 : count);
}

static nvmlReturn_t copy_out(char *out, unsigned int length, const char *text) {
    if (strlen(text) + 1 > length) return 7; /* INSUFFICIENT_SIZE */
    strcpy(out, text);
    return 0;
}

static int consume_failure(void) {
    const char *path = getenv("FAKE_NVML_INIT_FAILURES");
    if (!path || !*path) return 0;
    FILE *file = fopen(path, "r+");
    if (!file) return 0;
    int left = 0;
    if (fscanf(file, "%d", &left) != 1) left = 0;
    if (left > 0) {
        rewind(file);
        fprintf(file, "%d\n", left - 1);
    }
    fclose(file);
    return left > 0;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    int error = env_int("FAKE_NVML_INIT_ERROR", 0);
    if (error) return error;
    if (consume_failure()) return 9;
    initialized = 1;
    return 0;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return 1; /* UNINITIALIZED */
    initialized = 0;
    return 0;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

#ifndef OMIT_DRIVER_VERSION
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return 1;
    return copy_out(version, length, env_str("FAKE_NVML_DRIVER", "535.261.03"));
}
#endif

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialized) return 1;
    *version = env_int("FAKE_NVML_CUDA", 12020);
    return 0;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return 1;
    *count = (unsigned int)gpu_count();
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return 1;
    if ((int)index >= gpu_count()) return 2; /* INVALID_ARGUMENT */
    const char *fail = getenv("FAKE_NVML_DEVICE_ERROR");
    if (fail && *fail) {
        unsigned int bad = 0; int code = 0;
        if (sscanf(fail, "%u:%d", &bad, &code) == 2 && bad == index) return code;
    }
    gpus[index].index = (int)index;
    *device = &gpus[index];
    return 0;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!initialized) return 1;
    *index = (unsigned int)device->index;
    return 0;
}

/* The index-th item of a comma-separated env list (the last one past its end), or 0. */
static int list_item(const char *env, int index, char *out, size_t size) {
    const char *p = getenv(env);
    if (!p || !*p) return 0;
    for (int i = 0; i < index; i++) {
        const char *next = strchr(p, ',');
        if (!next) break;
        p = next + 1;
    }
    size_t n = strcspn(p, ",");
    if (n >= size) n = size - 1;
    memcpy(out, p, n); out[n] = 0;
    return 1;
}

/* GPU `index`'s raw bytes from "<index>:<hex>[,<index>:<hex>...]" in `env` into `out`
 * (NUL-terminated), or 0 when the list does not name that GPU. */
static int hex_item(const char *env, int index, char *out, size_t size) {
    const char *p = getenv(env);
    while (p && *p) {
        char *colon;
        long at = strtol(p, &colon, 10);
        if (*colon != ':') return 0;
        const char *hex = colon + 1;
        size_t n = strcspn(hex, ",");
        if (at == index) {
            size_t k = 0;
            for (; k + 1 < size && 2 * k + 1 < n; k++) {
                unsigned int byte;
                if (sscanf(hex + 2 * k, "%2x", &byte) != 1) break;
                out[k] = (char)byte;
            }
            out[k] = 0;
            return 1;
        }
        p = hex[n] == ',' ? hex + n + 1 : NULL;
    }
    return 0;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    char item[96];
    if (hex_item("FAKE_NVML_NAME_HEX", device->index, item, sizeof item))
        return copy_out(name, length, item);
    if (list_item("FAKE_NVML_NAMES", device->index, item, sizeof item))
        return copy_out(name, length, item);
    return copy_out(name, length, env_str("FAKE_NVML_NAME", "NVIDIA A100-SXM4-40GB"));
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    char item[32] = "8.0";
    list_item("FAKE_NVML_COMPUTE", device->index, item, sizeof item);
    if (strcmp(item, "unsupported") == 0) return 3;
    if (sscanf(item, "%d.%d", major, minor) != 2) return 2;
    return 0;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    char text[96];
    nvmlReturn_t mig;
    if (mig_uuid(device, uuid, length, &mig)) return mig; /* nvml_standin_mig_devices.c */
    if (hex_item("FAKE_NVML_UUID_HEX", device->index, text, sizeof text))
        return copy_out(uuid, length, text);
    if (!metrics_value(device->index, "uuid", text, sizeof text))
        snprintf(text, sizeof text, "GPU-5fa0c2d4-0000-4000-8000-%012d", device->index);
    return copy_out(uuid, length, text);
}

static void bus_id(int index, char *out, size_t size) {
    const char *list = getenv("FAKE_NVML_BUS_IDS");
    if (list && *list) {
        const char *p = list;
        for (int i = 0; i < index && p; i++) { p = strchr(p, ','); if (p) p++; }
        if (p) {
            size_t n = strcspn(p, ",");
            if (n >= size) n = size - 1;
            memcpy(out, p, n); out[n] = 0;
            return;
        }
    }
    snprintf(out, size, "00000000:%02X:00.0", 0x10 + index);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    bus_id(device->index, pci->busId, sizeof pci->busId);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", pci->busId);
    pci->bus = 0x10 + (unsigned int)device->index;
    pci->pciDeviceId = 0x20b010de;
    return 0;
}

/* NVML's header: v1 `used` is reserved plus allocated memory, v2 gives `reserved` apart and
 * `used` without it (total = reserved + used + free); nvmlMemory_v2 is
 * NVML_STRUCT_VERSION(Memory, 2), sizeof the struct | 2 << 24. */
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static nvmlReturn_t memory_mib(int index, unsigned long long *total, unsigned long long *used,
                               unsigned long long *reserved) {
    char item[32] = "40960";
    list_item("FAKE_NVML_MEMORY_MIB", index, item, sizeof item);
    nvmlReturn_t error = metrics_error(index);
    if (error) return error;
    *total = strtoull(item, NULL, 10) * 1024 * 1024;
    *used = metrics_number(index, "mem_used_mib", 512) * 1024 * 1024;
    *reserved = metrics_number(index, "mem_reserved_mib", 0) * 1024 * 1024;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    unsigned long long allocated, reserved;
    nvmlReturn_t error = memory_mib(device->index, &memory->total, &allocated, &reserved);
    if (error) return error;
    memory->used = allocated + reserved;
    memory->free = memory->total - memory->used;
    return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (memory->version != ((unsigned int)sizeof(nvmlMemory_v2_t) | 2u << 24)) return 25;
    char text[32];
    if (metrics_value(device->index, "memory_v2", text, sizeof text) &&
        strcmp(text, "unsupported") == 0) return 3; /* NOT_SUPPORTED */
    nvmlReturn_t error = memory_mib(device->index, &memory->total, &memory->used,
                                    &memory->reserved);
    if (error) return error;
    memory->free = memory->total - memory->used - memory->reserved;
    return 0;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    (void)device;
    const char *path = getenv("FAKE_NVML_PERSISTENCE_FILE");
    *mode = 1;
    if (path && *path) {
        FILE *file = fopen(path, "r");
        int value = 0;
        if (!file || fscanf(file, "%d", &value) != 1) value = 0;
        if (file) fclose(file);
        *mode = value == 1;
    }
    return 0;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    (void)device;
    if (strcmp(env_str("FAKE_NVML_ECC", "on"), "unsupported") == 0) return 3;
    *current = 1; *pending = 1;
    return 0;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    (void)device;
    *pending = env_int("FAKE_NVML_PENDING_PAGES", 0);
    return 0;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr,
                                       unsigned int *unc, unsigned int *pending,
                                       unsigned int *failure) {
    nvmlReturn_t error = metrics_error(device->index);
    if (error) return error;
    *corr = (unsigned int)metrics_number(device->index, "remap_corr", 0);
    *unc = (unsigned int)metrics_number(device->index, "remap_unc", 0);
    *pending = (unsigned int)metrics_number(device->index, "remap_pending", 0);
    *failure = (unsigned int)metrics_number(device->index, "remap_failure", 0);
    return 0;
}
