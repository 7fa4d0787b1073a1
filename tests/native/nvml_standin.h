/* What the NVML stand-in's two files share (hidden: the library exports only NVML's API). */
#ifndef NVML_STANDIN_H
#define NVML_STANDIN_H

#define SHARED __attribute__((visibility("hidden")))

typedef int nvmlReturn_t;
typedef struct { int index; } gpu_t;
typedef gpu_t *nvmlDevice_t;

SHARED extern gpu_t gpus[64];
SHARED extern int initialized;
SHARED int env_int(const char *name, int fallback);
SHARED const char *env_str(const char *name, const char *fallback);
SHARED int gpu_count(void);
/* nvml_standin_metrics.c: FAKE_NVML_METRICS_FILE's readings of one GPU */
SHARED int metrics_value(int index, const char *key, char *out, unsigned long size);
SHARED unsigned long long metrics_number(int index, const char *key, unsigned long long fallback);
SHARED nvmlReturn_t metrics_error(int index);
/* nvml_standin_mig_devices.c: 1 (and NVML's answer in *r) when `device` is a MIG handle */
SHARED int mig_uuid(nvmlDevice_t device, char *out, unsigned int length, nvmlReturn_t *r);

#endif
