// Writes a sample checkpoint for the schema checks: `make_sample DIR` leaves DIR/ckpt-*.h5
// (two thread ranks, so per-rank groups exist) and prints the file's path.
#include <cstdio>
#include <string>

#include <dtrain/ckpt/hdf5.hpp>

#include "ckpt/fake_state.hpp"
#include "ckpt/test_comm.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::string path;
  try {
    dtrain::test::run_ranks(2, [&](dtrain::test::ThreadComm& comm) {
      dtrain::CheckpointOptions o;
      o.keep_last = 1;
      o.config = "{\"model\": \"fake\", \"lr\": 0.01}";
      dtrain::Checkpointer<dtrain::test::ThreadComm> ckpt(comm, dir, o);
      dtrain::test::FakeRun run(comm.rank());
      for (int i = 0; i < 3; ++i) run.step(comm);
      ckpt.save(3, dtrain::named("model", run.model), dtrain::named("optimizer", run.opt),
                dtrain::per_rank("sampler", run.sampler), dtrain::named("dropout", run.dropout),
                dtrain::named("schedule", run.sched));
      if (comm.rank() == 0) path = ckpt.path_for(3);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::printf("%s\n", path.c_str());
  return 0;
}
