/* An outside C project against the installed package: steps of the run in the file given as
 * argument 1 (tests/install/consumer_fortran/run.yaml) on 2 ranks, the loss falling. */
#include <stdio.h>

#include <mpi.h>

#include "dtrain.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dtrain_run run = {0};
  double x[8][4], y[8][2], first = 0, loss = 0;
  for (int i = 0; i < 8; ++i) {
    const double v[4] = {i + 1, -(i + 1), 2 * (i + 1), 1};
    for (int k = 0; k < 4; ++k) x[i][k] = v[k] / 8;
    y[i][0] = x[i][0] + x[i][1] + x[i][2] + x[i][3];
    y[i][1] = x[i][0] - x[i][1];
  }
  const int64_t xs[2] = {8, 4}, ys[2] = {8, 2};
  int rc = argc > 1 ? dtrain_create(MPI_COMM_WORLD, argv[1], &run) : DTRAIN_ERR_INVALID_ARGUMENT;
  if (rc == DTRAIN_OK)
    rc = dtrain_train_step(run, x, DTRAIN_F64, 2, xs, y, DTRAIN_F64, 2, ys, &first);
  for (int s = 0; s < 20 && rc == DTRAIN_OK; ++s)
    rc = dtrain_train_step(run, x, DTRAIN_F64, 2, xs, y, DTRAIN_F64, 2, ys, &loss);
  if (rc != DTRAIN_OK) fprintf(stderr, "consumer_c: %s\n", dtrain_last_error(run));
  dtrain_close(&run);
  if (rank == 0) printf("consumer_c: loss %.3e -> %.3e\n", first, loss);
  MPI_Finalize();
  return rc == DTRAIN_OK && loss < first ? 0 : 1;
}
