/* Test runs only, never shipped: with SM120FORK_TEST_CLUSTER_SIZE=N in the environment,
 * cudaOccupancyMaxPotentialClusterSize answers N (at least 1) instead of the device's
 * answer, for every kernel of the process. Loaded with LD_PRELOAD into the GPU harness's
 * ranks, it asks an unchanged FlashInfer build (the published wheel's files) what its
 * cluster selection does when a device answers N: the same question the source-level test
 * patch of stack sglang-0.5.10 (patches/sglang-0.5.10/flashinfer-test/) asks, without
 * changing the code under test. FlashInfer's JIT modules link libcudart dynamically, so the
 * call resolves here first. Each distinct (device answer, block size) is logged once. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int cudaError_t;
typedef cudaError_t (*query_fn)(int *, const void *, const void *);

/* cudaLaunchConfig_t begins with gridDim and blockDim (dim3: three unsigned ints each). */
struct launch_config_head { unsigned grid[3]; unsigned block[3]; };

cudaError_t cudaOccupancyMaxPotentialClusterSize(int *cluster_size, const void *func,
                                                 const void *config) {
  static query_fn real = NULL;
  static int logged[64][9];
  if (real == NULL) {
    real = (query_fn)dlvsym(RTLD_NEXT, "cudaOccupancyMaxPotentialClusterSize",
                            "libcudart.so.13");
    if (real == NULL) real = (query_fn)dlsym(RTLD_NEXT, "cudaOccupancyMaxPotentialClusterSize");
  }
  int device_answer = 0;
  cudaError_t status = real ? real(&device_answer, func, config) : 1;
  const char *forced = getenv("SM120FORK_TEST_CLUSTER_SIZE");
  unsigned block = config ? ((const struct launch_config_head *)config)->block[0] : 0;
  if (forced == NULL) {
    *cluster_size = device_answer;
    return status;
  }
  int n = atoi(forced) > 1 ? atoi(forced) : 1;
  int slot = (int)(block / 32) % 64, seen = device_answer >= 0 && device_answer <= 8 ? device_answer : 0;
  if (!logged[slot][seen]) {
    logged[slot][seen] = 1;
    fprintf(stderr, "[cluster-answer shim] blocks of %u threads: the device answered %d "
            "(status %d); SM120FORK_TEST_CLUSTER_SIZE=%d replaces it\n", block,
            device_answer, status, n);
  }
  *cluster_size = n;
  return 0; /* cudaSuccess */
}
