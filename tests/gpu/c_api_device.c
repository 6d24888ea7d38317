/* SPDX-License-Identifier: BSD-3-Clause */
/* The C API's device arrays on a real GPU (tests/gpu/run_on_device.sh builds
 * bindings/c/dtrain_c.cpp with nvcc or hipcc for it): two runs on this rank's GPU, one fed host
 * arrays (staged by the run) and one fed device copies of them (dtrain_train_step_device,
 * dtrain_predict_device), train with the same bits, values and class labels; a host run of the same
 * data stays within rounding of them; a host array given to a _device call and a device array given
 * to a host call are refused. mpiexec -n 2 c_api_device <tests/c_api/mlp.yaml>      (exit 77: no
 * GPU visible) Valid C11 and C++. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#if defined(DTRAIN_HAVE_HIP)
#include <hip/hip_runtime_api.h>
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuSuccess hipSuccess
#else
#include <cuda_runtime_api.h>
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuSuccess cudaSuccess
#endif

#include "dtrain.h"
#include "lang_data.h"

static int rank = -1, failures = 0;

static void check(int ok, const char* what, dtrain_run run) {
  if (!ok) {
    fprintf(stderr, "rank %d: check failed: %s (last message: %s)\n", rank, what,
            dtrain_last_error(run));
    ++failures;
  }
}

static void* device_copy(const void* host, size_t bytes) {
  void* d = NULL;
  if (gpuMalloc(&d, bytes) != gpuSuccess ||
      gpuMemcpy(d, host, bytes, gpuMemcpyHostToDevice) != gpuSuccess) {
    fprintf(stderr, "rank %d: device allocation or copy failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return d;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int devices = 0;
  if (gpuGetDeviceCount(&devices) != gpuSuccess || devices == 0) {
    if (rank == 0) printf("c_api_device: no GPU visible\n");
    MPI_Finalize();
    return 77;
  }
  if (argc != 2) {
    if (rank == 0) fprintf(stderr, "usage: c_api_device <mlp.yaml>\n");
    MPI_Finalize();
    return 2;
  }
  const int gpu = rank % devices;
  dtrain_run staged = {0}, direct = {0}, host = {0};
  check(dtrain_create_on(MPI_COMM_WORLD, argv[1], gpu, &staged) == DTRAIN_OK, "create", staged);
  check(dtrain_create_on(MPI_COMM_WORLD, argv[1], gpu, &direct) == DTRAIN_OK, "create", direct);
  check(dtrain_create(MPI_COMM_WORLD, argv[1], &host) == DTRAIN_OK, "create", host);
  float x[LANG_BATCH * LANG_IN], t[LANG_BATCH * LANG_OUT];
  int32_t labels[LANG_BATCH];
  const int64_t xs[3] = {LANG_BATCH, 2, 4}, ts[2] = {LANG_BATCH, LANG_OUT}, ls[1] = {LANG_BATCH};
  double worst = 0;
  for (int s = 0; s < 6; ++s) {
    for (int b = 0; b < LANG_BATCH; ++b) {
      for (int i = 0; i < LANG_IN; ++i) x[b * LANG_IN + i] = lang_x(rank, s, b, i);
      for (int j = 0; j < LANG_OUT; ++j) t[b * LANG_OUT + j] = lang_t(rank, s, b, j);
      labels[b] = (rank + s + b) % LANG_OUT;
    }
    void* dx = device_copy(x, sizeof x);
    void* dt = device_copy(t, sizeof t);
    void* dl = device_copy(labels, sizeof labels);
    double a = -1, b = -2, h = -3;
    if (s % 3 == 2) {
      check(dtrain_train_step(staged, x, DTRAIN_F32, 3, xs, labels, DTRAIN_I32, 1, ls, &a) == 0,
            "labels step, host arrays", staged);
      check(dtrain_train_step_device(direct, dx, DTRAIN_F32, 3, xs, dl, DTRAIN_I32, 1, ls, &b) == 0,
            "labels step, device arrays", direct);
      check(dtrain_train_step(host, x, DTRAIN_F32, 3, xs, labels, DTRAIN_I32, 1, ls, &h) == 0,
            "labels step, host run", host);
    } else {
      check(dtrain_train_step(staged, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &a) == 0,
            "step, host arrays", staged);
      check(dtrain_train_step_device(direct, dx, DTRAIN_F32, 3, xs, dt, DTRAIN_F32, 2, ts, &b) == 0,
            "step, device arrays", direct);
      check(dtrain_train_step(host, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &h) == 0,
            "step, host run", host);
    }
    check(memcmp(&a, &b, sizeof a) == 0, "device-array loss has the host-array loss's bits",
          direct);
    worst = fmax(worst, fabs(a - h) / fmax(fabs(h), 1e-12));
    gpuFree(dx);
    gpuFree(dt);
    gpuFree(dl);
  }
  check(worst < 1e-3, "GPU losses within 1e-3 of the host run's", host);
  int64_t count = 0;
  dtrain_parameter_count(staged, &count);
  float* pa = (float*)malloc(sizeof(float) * (size_t)count);
  float* pb = (float*)malloc(sizeof(float) * (size_t)count);
  check(dtrain_copy_parameters(staged, pa, DTRAIN_F32, count) == 0, "parameters", staged);
  check(dtrain_copy_parameters(direct, pb, DTRAIN_F32, count) == 0, "parameters", direct);
  check(memcmp(pa, pb, sizeof(float) * (size_t)count) == 0, "parameters' bits", direct);
  float ya[LANG_BATCH * LANG_OUT], yb[LANG_BATCH * LANG_OUT];
  void* dx = device_copy(x, sizeof x);
  void* dy = device_copy(ya, sizeof ya);
  check(dtrain_predict(staged, x, DTRAIN_F32, 3, xs, ya, DTRAIN_F32, 2, ts) == 0, "predict",
        staged);
  check(dtrain_predict_device(direct, dx, DTRAIN_F32, 3, xs, dy, DTRAIN_F32, 2, ts) == 0,
        "predict_device", direct);
  gpuMemcpy(yb, dy, sizeof yb, gpuMemcpyDeviceToHost);
  check(memcmp(ya, yb, sizeof ya) == 0, "prediction's bits", direct);
  check(dtrain_train_step_device(direct, x, DTRAIN_F32, 3, xs, dy, DTRAIN_F32, 2, ts, NULL) ==
                DTRAIN_ERR_INVALID_ARGUMENT &&
            strstr(dtrain_last_error(direct), "x is not") != NULL,
        "a host array refused by the device call", direct);
  check(dtrain_predict(staged, dx, DTRAIN_F32, 3, xs, ya, DTRAIN_F32, 2, ts) ==
                DTRAIN_ERR_INVALID_ARGUMENT &&
            strstr(dtrain_last_error(staged), "x is ") != NULL,
        "a device array refused by the host call", staged);
  gpuFree(dx);
  gpuFree(dy);
  free(pa);
  free(pb);
  dtrain_close(&staged);
  dtrain_close(&direct);
  dtrain_close(&host);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("c_api_device: %s (%d failed checks)\n", all ? "FAILED" : "ok", all);
  MPI_Finalize();
  return all ? 1 : 0;
}
