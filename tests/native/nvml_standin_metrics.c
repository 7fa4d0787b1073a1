/* The NVML stand-in's per-GPU readings for the agent's metrics.
 *
 *   FAKE_NVML_METRICS_FILE  re-read on every call; line i is GPU i's readings, as
 *                           space-separated key=value pairs (a key left out keeps its default):
 *     uuid=GPU-...          the GPU's UUID (default GPU-5fa0c2d4-0000-4000-8000-<index, 12 digits>)
 *     util=50[,70,...]      utilisation samples in percent (default 0): nvmlDeviceGetSamples
 *                           (NVML_GPU_UTILIZATION_SAMPLES) returns them 100 ms apart, the last
 *                           one "now" (CLOCK_REALTIME, microseconds), only those newer than the
 *                           caller's last-seen timestamp; nvmlDeviceGetUtilizationRates returns
 *                           the last one
 *     samples=unsupported   nvmlDeviceGetSamples returns NOT_SUPPORTED (callers fall back to
 *                           nvmlDeviceGetUtilizationRates)
 *     mem_used_mib=N        memory used in MiB (default 512; the total stays FAKE_NVML_MEMORY_MIB)
 *     mem_reserved_mib=N    memory the driver sets aside in MiB (default 0): nvmlDeviceGetMemoryInfo_v2's
 *                           `reserved`; v1's `used` is mem_used_mib plus this
 *     memory_v2=unsupported nvmlDeviceGetMemoryInfo_v2 returns NOT_SUPPORTED
 *     temp=N                GPU temperature in degrees C (default 40)
 *     power_mw=N            power draw in milliwatts (default 100000)
 *     ecc_corrected=N       volatile ECC counts, nvmlDeviceGetTotalEccErrors (default 0)
 *     ecc_uncorrected=N
 *     remap_corr=N remap_unc=N remap_pending=N remap_failure=N   nvmlDeviceGetRemappedRows
 *     minor=N               nvmlDeviceGetMinorNumber, /dev/nvidia<N> (default: the index)
 *     error=CODE            every reading of this GPU (the ones above, not its handle, name
 *                           or PCI id) fails with that NVML return code, e.g. 15 (GPU lost)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_standin.h"

typedef union {
    double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
    long long sllVal; int siVal; unsigned short usVal;
} nvmlValue_t;

typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

#define UTILIZATION_SAMPLES 1
#define MAX_SAMPLES 64

/* GPU index's value for `key` from the metrics file into `out`: 1 if present, else 0. */
int metrics_value(int index, const char *key, char *out, unsigned long size) {
    const char *path = getenv("FAKE_NVML_METRICS_FILE");
    FILE *file = path && *path ? fopen(path, "r") : NULL;
    if (!file) return 0;
    char line[1024];
    int found = 0;
    size_t klen = strlen(key);
    for (int i = 0; !found && fgets(line, sizeof line, file); i++) {
        if (i != index) continue;
        for (char *tok = strtok(line, " \t\n"); tok; tok = strtok(NULL, " \t\n")) {
            if (strncmp(tok, key, klen) == 0 && tok[klen] == '=') {
                snprintf(out, size, "%s", tok + klen + 1);
                found = 1;
                break;
            }
        }
        break;
    }
    fclose(file);
    return found;
}

unsigned long long metrics_number(int index, const char *key, unsigned long long fallback) {
    char text[64];
    return metrics_value(index, key, text, sizeof text) ? strtoull(text, NULL, 10) : fallback;
}

nvmlReturn_t metrics_error(int index) {
    if (!initialized) return 1;
    return (nvmlReturn_t)metrics_number(index, "error", 0);
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000;
}

/* The GPU's utilisation samples (percent), oldest first; returns how many. */
static int util_samples(int index, unsigned int *values) {
    char text[512] = "0";
    metrics_value(index, "util", text, sizeof text);
    int n = 0;
    for (char *p = text; *p && n < MAX_SAMPLES; n++) {
        values[n] = (unsigned int)strtoul(p, &p, 10);
        if (*p != ',') { n++; break; }
        p++;
    }
    return n;
}

nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, int type, unsigned long long last_seen,
                                  int *value_type, unsigned int *count, nvmlSample_t *samples) {
    nvmlReturn_t error = metrics_error(device->index);
    if (error) return error;
    char text[32];
    if (metrics_value(device->index, "samples", text, sizeof text)
            && strcmp(text, "unsupported") == 0)
        return 3;
    if (type != UTILIZATION_SAMPLES) return 3;
    unsigned int values[MAX_SAMPLES];
    int n = util_samples(device->index, values);
    unsigned long long now = now_us();
    unsigned int kept = 0;
    nvmlSample_t found[MAX_SAMPLES];
    for (int i = 0; i < n; i++) {
        unsigned long long stamp = now - (unsigned long long)(n - 1 - i) * 100000ULL;
        if (stamp <= last_seen) continue;
        found[kept].timeStamp = stamp;
        found[kept].sampleValue.ullVal = 0;
        found[kept].sampleValue.uiVal = values[i];
        kept++;
    }
    *value_type = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (!samples) { *count = kept; return kept ? 0 : 6; } /* 6: NOT_FOUND, no new samples */
    if (*count < kept) kept = *count;
    memcpy(samples, found, kept * sizeof *samples);
    *count = kept;
    return 0;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    nvmlReturn_t error = metrics_error(device->index);
    if (error) return error;
    unsigned int values[MAX_SAMPLES];
    int n = util_samples(device->index, values);
    util->gpu = n ? values[n - 1] : 0;
    util->memory = 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    nvmlReturn_t error = metrics_error(device->index);
    if (error) return error;
    if (sensor != 0) return 2;
    *temp = (unsigned int)metrics_number(device->index, "temp", 40);
    return 0;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    nvmlReturn_t error = metrics_error(device->index);
    if (error) return error;
    *milliwatts = (unsigned int)metrics_number(device->index, "power_mw", 100000);
    return 0;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter,
                                         unsigned long long *count) {
    nvmlReturn_t error = metrics_error(device->index);
    if (error) return error;
    if (counter != 0) return 2; /* only NVML_VOLATILE_ECC here */
    *count = metrics_number(device->index, error_type ? "ecc_uncorrected" : "ecc_corrected", 0);
    return 0;
}

/* /dev/nvidia<minor>: the index unless the metrics file says minor=N. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    if (!initialized) return 1;
    *minor = (unsigned int)metrics_number(device->index, "minor", (unsigned long long)device->index);
    return 0;
}
