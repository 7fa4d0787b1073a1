/* nvidia-smi as the MIG tests need it: the GPU reset through the driver.
 *
 * nvidia-smi(1): "-r, --gpu-reset  Trigger a reset of one or more GPUs ... requires -i",
 * where -i takes indexes or PCI bus ids (domain:bus:device.function, hex), comma-separated.
 * NVIDIA's mig-parted resets a pending MIG mode this way while the driver is loaded
 * (cmd/nvidia-mig-parted/util/device.go @ bd7160f4, nvmlResetAllGPUs: `nvidia-smi -r -i
 * <bus ids>`). Here a reset of GPU i is the NVML stand-in's reset file
 * "$FAKE_NVML_MIG_DIR/reset-gpu<i>" (see nvml_standin_mig.c), i being the position of the
 * FAKE_NVML_BUS_IDS entry that ends in the id asked for.
 *
 * Environment: FAKE_NVIDIA_SMI_LOG: each call's arguments appended as one line;
 * FAKE_NVIDIA_SMI_RESET=refused: the reset fails (exit 1), as on a GPU the driver cannot
 * reset. An id no GPU has: exit 6 ("No devices were found"). Any other call prints
 * "stand-in".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int ends_with(const char *text, size_t len, const char *tail) {
    size_t n = strlen(tail);
    return n && len >= n && strncasecmp(text + len - n, tail, n) == 0;
}

/* The stand-in's index of the GPU whose bus id ends in `id`; -1: none. */
static int index_of(const char *id) {
    const char *list = getenv("FAKE_NVML_BUS_IDS");
    int i = 0;
    while (list && *list) {
        size_t len = strcspn(list, ",");
        if (ends_with(list, len, id)) return i;
        list += len + (list[len] == ',');
        i++;
    }
    return -1;
}

static int reset(char *ids) {
    const char *refused = getenv("FAKE_NVIDIA_SMI_RESET");
    const char *dir = getenv("FAKE_NVML_MIG_DIR");
    if (refused && strcmp(refused, "refused") == 0) {
        fprintf(stderr, "Unable to reset GPU %s: the driver refused the reset.\n", ids);
        return 1;
    }
    for (char *id = strtok(ids, ","); id; id = strtok(NULL, ",")) {
        int i = index_of(id);
        if (i < 0 || !dir) {
            fprintf(stderr, "No devices were found\n");
            return 6;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/reset-gpu%d", dir, i);
        FILE *f = fopen(path, "w");
        if (!f) return 1;
        fclose(f);
        printf("GPU %s was successfully reset.\n", id);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *log = getenv("FAKE_NVIDIA_SMI_LOG");
    FILE *f = log ? fopen(log, "a") : NULL;
    for (int i = 1; f && i < argc; i++) fprintf(f, i + 1 < argc ? "%s " : "%s", argv[i]);
    if (f) { fputc('\n', f); fclose(f); }
    if (argc == 4 && strcmp(argv[1], "-r") == 0 && strcmp(argv[2], "-i") == 0)
        return reset(argv[3]);
    puts("stand-in");
    return 0;
}
