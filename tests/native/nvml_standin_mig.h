/* What the NVML stand-in's MIG files share (see nvml_standin_mig.c's header). The return
 * codes are nvmlReturn_t's as NVIDIA/go-nvml `gen/nvml/nvml.h` at
 * 2f9e261fe40a7a1c54783d66805e8920564763b4 declares them (NVML_ERROR_INVALID_ARGUMENT 2,
 * NVML_ERROR_NOT_SUPPORTED 3, NVML_ERROR_IN_USE 19, NVML_ERROR_INSUFFICIENT_RESOURCES 23);
 * GIS and CIS are the id spaces of the slot tree described there (15 GPU instance ids on 8
 * memory slots, compute instance ids 0..7). */
#ifndef NVML_STANDIN_MIG_H
#define NVML_STANDIN_MIG_H

#include <stddef.h>

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

typedef struct {
    int current, pending;
    int gi_used[GIS], gi_profile[GIS], gi_start[GIS];
    int ci_used[GIS][CIS], ci_profile[GIS][CIS], ci_start[GIS][CIS];
} state_t;

/* One GPU-instance profile of a model, and a model (nvml_standin_mig_models.c). */
typedef struct {
    const char *name; int constant, id, slices, size, max; unsigned int starts;
} shape_t;
typedef struct {
    const char *family; int below_mib; int slots; int reset; const shape_t *shapes;
} model_t;
SHARED extern const model_t MIG_MODELS[];
#define COMPUTE_SLICES(m) ((m)->slots == 8 ? 7 : (m)->slots)

SHARED const model_t *model_of(nvmlDevice_t device);
SHARED const shape_t *shape_by(const model_t *model, int constant, int id);
SHARED int gi_id_of(const model_t *m, int start, int size);
SHARED int load(int g, state_t *s);
SHARED void unlock(void);
SHARED void save(int g, const state_t *s);
SHARED void peek(int g, state_t *s);
SHARED int busy(int g);
SHARED nvmlReturn_t begin(nvmlDevice_t device, const model_t **model);
SHARED nvmlReturn_t begin_shape(nvmlDevice_t device, unsigned int id, const model_t **m,
                                const shape_t **shape);
SHARED int memory_gb(const shape_t *shape);
SHARED nvmlReturn_t gi_of(gi_t *gi, state_t *s, const model_t **m, const shape_t **shape,
                          int lock);
SHARED extern gi_t gi_handles[64][GIS];

#endif
