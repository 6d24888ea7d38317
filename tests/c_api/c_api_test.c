/* SPDX-License-Identifier: BSD-3-Clause */
/* The C API from C11 on 2 ranks: training, prediction against a forward computed here from the
 * copied parameters, evaluation, checkpoints (maybe_save's interval, restore into a second run
 * with the same bits), the in-situ store, and the error paths (null, wrong shapes and types, bad
 * and missing configuration files naming file and key, closed runs, per-run messages). Device
 * arrays on this build's emulated device 0 (tests/c_api/emulated_policy.hpp): a device run
 * restores the host checkpoint, and its device-array steps and predictions are the bits of a
 * host run's; the memory checks' errors. Messages per thread: two threads failing different
 * calls at once, on two runs and on one, each read back their own. The caller's arrays
 * registered in the checkpoint come back into a new run's memory.
 *   mpiexec -n 2 c_api_test <mlp.yaml> <bad_key.yaml> <params output file>
 * Rank 0 writes the parameters after LANG_STEPS steps (float32, native order) for the
 * same-bits comparison with the C++ and Fortran programs. */
#define _POSIX_C_SOURCE 200809L /* mkdir, chdir */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "dtrain.h"
#include "emulated_device_c.h"
#include "lang_data.h"

static int rank = -1;
static int failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed\n", rank, __FILE__, __LINE__, #cond); \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

/* A call that must succeed: prints the run's message when it does not. */
#define OK(run, call)                                                                          \
  do {                                                                                         \
    int rc_ = (call);                                                                          \
    if (rc_ != DTRAIN_OK) {                                                                    \
      fprintf(stderr, "rank %d: %s:%d: %s returned %d: %s\n", rank, __FILE__, __LINE__, #call, \
              rc_, dtrain_last_error(run));                                                    \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

/* A call that must fail with `status` and a message containing `part`. */
static void expect_error(dtrain_run run, int rc, int status, const char* part, int line) {
  const char* m = dtrain_last_error(run);
  if (rc != status || strstr(m, part) == NULL || strstr(m, "rank ") == NULL) {
    fprintf(stderr, "rank %d: line %d: expected status %d with \"%s\", got %d: \"%s\"\n", rank,
            line, status, part, rc, m);
    ++failures;
  }
}
#define EXPECT_ERROR(run, call, status, part) expect_error(run, (call), status, part, __LINE__)

static void fill(int step, float* x, float* t) {
  for (int b = 0; b < LANG_BATCH; ++b) {
    for (int i = 0; i < LANG_IN; ++i) x[b * LANG_IN + i] = lang_x(rank, step, b, i);
    for (int j = 0; j < LANG_OUT; ++j) t[b * LANG_OUT + j] = lang_t(rank, step, b, j);
  }
}

/* One thread of the message test: `rounds` failing calls of its own kind on `run`, each followed
 * by a read of the thread's message, which must be its own call's (and never the other's). */
struct failer {
  dtrain_run run, other_run;
  int kind; /* 0: train_step without x; 1: predict into a wrong shape */
  int rounds, wrong;
};

static void* fail_repeatedly(void* arg) {
  struct failer* f = arg;
  static const float x[LANG_BATCH * LANG_IN] = {0}, t[LANG_BATCH * LANG_OUT] = {0};
  float y[LANG_BATCH * LANG_OUT];
  const int64_t xs[3] = {LANG_BATCH, 2, 4}, ts[2] = {LANG_BATCH, LANG_OUT},
                bad_y[2] = {LANG_BATCH, LANG_OUT + 1};
  const char* mine = f->kind == 0 ? "dtrain_train_step: x is null" : "dtrain_predict: y has shape";
  const char* theirs = f->kind == 0 ? "dtrain_predict" : "dtrain_train_step";
  for (int i = 0; i < f->rounds; ++i) {
    const int rc =
        f->kind == 0
            ? dtrain_train_step(f->run, NULL, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, NULL)
            : dtrain_predict(f->run, x, DTRAIN_F32, 3, xs, y, DTRAIN_F32, 2, bad_y);
    const char* m = dtrain_last_error(f->run);
    if (rc != DTRAIN_ERR_INVALID_ARGUMENT || strstr(m, mine) == NULL || strstr(m, theirs) != NULL)
      ++f->wrong;
    /* This thread never failed on the other run, nor without a run. */
    if (f->other_run.id != f->run.id && dtrain_last_error(f->other_run)[0] != '\0') ++f->wrong;
  }
  return NULL;
}

/* Two threads, one of each kind, at once on runs a and b (which may be the same run). */
static void messages_per_thread(dtrain_run a, dtrain_run b) {
  struct failer f[2] = {{a, b, 0, 3000, 0}, {b, a, 1, 3000, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; ++i) CHECK(pthread_create(&th[i], NULL, fail_repeatedly, &f[i]) == 0);
  for (int i = 0; i < 2; ++i) CHECK(pthread_join(th[i], NULL) == 0);
  CHECK(f[0].wrong == 0 && f[1].wrong == 0);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 4) {
    if (rank == 0) fprintf(stderr, "usage: c_api_test <mlp.yaml> <bad_key.yaml> <params file>\n");
    MPI_Finalize();
    return 2;
  }
  const char *config = argv[1], *bad = argv[2], *params_out = argv[3];
  dtrain_run none = {0};

  /* Creation errors: kept as the thread's message without a run. */
  dtrain_run run = {0};
  EXPECT_ERROR(none, dtrain_create(MPI_COMM_WORLD, NULL, &run), DTRAIN_ERR_INVALID_ARGUMENT,
               "configuration path is null");
  EXPECT_ERROR(none, dtrain_create(MPI_COMM_WORLD, config, NULL), DTRAIN_ERR_INVALID_ARGUMENT,
               "run pointer is null");
  EXPECT_ERROR(none, dtrain_create(MPI_COMM_WORLD, bad, &run), DTRAIN_ERR_INVALID_ARGUMENT,
               "bad_key.yaml");
  CHECK(strstr(dtrain_last_error(none), "bias_typo") != NULL);
  CHECK(run.id == 0);
  EXPECT_ERROR(none, dtrain_create(MPI_COMM_WORLD, "no_such_dir/run.yaml", &run), DTRAIN_ERR_IO,
               "no_such_dir/run.yaml");

  OK(none, dtrain_create(MPI_COMM_WORLD, config, &run));
  CHECK(run.id > 0);
  int64_t in = 0, out = 0, count = 0, step = -1;
  int dtype = -1, r = -1, p = -1;
  OK(run, dtrain_input_size(run, &in));
  OK(run, dtrain_output_size(run, &out));
  OK(run, dtrain_parameter_count(run, &count));
  OK(run, dtrain_model_dtype(run, &dtype));
  OK(run, dtrain_rank(run, &r, &p));
  CHECK(in == LANG_IN && out == LANG_OUT && dtype == DTRAIN_F32 && r == rank && p == 2);
  CHECK(count == 8 * 16 + 16 + 16 * 3 + 3);

  /* LANG_STEPS steps; the file's interval (every 3 steps) saves after step 3 only. */
  float x[LANG_BATCH * LANG_IN], t[LANG_BATCH * LANG_OUT];
  const int64_t xs[3] = {LANG_BATCH, 2, 4}, ts[2] = {LANG_BATCH, LANG_OUT};
  for (int s = 0; s < LANG_STEPS; ++s) {
    fill(s, x, t);
    double loss = -1;
    OK(run, dtrain_train_step(run, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &loss));
    CHECK(loss > 0 && isfinite(loss));
    int saved = -1;
    OK(run, dtrain_maybe_save(run, &saved));
    CHECK(saved == (s + 1 == 3));
  }
  OK(run, dtrain_step(run, &step));
  CHECK(step == LANG_STEPS);
  float* params = malloc(sizeof(float) * (size_t)count);
  OK(run, dtrain_copy_parameters(run, params, DTRAIN_F32, count));
  if (rank == 0) {
    FILE* f = fopen(params_out, "wb");
    CHECK(f && fwrite(params, sizeof(float), (size_t)count, f) == (size_t)count);
    if (f) fclose(f);
  }
  OK(run, dtrain_save(run));
  OK(run, dtrain_wait_checkpoints(run));

  /* predict (flattened sample shape, double output) against the forward computed here from the
   * parameters: layer 0 weight [16][8], bias [16], layer 2 weight [3][16], bias [3]. */
  fill(LANG_STEPS, x, t);
  double y[LANG_BATCH * LANG_OUT];
  const int64_t xflat[2] = {LANG_BATCH, LANG_IN};
  OK(run, dtrain_predict(run, x, DTRAIN_F32, 2, xflat, y, DTRAIN_F64, 2, ts));
  const float *w0 = params, *b0 = params + 128, *w1 = params + 144, *b1 = params + 192;
  double err = 0, mse = 0;
  for (int b = 0; b < LANG_BATCH; ++b) {
    double h[16];
    for (int k = 0; k < 16; ++k) {
      double a = b0[k];
      for (int i = 0; i < LANG_IN; ++i) a += (double)w0[k * LANG_IN + i] * x[b * LANG_IN + i];
      h[k] = tanh(a);
    }
    for (int j = 0; j < LANG_OUT; ++j) {
      double o = b1[j];
      for (int k = 0; k < 16; ++k) o += (double)w1[j * 16 + k] * h[k];
      err = fmax(err, fabs(o - y[b * LANG_OUT + j]));
      const double d = y[b * LANG_OUT + j] - t[b * LANG_OUT + j];
      mse += d * d / (LANG_BATCH * LANG_OUT);
    }
  }
  CHECK(err < 1e-5);
  double eval_loss = -1, accuracy = 0;
  OK(run, dtrain_evaluate(run, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &eval_loss, &accuracy));
  CHECK(fabs(eval_loss - mse) < 1e-5 * mse && accuracy == -1);

  /* Wrong shapes, types and pointers: clear errors, nothing trained. */
  const int64_t bad_x[2] = {LANG_BATCH, 9}, bad_t[2] = {LANG_BATCH - 1, LANG_OUT};
  EXPECT_ERROR(run, dtrain_train_step(run, x, DTRAIN_F32, 2, bad_x, t, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT,
               "x has shape {4, 9} (C order, batch first); expected "
               "{batch, 2, 4} or {batch, 8}");
  EXPECT_ERROR(run, dtrain_train_step(run, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, bad_t, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT, "x holds 4 samples but targets 3");
  EXPECT_ERROR(run, dtrain_train_step(run, NULL, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT, "x is null");
  EXPECT_ERROR(run, dtrain_train_step(run, x, 7, 3, xs, t, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT, "x has element type unknown");
  EXPECT_ERROR(run, dtrain_predict(run, x, DTRAIN_F32, 3, xs, y, DTRAIN_I32, 1, xs),
               DTRAIN_ERR_INVALID_ARGUMENT, "y has element type I32");
  EXPECT_ERROR(run, dtrain_copy_parameters(run, params, DTRAIN_F32, count - 1),
               DTRAIN_ERR_INVALID_ARGUMENT, "count 194 but the model has 195 parameters");
  OK(run, dtrain_step(run, &step));
  CHECK(step == LANG_STEPS);
  /* The message stays with its run: a failure elsewhere does not replace it. */
  EXPECT_ERROR(none, dtrain_input_size(none, &in), DTRAIN_ERR_CLOSED, "run handle is 0");
  CHECK(strstr(dtrain_last_error(run), "count 194") != NULL);
  char small[8];
  size_t length = 0;
  OK(run, dtrain_copy_last_error(run, small, sizeof small, &length));
  CHECK(strlen(small) == 7 && length == strlen(dtrain_last_error(run)));

  /* A second run restores the saved step with the same bits. */
  dtrain_run again = {0};
  OK(none, dtrain_create(MPI_COMM_WORLD, config, &again));
  CHECK(again.id > run.id);
  int64_t restored = -2;
  OK(again, dtrain_restore_latest(again, &restored));
  CHECK(restored == LANG_STEPS);
  float* back = malloc(sizeof(float) * (size_t)count);
  OK(again, dtrain_copy_parameters(again, back, DTRAIN_F32, count));
  CHECK(memcmp(back, params, sizeof(float) * (size_t)count) == 0);

  /* A closed run is refused by id, and closing it again is a no-op on {0}. */
  const dtrain_run closed = run;
  OK(run, dtrain_close(&run));
  CHECK(run.id == 0);
  OK(run, dtrain_close(&run));
  EXPECT_ERROR(closed, dtrain_train_step(closed, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_CLOSED, "was closed");

  /* The in-situ store: a window of 6 pairs, normalised inputs, steps drawn from it. */
  EXPECT_ERROR(again, dtrain_train_step_from_store(again, 2, NULL), DTRAIN_ERR_INVALID_ARGUMENT,
               "no store");
  EXPECT_ERROR(again, dtrain_store_open(again, 6, 5, 1), DTRAIN_ERR_INVALID_ARGUMENT, "eviction 5");
  OK(again, dtrain_store_open(again, 6, DTRAIN_EVICT_OLDEST, 1));
  for (int s = 0; s < 2; ++s) {
    fill(10 + s, x, t);
    OK(again, dtrain_store_add(again, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts));
  }
  int64_t stored = 0, fed = 0;
  OK(again, dtrain_store_size(again, &stored, &fed));
  CHECK(stored == 6 && fed == 8);
  for (int s = 0; s < 3; ++s) {
    double loss = -1;
    OK(again, dtrain_train_step_from_store(again, 3, &loss));
    CHECK(loss > 0 && isfinite(loss));
  }
  EXPECT_ERROR(again, dtrain_train_step_from_store(again, 7, NULL), DTRAIN_ERR_INVALID_ARGUMENT,
               "batch 7 but this rank's store holds 6 samples");
  OK(again, dtrain_step(again, &step));
  CHECK(step == LANG_STEPS + 3);

  /* Messages per thread, on two runs and on one run: neither thread sees the other's, and this
   * thread's own message on `again` (the batch 7 above) stays. */
  dtrain_run second = {0};
  OK(none, dtrain_create(MPI_COMM_WORLD, config, &second));
  messages_per_thread(again, second);
  messages_per_thread(second, second);
  CHECK(strstr(dtrain_last_error(again), "batch 7") != NULL);
  OK(second, dtrain_close(&second));
  OK(again, dtrain_close(&again));

  /* Device arrays on the emulated device 0 (host code cannot read its memory). A device run
   * restores the host checkpoint; then steps on device arrays (values, then class labels), on host
   * arrays staged to the device, and predictions into device memory are the bits of a host run
   * fed the same data. */
  dtrain_run dev = {0}, host = {0};
  OK(none, dtrain_create_on(MPI_COMM_WORLD, config, 0, &dev));
  OK(none, dtrain_create(MPI_COMM_WORLD, config, &host));
  int where = -2;
  OK(dev, dtrain_device(dev, &where));
  CHECK(where == 0);
  OK(host, dtrain_device(host, &where));
  CHECK(where == DTRAIN_HOST);
  OK(dev, dtrain_restore_latest(dev, &restored));
  CHECK(restored == LANG_STEPS);
  OK(host, dtrain_restore_latest(host, &restored));
  OK(dev, dtrain_copy_parameters(dev, back, DTRAIN_F32, count));
  CHECK(memcmp(back, params, sizeof(float) * (size_t)count) == 0);
  void* dx = test_device_alloc(sizeof x);
  void* dt = test_device_alloc(sizeof t);
  void* dl = test_device_alloc(LANG_BATCH * sizeof(int32_t));
  void* dy = test_device_alloc(LANG_BATCH * LANG_OUT * sizeof(double));
  int32_t labels[LANG_BATCH];
  const int64_t ls[1] = {LANG_BATCH};
  for (int s = 0; s < 4; ++s) {
    fill(20 + s, x, t);
    for (int b = 0; b < LANG_BATCH; ++b) labels[b] = (rank + s + b) % LANG_OUT;
    test_device_upload(dx, x, sizeof x);
    test_device_upload(dt, t, sizeof t);
    test_device_upload(dl, labels, sizeof labels);
    double lh = -1, ld = -2;
    if (s < 2) {
      OK(host, dtrain_train_step(host, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &lh));
      OK(dev, dtrain_train_step_device(dev, dx, DTRAIN_F32, 3, xs, dt, DTRAIN_F32, 2, ts, &ld));
    } else if (s == 2) {
      OK(host, dtrain_train_step(host, x, DTRAIN_F32, 3, xs, labels, DTRAIN_I32, 1, ls, &lh));
      OK(dev, dtrain_train_step_device(dev, dx, DTRAIN_F32, 3, xs, dl, DTRAIN_I32, 1, ls, &ld));
    } else {
      OK(host, dtrain_train_step(host, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &lh));
      OK(dev, dtrain_train_step(dev, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, &ld));
    }
    CHECK(lh > 0 && memcmp(&lh, &ld, sizeof lh) == 0);
  }
  OK(host, dtrain_copy_parameters(host, params, DTRAIN_F32, count));
  OK(dev, dtrain_copy_parameters(dev, back, DTRAIN_F32, count));
  CHECK(memcmp(back, params, sizeof(float) * (size_t)count) == 0);
  float yh[LANG_BATCH * LANG_OUT], yd[LANG_BATCH * LANG_OUT];
  OK(host, dtrain_predict(host, x, DTRAIN_F32, 3, xs, yh, DTRAIN_F32, 2, ts));
  OK(dev, dtrain_predict_device(dev, dx, DTRAIN_F32, 3, xs, dy, DTRAIN_F32, 2, ts));
  test_device_download(yd, dy, sizeof yd);
  CHECK(memcmp(yh, yd, sizeof yh) == 0);
  OK(dev, dtrain_predict(dev, x, DTRAIN_F32, 3, xs, yd, DTRAIN_F32, 2, ts));
  CHECK(memcmp(yh, yd, sizeof yh) == 0);

  /* Device memory where host arrays go and the reverse, a device call on a host run, the other
   * float type, labels out of range, devices that do not exist: errors, nothing trained. */
  EXPECT_ERROR(dev, dtrain_train_step(dev, dx, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT, "x is emulated device memory, but dtrain_train_step");
  EXPECT_ERROR(host, dtrain_predict(host, x, DTRAIN_F32, 3, xs, dy, DTRAIN_F32, 2, ts),
               DTRAIN_ERR_INVALID_ARGUMENT, "y is emulated device memory");
  EXPECT_ERROR(dev,
               dtrain_train_step_device(dev, dx, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT,
               "targets is not emulated device memory, but dtrain_train_step_device");
  EXPECT_ERROR(host,
               dtrain_train_step_device(host, dx, DTRAIN_F32, 3, xs, dt, DTRAIN_F32, 2, ts, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT, "is on the host");
  EXPECT_ERROR(dev, dtrain_predict_device(dev, dx, DTRAIN_F32, 3, xs, dy, DTRAIN_F64, 2, ts),
               DTRAIN_ERR_INVALID_ARGUMENT, "y is f64 but the model is f32");
  for (int b = 0; b < LANG_BATCH; ++b) labels[b] = b == 2 ? LANG_OUT : 0;
  test_device_upload(dl, labels, sizeof labels);
  EXPECT_ERROR(dev,
               dtrain_train_step_device(dev, dx, DTRAIN_F32, 3, xs, dl, DTRAIN_I32, 1, ls, NULL),
               DTRAIN_ERR_INVALID_ARGUMENT, "label 3 of sample 2");
  dtrain_run other = {0};
  EXPECT_ERROR(none, dtrain_create_on(MPI_COMM_WORLD, config, 1, &other),
               DTRAIN_ERR_INVALID_ARGUMENT, "device 1 but the emulated build has device 0 only");
  EXPECT_ERROR(none, dtrain_create_on(MPI_COMM_WORLD, config, -2, &other),
               DTRAIN_ERR_INVALID_ARGUMENT, "device -2");
  CHECK(other.id == 0);
  OK(dev, dtrain_step(dev, &step));
  CHECK(step == LANG_STEPS + 4);
  OK(dev, dtrain_close(&dev));
  OK(host, dtrain_close(&host));
  test_device_free(dx, sizeof x);
  test_device_free(dt, sizeof t);
  test_device_free(dl, LANG_BATCH * sizeof(int32_t));
  test_device_free(dy, LANG_BATCH * LANG_OUT * sizeof(double));

  /* The caller's own arrays in the checkpoint (a solver's field and counters, per rank): saved
   * with the model and restored in place into a new run's memory; misuse refused. In a directory
   * of their own (the configuration's checkpoint directory is relative), so that the checkpoints
   * of steps 3 and 5 stay as the same-bits test reads them. */
  if (rank == 0) CHECK(mkdir("arrays", 0755) == 0 || access("arrays", F_OK) == 0);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(chdir("arrays") == 0);
  dtrain_run sol = {0}, sol2 = {0}, sol3 = {0};
  OK(none, dtrain_create(MPI_COMM_WORLD, config, &sol));
  double field[7], field2[7] = {0}, field3[6] = {0};
  int32_t counters[2] = {rank, 41 + rank}, counters2[2] = {0, 0};
  for (int i = 0; i < 7; ++i) field[i] = 0.5 * i + 10.0 * rank + 1.0 / 3.0;
  OK(sol, dtrain_checkpoint_array(sol, "field", field, DTRAIN_F64, 7));
  OK(sol, dtrain_checkpoint_array(sol, "counters", counters, DTRAIN_I32, 2));
  EXPECT_ERROR(sol, dtrain_checkpoint_array(sol, "field", field2, DTRAIN_F64, 7),
               DTRAIN_ERR_INVALID_ARGUMENT, "'field' is registered already");
  EXPECT_ERROR(sol, dtrain_checkpoint_array(sol, "a/b", field2, DTRAIN_F64, 7),
               DTRAIN_ERR_INVALID_ARGUMENT, "name 'a/b'");
  EXPECT_ERROR(sol, dtrain_checkpoint_array(sol, NULL, field2, DTRAIN_F64, 7),
               DTRAIN_ERR_INVALID_ARGUMENT, "name is null");
  EXPECT_ERROR(sol, dtrain_checkpoint_array(sol, "g", NULL, DTRAIN_F64, 7),
               DTRAIN_ERR_INVALID_ARGUMENT, "data is null");
  EXPECT_ERROR(sol, dtrain_checkpoint_array(sol, "g", field2, 7, 7), DTRAIN_ERR_INVALID_ARGUMENT,
               "'g': element type unknown");
  EXPECT_ERROR(sol, dtrain_checkpoint_array(sol, "g", field2, DTRAIN_F64, 0),
               DTRAIN_ERR_INVALID_ARGUMENT, "'g': count 0");
  fill(30, x, t);
  OK(sol, dtrain_train_step(sol, x, DTRAIN_F32, 3, xs, t, DTRAIN_F32, 2, ts, NULL));
  OK(sol, dtrain_save(sol));
  OK(sol, dtrain_wait_checkpoints(sol));
  OK(sol, dtrain_copy_parameters(sol, params, DTRAIN_F32, count));
  OK(none, dtrain_create(MPI_COMM_WORLD, config, &sol2));
  OK(sol2, dtrain_checkpoint_array(sol2, "field", field2, DTRAIN_F64, 7));
  OK(sol2, dtrain_checkpoint_array(sol2, "counters", counters2, DTRAIN_I32, 2));
  OK(sol2, dtrain_restore_latest(sol2, &restored));
  CHECK(restored == 1);
  CHECK(memcmp(field, field2, sizeof field) == 0);
  CHECK(memcmp(counters, counters2, sizeof counters) == 0);
  OK(sol2, dtrain_copy_parameters(sol2, back, DTRAIN_F32, count));
  CHECK(memcmp(back, params, sizeof(float) * (size_t)count) == 0);
  /* An array of another length than the saved one: the restore is refused, naming it. */
  OK(none, dtrain_create(MPI_COMM_WORLD, config, &sol3));
  OK(sol3, dtrain_checkpoint_array(sol3, "field", field3, DTRAIN_F64, 6));
  const int rc3 = dtrain_restore_latest(sol3, &restored);
  if (rc3 == DTRAIN_OK || strstr(dtrain_last_error(sol3), "arrays/field") == NULL) {
    fprintf(stderr, "rank %d: restore of a 6-element field: %d %s\n", rank, rc3,
            dtrain_last_error(sol3));
    ++failures;
  }
  OK(sol, dtrain_close(&sol));
  OK(sol2, dtrain_close(&sol2));
  OK(sol3, dtrain_close(&sol3));
  CHECK(chdir("..") == 0);

  free(params);
  free(back);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("c_api_test: %s (%d failed checks)\n", all ? "FAILED" : "ok", all);
  MPI_Finalize();
  return all ? 1 : 0;
}
