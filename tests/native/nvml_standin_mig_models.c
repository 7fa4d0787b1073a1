/* The NVML stand-in's MIG models: which GPUs have MIG and each one's GPU-instance profiles,
 * as a driver answers nvmlDeviceGetGpuInstanceProfileInfo(V) and the placement calls.
 *
 * Transcribed by hand from NVIDIA's published tables, never generated from the installer's
 * own table (installer/compat/migdata.py); tests/host/test_mig_oracle.py asks this library
 * through NVML's calls and fails on any difference between the two.
 *
 * Sources:
 * - NVIDIA MIG User Guide (docs.nvidia.com/datacenter/tesla/mig-user-guide), "Supported
 *   GPUs" (products, memory, 7 or 4 instances at most: A30 and RTX PRO 6000 Blackwell 4;
 *   GB200 186GB, B200 180GB, H100 on GH200 and H20 96GB) and "Supported MIG Profiles" (the
 *   A30 table: 1g.6gb x4, 1g.6gb+me x1, 2g.12gb x2, 2g.12gb+me x1, 4g.24gb x1; the A100
 *   table and its note that the 80GB part's names scale by memory; the placement figures
 *   `nvidia-smi mig -lgipp` prints).
 * - NVIDIA/mig-parted deployments/systemd/config-default.yaml at bd7160f4: the sizes per
 *   product (the `all-<size>` configs and the comments naming their products, the
 *   `all-balanced` device filters), GB200's after its commit ebab1f77.
 * - GoogleCloudPlatform/container-engine-accelerators partition_gpu/partition_gpu.go at
 *   992db812: the nvidia-smi profile ids (`partitionSizeToProfileID`), RTX PRO 6000's
 *   variants among them (+me 21, +gfx 47, +me.all 65, -me 67, 2g 5, 2g+gfx 35, ...).
 * - nvml.h (NVIDIA/go-nvml, vendored by mig-parted at bd7160f4): the profile constants
 *   NVML_GPU_INSTANCE_PROFILE_* (1_SLICE 0x0 ... 7_SLICE 0x4, 1_SLICE_REV1 0x7, 2_SLICE_REV1
 *   0x8, 1_SLICE_REV2 0x9, 1/2/4_SLICE_GFX 0xA-0xC, 1/2_SLICE_NO_ME 0xD/0xE, 1/2_SLICE_ALL_ME
 *   0xF/0x10).
 *
 * A row: the name nvidia-smi prints after "MIG ", the NVML constant, the nvidia-smi profile
 * id, compute slices, memory slots taken, how many one GPU holds, the starts NVML accepts
 * (bit n: start slot n). 8-slot parts have 7 compute slices, 4-slot parts 4.
 */
#include "nvml_standin_mig.h"

#define ALL7 0x7f /* starts 0..6 */
#define EVEN4 0x55 /* 0, 2, 4, 6 */
#define END {0, 0, 0, 0, 0, 0, 0}

/* The seven sizes of an 8-slot part; the memory in GB as NVIDIA names each. */
#define SEVEN(one, one_me, dbl, two, three, four, seven) \
    {one, 0x0, 19, 1, 1, 7, ALL7}, {one_me, 0x7, 20, 1, 1, 1, ALL7}, \
    {dbl, 0x9, 15, 1, 2, 4, EVEN4}, {two, 0x1, 14, 2, 2, 3, 0x15}, \
    {three, 0x2, 9, 3, 4, 2, 0x11}, {four, 0x3, 5, 4, 4, 1, 0x01}, \
    {seven, 0x4, 0, 7, 8, 1, 0x01}, END

static const shape_t A100_40[] = {SEVEN("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb",
                                        "3g.20gb", "4g.20gb", "7g.40gb")};
static const shape_t A100_80[] = {SEVEN("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb",
                                        "3g.40gb", "4g.40gb", "7g.80gb")};
static const shape_t H100_94[] = {SEVEN("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb",
                                        "3g.47gb", "4g.47gb", "7g.94gb")};
static const shape_t H100_96[] = {SEVEN("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb",
                                        "3g.48gb", "4g.48gb", "7g.96gb")};
static const shape_t GH200_144[] = {SEVEN("1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb",
                                          "3g.72gb", "4g.72gb", "7g.144gb")};
static const shape_t H200[] = {SEVEN("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb",
                                     "3g.71gb", "4g.71gb", "7g.141gb")};
static const shape_t B200[] = {SEVEN("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb",
                                     "3g.90gb", "4g.90gb", "7g.180gb")};
static const shape_t GB200[] = {SEVEN("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb",
                                      "3g.93gb", "4g.93gb", "7g.186gb")};
static const shape_t B300[] = {SEVEN("1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb",
                                     "3g.135gb", "4g.135gb", "7g.269gb")};
static const shape_t GB300[] = {SEVEN("1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb",
                                      "3g.139gb", "4g.139gb", "7g.278gb")};

/* 4-slot parts: 1g starts 0..3, 2g 0 and 2, 4g 0. */
static const shape_t A30[] = {
    {"1g.6gb", 0x0, 14, 1, 1, 4, 0xf}, {"1g.6gb+me", 0x7, 21, 1, 1, 1, 0xf},
    {"2g.12gb", 0x1, 5, 2, 2, 2, 0x5}, {"2g.12gb+me", 0x8, 6, 2, 2, 1, 0x5},
    {"4g.24gb", 0x3, 0, 4, 4, 1, 0x1}, END,
};
static const shape_t RTX_PRO_6000[] = {
    {"1g.24gb", 0x0, 14, 1, 1, 4, 0xf}, {"1g.24gb+me", 0x7, 21, 1, 1, 1, 0xf},
    {"1g.24gb+gfx", 0xA, 47, 1, 1, 4, 0xf}, {"1g.24gb-me", 0xD, 67, 1, 1, 4, 0xf},
    {"1g.24gb+me.all", 0xF, 65, 1, 1, 1, 0xf}, {"2g.48gb", 0x1, 5, 2, 2, 2, 0x5},
    {"2g.48gb+gfx", 0xB, 35, 2, 2, 2, 0x5}, {"2g.48gb-me", 0xE, 66, 2, 2, 2, 0x5},
    {"2g.48gb+me.all", 0x10, 64, 2, 2, 1, 0x5}, {"4g.96gb", 0x3, 0, 4, 4, 1, 0x1},
    {"4g.96gb+gfx", 0xC, 32, 4, 4, 1, 0x1}, END,
};

/* By the word in the NVML name and the memory NVML reports (the first row whose family
 * matches and whose bound lies above the memory wins). Ampere keeps a new mode pending
 * until a reset (the guide's "Enable MIG Mode"). */
const model_t MIG_MODELS[] = {
    {"A100", 61440, 8, 1, A100_40}, {"A100", 1 << 30, 8, 1, A100_80},
    {"A800", 61440, 8, 1, A100_40}, {"A800", 1 << 30, 8, 1, A100_80},
    {"A30", 1 << 30, 4, 1, A30},
    {"H100", 89088, 8, 0, A100_80}, {"H100", 96800, 8, 0, H100_94},
    {"H100", 1 << 30, 8, 0, H100_96},
    {"H800", 89088, 8, 0, A100_80}, {"H800", 1 << 30, 8, 0, H100_94},
    {"H20", 1 << 30, 8, 0, H100_96}, {"PG506", 1 << 30, 8, 0, H100_96},
    {"GH200", 120000, 8, 0, H100_96}, {"GH200", 1 << 30, 8, 0, GH200_144},
    {"H200", 1 << 30, 8, 0, H200},
    {"B200", 1 << 30, 8, 0, B200}, {"GB200", 1 << 30, 8, 0, GB200},
    {"B300", 1 << 30, 8, 0, B300}, {"GB300", 1 << 30, 8, 0, GB300},
    {"RTX PRO 6000", 1 << 30, 4, 0, RTX_PRO_6000},
    {0, 0, 0, 0, 0},
};
