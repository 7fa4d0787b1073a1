/* A stand-in for NVIDIA's libcuda.so.1: the driver-API calls verify makes, on the CPU.
 *
 * "Device memory" is host memory; cuLaunchKernel runs the vector add the PTX describes
 * (c[i] = a[i] + b[i] for every thread the launch covers), so a wrong launch shows.
 *   FAKE_CUDA_INIT_ERROR  CUresult for cuInit (e.g. 100, 999)
 *   FAKE_CUDA_DEVICES     device count (default 1)
 *   FAKE_CUDA_VERSION     driver version int (default 12020)
 *   FAKE_CUDA_WRONG       "1": the kernel adds 1 to one element (a faulty GPU)
 */
#include <stdlib.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct { int device; } ctx_t;
typedef struct { int loaded; } module_t;
typedef struct { module_t *module; } function_t;

static int initialized;
static function_t the_function;

static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    int error = env_int("FAKE_CUDA_INIT_ERROR", 0);
    if (error) return error;
    initialized = 1;
    return 0;
}

CUresult cuDriverGetVersion(int *version) {
    *version = env_int("FAKE_CUDA_VERSION", 12020);
    return 0;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return 3;
    *count = env_int("FAKE_CUDA_DEVICES", 1);
    return 0;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return 3;
    if (ordinal < 0 || ordinal >= env_int("FAKE_CUDA_DEVICES", 1)) return 101;
    *device = ordinal;
    return 0;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    snprintf(name, (size_t)length, "Stand-in GPU %d", device);
    return 0;
}

CUresult cuDeviceGetPCIBusId(char *bus, int length, CUdevice device) {
    snprintf(bus, (size_t)length, "0000:%02X:00.0", 0x10 + device);
    return 0;
}

CUresult cuCtxCreate_v2(ctx_t **ctx, unsigned int flags, CUdevice device) {
    (void)flags;
    *ctx = calloc(1, sizeof **ctx);
    (*ctx)->device = device;
    return 0;
}

CUresult cuCtxDestroy_v2(ctx_t *ctx) { free(ctx); return 0; }
CUresult cuCtxSynchronize(void) { return 0; }

CUresult cuModuleLoadData(module_t **module, const void *image) {
    const char *ptx = image;
    if (!strstr(ptx, ".entry vadd") || !strstr(ptx, ".version")) return 218; /* INVALID_PTX */
    *module = calloc(1, sizeof **module);
    (*module)->loaded = 1;
    return 0;
}

CUresult cuModuleUnload(module_t *module) { free(module); return 0; }

CUresult cuModuleGetFunction(function_t **function, module_t *module, const char *name) {
    if (strcmp(name, "vadd") != 0) return 500; /* NOT_FOUND */
    the_function.module = module;
    *function = &the_function;
    return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    void *memory = malloc(size);
    if (!memory) return 2;
    *ptr = (CUdeviceptr)(uintptr_t)memory;
    return 0;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) { free((void *)(uintptr_t)ptr); return 0; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t size) {
    memcpy((void *)(uintptr_t)dst, src, size);
    return 0;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size) {
    memcpy(dst, (const void *)(uintptr_t)src, size);
    return 0;
}

CUresult cuLaunchKernel(function_t *f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz,
                        unsigned int shared, void *stream, void **params, void **extra) {
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream; (void)extra;
    if (f != &the_function || !params) return 1;
    float *a = (float *)(uintptr_t)*(CUdeviceptr *)params[0];
    float *b = (float *)(uintptr_t)*(CUdeviceptr *)params[1];
    float *c = (float *)(uintptr_t)*(CUdeviceptr *)params[2];
    unsigned int n = *(unsigned int *)params[3];
    unsigned long long threads = (unsigned long long)gx * bx;
    for (unsigned long long i = 0; i < threads && i < n; i++) c[i] = a[i] + b[i];
    if (env_int("FAKE_CUDA_WRONG", 0) && n > 7) c[7] += 1.0f;
    return 0;
}
