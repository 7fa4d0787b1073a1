/* GPU Performance Monitoring (GPM) in the NVML stand-in, as NVIDIA/go-nvml `gen/nvml/nvml.h`
 * at 2f9e261fe40a7a1c54783d66805e8920564763b4 declares it:
 *   nvmlGpmMetric_t, nvmlGpmMetricsGet_t, nvmlGpmSupport_t        lines 13803-13838
 *   nvmlGpmMetricsGet (13872): metrics from two samples of the same device, sample1 the
 *     earlier; each metric's own nvmlReturn says whether its value is valid
 *   nvmlGpmSampleFree (13886), nvmlGpmSampleAlloc (13902): opaque sample buffers
 *   nvmlGpmSampleGet (13922): reads the device's counters into a buffer
 *   nvmlGpmMigSampleGet (13943): the same, for one MIG GPU instance (by its GI id) of the
 *     device; the header names no error for an id with no live instance, so the stand-in
 *     answers NOT_FOUND as nvmlDeviceGetGpuInstanceById documents for that case
 *   nvmlGpmQueryDeviceSupport (13960): isSupportedDevice, Hopper and later
 *   metric ids 13482-13491: GRAPHICS_UTIL 1, SM_UTIL 2, SM_OCCUPANCY 3, ANY_TENSOR_UTIL 5,
 *     DRAM_BW_UTIL 10, each a percentage 0.0 - 100.0 over the interval between the two
 *     samples
 *
 * Each GPU's counters run on CLOCK_MONOTONIC: one elapsed "cycle" per nanosecond, and per
 * metric an active count that advances at the percentage its line of FAKE_NVML_METRICS_FILE
 * gives (read at each sample, held since the GPU's previous sample):
 *     sm_active=P sm_occupancy=P tensor_active=P dram_active=P graphics_active=P
 *                       (percent, default 0)
 *     gpm=unsupported   isSupportedDevice 0 and nvmlGpmSampleGet NOT_SUPPORTED (a GPU
 *                       before Hopper; without it every GPU answers GPM, whatever its
 *                       FAKE_NVML_NAME: the sample nodes' A100s too, which real ones don't)
 *     gi<N>.sm_active=P ...   the same percentages for GPU instance N (MIG mode on and the
 *                       instance live, per nvml_standin_mig.c's state), default 0; a GPU
 *                       without MIG answers nvmlGpmMigSampleGet NOT_SUPPORTED
 * so a metric over two samples is 100 * (active2 - active1) / (elapsed2 - elapsed1): the
 * file's percentage when it held over the interval, the time-weighted mean when it changed.
 * Another metric id gets its own nvmlReturn NOT_SUPPORTED; samples of two devices (or of
 * two GPU instances, or of a GPU and one of its instances), or sample2 not later than
 * sample1, fail the call with INVALID_ARGUMENT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_standin_mig.h"

#define INVALID_ARGUMENT 2
#define NOT_FOUND 6
#define VERSION_MISMATCH 25
#define KINDS 5

typedef struct nvmlGpmSample_st {
    int device;  /* GPU index; -1 until sampled */
    int instance;  /* GPU instance id of a MIG sample; -1 for the whole GPU */
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

static const unsigned int kind_ids[KINDS] = {2, 3, 5, 10, 1};
static const char *kind_keys[KINDS] = {"sm_active", "sm_occupancy", "tensor_active",
                                       "dram_active", "graphics_active"};
static const char *kind_names[KINDS] = {"SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL",
                                        "DRAM_BW_UTIL", "GRAPHICS_UTIL"};
typedef struct { int started; double last_ns, elapsed, active[KINDS]; } counter_t;
static counter_t counters[64];
static counter_t instance_counters[64][GIS];

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
    (*sample)->instance = -1;
    return 0;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!sample) return INVALID_ARGUMENT;
    free(sample);
    return 0;
}

/* Advances `c` to now at the percentages `prefix`+kind give on GPU index's line; copies
 * its counts into `sample`. */
static void take(counter_t *c, int index, int instance, const char *prefix,
                 nvmlGpmSample_t sample) {
    double now = now_ns();
    if (!c->started) {
        c->started = 1;
        c->last_ns = now;
    }
    double span = now - c->last_ns;
    c->last_ns = now;
    c->elapsed += span;
    for (int k = 0; k < KINDS; k++) {
        char key[48];
        snprintf(key, sizeof key, "%s%s", prefix, kind_keys[k]);
        c->active[k] += span * percent(index, key) / 100.0;
    }
    sample->device = index;
    sample->instance = instance;
    sample->elapsed = c->elapsed;
    memcpy(sample->active, c->active, sizeof sample->active);
}

static int is_gpu_handle(nvmlDevice_t device) {
    return device >= &gpus[0] && device < &gpus[64];
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    if (!initialized) return 1;
    if (!device || !sample || device->index < 0 || device->index >= 64) return INVALID_ARGUMENT;
    int index = device->index;
    nvmlReturn_t error = metrics_error(index);
    if (error) return error;
    if (unsupported(index)) return NOT_SUPPORTED;
    take(&counters[index], index, -1, "", sample);
    return 0;
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                 nvmlGpmSample_t sample) {
    if (!initialized) return 1;
    if (!device || !sample || !is_gpu_handle(device) || device->index >= gpu_count())
        return INVALID_ARGUMENT;
    int index = device->index;
    nvmlReturn_t error = metrics_error(index);
    if (error) return error;
    if (unsupported(index)) return NOT_SUPPORTED;
    const model_t *model;
    nvmlReturn_t r = begin(device, &model); /* NOT_SUPPORTED: no MIG on this GPU */
    if (r) return r;
    state_t s;
    peek(index, &s);
    if (gpuInstanceId >= GIS || !s.current || !s.gi_used[gpuInstanceId]) return NOT_FOUND;
    char prefix[16];
    snprintf(prefix, sizeof prefix, "gi%u.", gpuInstanceId);
    take(&instance_counters[index][gpuInstanceId], index, (int)gpuInstanceId, prefix, sample);
    return 0;
}

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    if (!initialized) return 1;
    if (!get) return INVALID_ARGUMENT;
    if (get->version != 1) return VERSION_MISMATCH;
    nvmlGpmSample_t first = get->sample1, second = get->sample2;
    if (!first || !second || first->device < 0 || first->device != second->device
            || first->instance != second->instance || second->elapsed <= first->elapsed)
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
