/* Example 22: the loop of example 21 in C (C11) through dtrain.h. A periodic 2D heat solver,
 * rows split over the ranks with its own halo exchange, feeds patches of its field (8 rows, 4
 * cells of context on every side, scaled by their own mean and RMS) and their change over 4 steps
 * to the in-situ store, trains the CNN of examples/configs/heat_surrogate.yaml from it while it
 * runs, checkpoints (dtrain_save, with the solver's field and step in the same file) and at the
 * end rolls the surrogate out 4 x 4 steps against the solver: its error must be at most half
 * persistence's.
 * Arrays are C order: a batch of patches is x[b][1][16][40], the model's Input {1, 16, 40}.
 *
 *   mpiexec.mpich -n 2 c_insitu examples/configs/heat_surrogate.yaml [--steps 240]
 *                               [--stop-after N] */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain.h"

enum { NX = 32, NY = 48, PROW = 8, H = 4, HORIZON = 4, TRAIN_EVERY = 4, OPT_STEPS = 4 };
enum { BATCH = 8, CAPACITY = 64, CKPT_EVERY = 40, N_ROLL = 4, W = NX + 2 * H };
static const double R = 0.2, MARGIN = 0.5;

/* A failed dtrain call: its message (rank, operation, cause) and the end of the job. */
#define CHECK(call)                                                         \
  do {                                                                      \
    if ((call) != DTRAIN_OK) {                                              \
      fprintf(stderr, "c_insitu: %s: %s\n", #call, dtrain_last_error(run)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                         \
    }                                                                       \
  } while (0)

static int rank, size, rows, row0;
/* Cell (i, j) of a field with halos: column i in [-H, NX + H), local row j in [-H, rows + H). */
#define AT(u, i, j) ((u)[(size_t)((j) + H) * W + (size_t)((i) + H)])

/* Wraps the columns and exchanges H ghost rows with the neighbours (periodic in both axes). */
static void exchange(double* u) {
  const int up = (rank + size - 1) % size, down = (rank + 1) % size, n = H * W;
  for (int j = 0; j < rows; ++j)
    for (int i = 0; i < H; ++i) {
      AT(u, i - H, j) = AT(u, NX - H + i, j);
      AT(u, NX + i, j) = AT(u, i, j);
    }
  MPI_Sendrecv(&AT(u, -H, rows - H), n, MPI_DOUBLE, down, 1, &AT(u, -H, -H), n, MPI_DOUBLE, up, 1,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Sendrecv(&AT(u, -H, 0), n, MPI_DOUBLE, up, 2, &AT(u, -H, rows), n, MPI_DOUBLE, down, 2,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void step(double* u, double* tmp) {
  for (int j = 0; j < rows; ++j)
    for (int i = 0; i < NX; ++i)
      AT(tmp, i, j) = AT(u, i, j) + R * (AT(u, i - 1, j) + AT(u, i + 1, j) + AT(u, i, j - 1) +
                                         AT(u, i, j + 1) - 4 * AT(u, i, j));
  for (int j = 0; j < rows; ++j) memcpy(&AT(u, 0, j), &AT(tmp, 0, j), NX * sizeof(double));
  exchange(u);
}

/* Warm and cold Gaussian blobs on 1 (example 21's field). */
static void initial_field(double* u, size_t cells) {
  for (size_t k = 0; k < cells; ++k) u[k] = 1;
  for (int k = 0; k < 12; ++k) {
    const double cx = fmod(17.3 * k + 5, NX), cy = fmod(29.1 * k + 11, NY);
    const double s = 2 + fmod(1.7 * k, 3.0), a = (k % 2 == 0 ? 1.0 : -1.0) * (0.5 + 0.05 * k);
    for (int j = 0; j < rows; ++j)
      for (int i = 0; i < NX; ++i) {
        double dx = fabs(i - cx), dy = fabs(row0 + j - cy);
        dx = fmin(dx, NX - dx);
        dy = fmin(dy, NY - dy);
        AT(u, i, j) += a * exp(-(dx * dx + dy * dy) / (2 * s * s));
      }
  }
  exchange(u);
}

/* Collective: the squared distance of two fields (b NULL: the sum of a) over the whole grid. */
static double reduce(const double* a, const double* b) {
  double s = 0;
  for (int j = 0; j < rows; ++j)
    for (int i = 0; i < NX; ++i)
      s += b ? (AT(a, i, j) - AT(b, i, j)) * (AT(a, i, j) - AT(b, i, j)) : AT(a, i, j);
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

/* Each patch of field a (PROW rows and H cells around), scaled by its own mean and RMS. */
static void patches(const double* a, int np, float* x, double* scale) {
  const int n = (PROW + 2 * H) * W;
  for (int p = 0; p < np; ++p) {
    double m = 0, ss = 0;
    for (int j = -H; j < PROW + H; ++j)
      for (int i = -H; i < NX + H; ++i) m += AT(a, i, p * PROW + j);
    m /= n;
    for (int j = -H; j < PROW + H; ++j)
      for (int i = -H; i < NX + H; ++i)
        ss += (AT(a, i, p * PROW + j) - m) * (AT(a, i, p * PROW + j) - m);
    scale[p] = fmax(sqrt(ss / n), 1e-30);
    for (int j = -H; j < PROW + H; ++j)
      for (int i = -H; i < NX + H; ++i)
        x[(size_t)p * n + (size_t)(j + H) * W + (size_t)(i + H)] =
            (float)((AT(a, i, p * PROW + j) - m) / scale[p]);
  }
}

int main(int argc, char** argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long long steps = 240, stop_after = -1;
  const char* config = NULL;
  for (int k = 1; k < argc; ++k) {
    if (!strcmp(argv[k], "--steps") && k + 1 < argc)
      steps = atoll(argv[++k]);
    else if (!strcmp(argv[k], "--stop-after") && k + 1 < argc)
      stop_after = atoll(argv[++k]);
    else
      config = argv[k];
  }
  row0 = NY * rank / size;
  rows = NY * (rank + 1) / size - row0;
  if (!config || rows % PROW != 0) {
    if (rank == 0)
      fprintf(stderr,
              "usage: c_insitu CONFIG [--steps N] [--stop-after N], on a rank count that "
              "splits %d rows into multiples of %d\n",
              NY, PROW);
    MPI_Finalize();
    return 2;
  }
  const int np = rows / PROW;
  const size_t cells = (size_t)(rows + 2 * H) * W;
  double *u = calloc(cells, sizeof *u), *snap = calloc(cells, sizeof *u);
  double *tmp = calloc(cells, sizeof *u), *v = calloc(cells, sizeof *u);
  double *f = calloc(cells, sizeof *u), *scale = calloc((size_t)np, sizeof *scale);
  float* x = calloc((size_t)np * (PROW + 2 * H) * W, sizeof *x);
  float* y = calloc((size_t)np * PROW * NX, sizeof *y);
  const int64_t xs[4] = {np, 1, PROW + 2 * H, W}, ys[4] = {np, 1, PROW, NX};

  dtrain_run run = {0};
  CHECK(dtrain_create(MPI_COMM_WORLD, config, &run));
  CHECK(dtrain_store_open(run, CAPACITY, DTRAIN_EVICT_OLDEST, 0));
  int64_t restored = -1, stored = 0, fed = 0, opt_step = 0;
  /* The solver's state goes into dtrain's checkpoints with the model: one file per save, so
   * that a restore brings back the field of the same step, and old states are pruned with it. */
  /* st: the solver's step and the initial heat, as doubles (a step count is exact in one). */
  double st[2] = {0, 0};
  CHECK(dtrain_checkpoint_array(run, "u", u, DTRAIN_F64, (int64_t)cells));
  CHECK(dtrain_checkpoint_array(run, "snap", snap, DTRAIN_F64, (int64_t)cells));
  CHECK(dtrain_checkpoint_array(run, "state", st, DTRAIN_F64, 2));
  CHECK(dtrain_restore_latest(run, &restored));
  long long it = (long long)st[0];
  if (restored >= 0) {
    if (rank == 0) printf("resumed at step %lld from checkpoint %lld\n", it, (long long)restored);
  } else {
    initial_field(u, cells);
    memcpy(snap, u, cells * sizeof *u);
    st[1] = reduce(u, NULL);
  }
  CHECK(dtrain_parameter_count(run, &opt_step));
  if (rank == 0)
    printf("c_insitu: %d ranks, %dx%d grid, %d patches per rank, CNN %lld parameters\n", size, NX,
           NY, np, (long long)opt_step);

  double loss = 0;
  while (it < steps) {
    if (it == stop_after) {
      if (rank == 0) printf("stopping at step %lld without saving (--stop-after)\n", it);
      CHECK(dtrain_close(&run));
      MPI_Finalize();
      return 0;
    }
    CHECK(dtrain_store_size(run, &stored, &fed));
    if (it % TRAIN_EVERY == 0 && stored >= BATCH)
      for (int k = 0; k < OPT_STEPS; ++k) CHECK(dtrain_train_step_from_store(run, BATCH, &loss));
    step(u, tmp);
    ++it;
    if (it % HORIZON == 0) {
      /* The pair: the snapshot taken HORIZON steps ago and its change since, per patch. */
      patches(snap, np, x, scale);
      for (int p = 0; p < np; ++p)
        for (int j = 0; j < PROW; ++j)
          for (int i = 0; i < NX; ++i)
            y[((size_t)p * PROW + (size_t)j) * NX + (size_t)i] =
                (float)((AT(u, i, p * PROW + j) - AT(snap, i, p * PROW + j)) /
                        (scale[p] * R * HORIZON));
      CHECK(dtrain_store_add(run, x, DTRAIN_F32, 4, xs, y, DTRAIN_F32, 4, ys));
      memcpy(snap, u, cells * sizeof *u);
    }
    if (it % 40 == 0 && rank == 0) printf("step %5lld  loss %.3e\n", it, loss);
    if (it % CKPT_EVERY == 0 || it == steps) {
      st[0] = (double)it;
      CHECK(dtrain_save(run));
    }
  }
  const double drift = fabs(reduce(u, NULL) - st[1]) / fabs(st[1]);

  /* Rollout from the final field against the solver's N_ROLL * HORIZON steps, and persistence. */
  memcpy(v, u, cells * sizeof *u);
  for (int k = 0; k < N_ROLL * HORIZON; ++k) step(v, tmp);
  const double change = reduce(v, u);
  memcpy(f, u, cells * sizeof *u);
  for (int k = 0; k < N_ROLL; ++k) {
    patches(f, np, x, scale);
    CHECK(dtrain_predict(run, x, DTRAIN_F32, 4, xs, y, DTRAIN_F32, 4, ys));
    for (int p = 0; p < np; ++p)
      for (int j = 0; j < PROW; ++j)
        for (int i = 0; i < NX; ++i)
          AT(f, i, p * PROW + j) +=
              y[((size_t)p * PROW + (size_t)j) * NX + (size_t)i] * scale[p] * R * HORIZON;
    exchange(f);
  }
  const double err_cnn = sqrt(reduce(f, v) / change), err_persist = sqrt(reduce(u, v) / change);
  CHECK(dtrain_step(run, &opt_step));
  const int ok = drift < 1e-12 && err_cnn < MARGIN * err_persist;
  if (rank == 0) {
    printf("total heat relative drift %.2e (%s)\n", drift,
           drift < 1e-12 ? "conserved" : "NOT CONSERVED");
    printf("training: %lld optimizer steps, last loss %.3e\n", (long long)opt_step, loss);
    printf(
        "rollout: %d x %d steps, error relative to the field's change: CNN %.4f, persistence "
        "%.4f (CNN below %.2f x persistence: %s)\n",
        N_ROLL, HORIZON, err_cnn, err_persist, MARGIN,
        err_cnn < MARGIN * err_persist ? "ok" : "FAILED");
    printf("final state: step %lld checkpoint %lld\n", it, (long long)opt_step);
  }
  CHECK(dtrain_close(&run));
  free(u), free(snap), free(tmp), free(v), free(f), free(scale), free(x), free(y);
  MPI_Finalize();
  return ok ? 0 : 1;
}
