/* SPDX-License-Identifier: BSD-3-Clause */
/* The C API from C11 on 2 ranks: training, prediction against a forward computed here from the
 * copied parameters, evaluation, checkpoints (maybe_save's interval, restore into a second run
 * with the same bits), the in-situ store, and the error paths (null, wrong shapes and types, bad
 * and missing configuration files naming file and key, closed runs, per-run messages).
 *   mpiexec -n 2 c_api_test <mlp.yaml> <bad_key.yaml> <params output file>
 * Rank 0 writes the parameters after LANG_STEPS steps (float32, native order) for the
 * same-bits comparison with the C++ and Fortran programs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "dtrain.h"
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
  OK(again, dtrain_close(&again));

  free(params);
  free(back);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("c_api_test: %s (%d failed checks)\n", all ? "FAILED" : "ok", all);
  MPI_Finalize();
  return all ? 1 : 0;
}
