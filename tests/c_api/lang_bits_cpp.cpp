// SPDX-License-Identifier: BSD-3-Clause
// The C++ side of the same-bits test: the run of tests/c_api/mlp.yaml trained LANG_STEPS steps on
// the batches of lang_data.h twice, by dtrain::ConfiguredRun and by a loop written by hand from
// the library's own objects (make_model, make_optimizer, GradientSync on a reproducible
// communicator), which must agree to the bit; then in the sharded and fully sharded sync modes,
// whose losses and predictions must be replicated's bits (2 ranks). Rank 0 writes the parameters
// (float32) for the comparison with the C and Fortran programs; checkpoints go to ./ckpt as in
// those programs.
//   mpiexec -n 2 lang_bits_cpp <mlp.yaml> <params output file>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include <dtrain/config/build.hpp>
#include <dtrain/config/configured_run.hpp>

#include "lang_data.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, failed = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    if (argc != 3) throw dtrain::InvalidArgument("usage: lang_bits_cpp <mlp.yaml> <params file>");
    const dtrain::RunConfig cfg = dtrain::read_run_config(argv[1]);
    std::vector<float> x(LANG_BATCH * LANG_IN), t(LANG_BATCH * LANG_OUT);
    auto fill = [&](int s) {
      for (int b = 0; b < LANG_BATCH; ++b) {
        for (int i = 0; i < LANG_IN; ++i) x[b * LANG_IN + i] = lang_x(rank, s, b, i);
        for (int j = 0; j < LANG_OUT; ++j) t[b * LANG_OUT + j] = lang_t(rank, s, b, j);
      }
    };

    // By hand: the objects the file describes, the all-reduce's wait applying the update.
    dtrain::MpiTransport transport(MPI_COMM_WORLD);
    dtrain::Communicator comm(transport, dtrain::comm_config(cfg));
    auto model = dtrain::make_model<float>(cfg);
    auto opt = dtrain::make_optimizer<dtrain::AdamW>(model, cfg.optimizer);
    dtrain::GradientSync sync(comm, model.gradients(), cfg.sync.bucket_bytes, cfg.sync.algorithm);
    for (int s = 0; s < LANG_STEPS; ++s) {
      fill(s);
      model.zero_grad();
      model.forward_backward(x.data(), t.data(), LANG_BATCH, cfg.loss, sync);
      sync.wait(opt);
    }
    const auto hand = model.parameter_span();

    dtrain::ConfiguredRun run(MPI_COMM_WORLD, cfg);
    for (int s = 0; s < LANG_STEPS; ++s) {
      fill(s);
      run.train_step(x.data(), t.data(), LANG_BATCH);
      run.maybe_save();
    }
    run.save();
    run.wait_checkpoints();
    std::vector<float> p(run.parameter_count());
    run.copy_parameters(p.data());
    if (p.size() != hand.size() || std::memcmp(p.data(), hand.data(), p.size() * 4) != 0) {
      std::fprintf(stderr, "rank %d: ConfiguredRun and the hand-written loop differ\n", rank);
      failed = 1;
    }
    // The same run in the sharded and fully sharded modes (no checkpoints): on 2 ranks the same
    // losses and the same predictions, bit for bit, as replicated.
    auto in_mode = [&](dtrain::SyncMode mode) {
      dtrain::RunConfig c = cfg;
      c.sync.mode = mode;
      c.checkpoint.directory.clear();
      dtrain::ConfiguredRun r(MPI_COMM_WORLD, c);
      std::vector<double> out;
      for (int s = 0; s < LANG_STEPS; ++s) {
        fill(s);
        out.push_back(r.train_step(x.data(), t.data(), LANG_BATCH));
      }
      fill(LANG_STEPS);
      std::vector<double> y(LANG_BATCH * LANG_OUT);
      r.predict(x.data(), y.data(), LANG_BATCH);
      out.insert(out.end(), y.begin(), y.end());
      return out;
    };
    const auto replicated = in_mode(dtrain::SyncMode::replicated);
    for (auto mode : {dtrain::SyncMode::sharded, dtrain::SyncMode::fully_sharded}) {
      const auto other = in_mode(mode);
      if (std::memcmp(other.data(), replicated.data(), replicated.size() * 8) != 0) {
        std::fprintf(stderr, "rank %d: sync mode %s differs from replicated\n", rank,
                     mode == dtrain::SyncMode::sharded ? "sharded" : "fully_sharded");
        failed = 1;
      }
    }
    if (rank == 0) {
      std::FILE* f = std::fopen(argv[2], "wb");
      if (!f || std::fwrite(p.data(), 4, p.size(), f) != p.size()) failed = 1;
      if (f) std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    failed = 1;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("lang_bits_cpp: %s\n", any ? "FAILED" : "ok");
  MPI_Finalize();
  return any;
}
