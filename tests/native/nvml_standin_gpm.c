/* GPU Performance Monitoring (GPM) in the NVML stand-in, as NVIDIA/go-nvml `gen/nvml/nvml.h`
 * at 2f9e261fe40a7a1c54783d66805e8920564763b4 declares it:
 *   nvmlGpmMetric_t, nvmlGpmMetricsGet_t, nvmlGpmSupport_t        lines 13803-13838
 *   nvmlGpmMetricsGet (13872): metrics from two samples of the same device, sample1 the
 *     earlier; each metric's own nvmlReturn says whether its value is valid
 *   nvmlGpmSampleFree (13886), nvmlGpmSampleAlloc (13902): opaque sample buffers
 *   nvmlGpmSampleGet (13922): reads the device's counters into a buffer
 *   nvmlGpmQueryDeviceSupport (13960): isSupportedDevice, Hopper and later
 *   metric ids 13483-13491: SM_UTIL 2, SM_OCCUPANCY 3, ANY_TENSOR_UTIL 5, DRAM_BW_UTIL 10,
 *     each a percentage 0.0 - 100.0 over the interval between the two samples
 *
 * Each GPU's counters run on CLOCK_MONOTONIC: one elapsed "cycle" per nanosecond, and per
 * metric an active count that advances at the percentage its line of FAKE_NVML_METRICS_FILE
 * gives (read at each sample, held since the GPU's previous sample):
 *     sm_active=P sm_occupancy=P tensor_active=P dram_active=P   (percent, default 0)
 *     gpm=unsupported   isSupportedDevice 0 and nvmlGpmSampleGet NOT_SUPPORTED (a GPU
 *                       before Hopper)
 * so a metric over two samples is 100 * (active2 - active1) / (elapsed2 - elapsed1): the
 * file's percentage when it held over the interval, the time-weighted mean when it changed.
 * Another metric id gets its own nvmlReturn NOT_SUPPORTED; samples of two devices, or
 * sample2 not later than sample1, fail the call with INVALID_ARGUMENT.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_standin.h"

#define NOT_SUPPORTED 3
#define INVALID_ARGUMENT 2
#define VERSION_MISMATCH 25
#define KINDS 4

typedef struct nvmlGpmSample_st {
    int device;  /* GPU index; -1 until sampled */
    double elapsed;
    double active[KINDS];
} *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName; char *longName; char *unit; } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[]; /* NVML_GPM_METRIC_MAX in the header; numMetrics are used */
} nvmlGpmMetricsGet_t;

typedef struct { unsigned int version; unsigned int isSupportedDevice; } nvmlGpmSupport_t;

static const unsigned int kind_ids[KINDS] = {2, 3, 5, 10};
static const char *kind_keys[KINDS] = {"sm_active", "sm_occupancy", "tensor_active",
                                       "dram_active"};
static const char *kind_names[KINDS] = {"SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL",
                                        "DRAM_BW_UTIL"};
static struct { int started; double last_ns, elapsed, active[KINDS]; } counters[64];

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int unsupported(int index) {
    char text[32];
    return metrics_value(index, "gpm", text, sizeof text) && strcmp(text, "unsupported") == 0;
}

static double percent(int index, const char *key) {
    char text[64];
    return metrics_value(index, key, text, sizeof text) ? strtod(text, NULL) : 0.0;
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    if (!initialized) return 1;
    if (!device || !support) return INVALID_ARGUMENT;
    if (support->version != 1) return VERSION_MISMATCH;
    support->isSupportedDevice = unsupported(device->index) ? 0 : 1;
    return 0;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!sample) return INVALID_ARGUMENT;
    *sample = calloc(1, sizeof **sample);
    if (!*sample) return 20; /* NVML_ERROR_MEMORY */
    (*sample)->device = -1;
    return 0;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!sample) return INVALID_ARGUMENT;
    free(sample);
    return 0;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    if (!initialized) return 1;
    if (!device || !sample || device->index < 0 || device->index >= 64) return INVALID_ARGUMENT;
    int index = device->index;
    nvmlReturn_t error = metrics_error(index);
    if (error) return error;
    if (unsupported(index)) return NOT_SUPPORTED;
    double now = now_ns();
    if (!counters[index].started) {
        counters[index].started = 1;
        counters[index].last_ns = now;
    }
    double span = now - counters[index].last_ns;
    counters[index].last_ns = now;
    counters[index].elapsed += span;
    for (int k = 0; k < KINDS; k++)
        counters[index].active[k] += span * percent(index, kind_keys[k]) / 100.0;
    sample->device = index;
    sample->elapsed = counters[index].elapsed;
    memcpy(sample->active, counters[index].active, sizeof sample->active);
    return 0;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    if (!initialized) return 1;
    if (!get) return INVALID_ARGUMENT;
    if (get->version != 1) return VERSION_MISMATCH;
    nvmlGpmSample_t first = get->sample1, second = get->sample2;
    if (!first || !second || first->device < 0 || first->device != second->device
            || second->elapsed <= first->elapsed)
        return INVALID_ARGUMENT;
    double span = second->elapsed - first->elapsed;
    for (unsigned int i = 0; i < get->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &get->metrics[i];
        metric->nvmlReturn = NOT_SUPPORTED;
        metric->value = 0.0;
        memset(&metric->metricInfo, 0, sizeof metric->metricInfo);
        for (int k = 0; k < KINDS; k++) {
            if (metric->metricId != kind_ids[k]) continue;
            metric->nvmlReturn = 0;
            metric->value = 100.0 * (second->active[k] - first->active[k]) / span;
            metric->metricInfo.shortName = (char *)kind_names[k];
            metric->metricInfo.unit = (char *)"%";
        }
    }
    return 0;
}
