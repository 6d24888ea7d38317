// Helper for the SIGKILL test: `kill_writer DIR base MIB` writes checkpoint 1 and exits;
// `kill_writer DIR big MIB` restores it, trains one step and saves checkpoint 2 (the test kills
// it while that file is being written). `levels-base` and `levels-big` do the same with
// multi-level checkpoints on 2 ranks as 2 fake nodes (node-local directories DIR/node0 and
// DIR/node1, the shared level DIR/shared): the test kills the writer while one level's file of
// checkpoint 2 is being written.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dtrain/ckpt/hdf5.hpp>

#include "ckpt/big_state.hpp"
#include "ckpt/fake_state.hpp"
#include "ckpt/test_comm.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR base|big MIB\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], mode = argv[2];
  const long mib = std::atol(argv[3]);
  try {
    if (mode == "levels-base" || mode == "levels-big") {
      dtrain::test::run_ranks(2, [&](dtrain::test::ThreadComm& comm) {
        dtrain::CheckpointOptions o;
        o.levels.local_dir = dir + "/node" + std::to_string(comm.rank());
        o.levels.node = comm.rank();
        const bool base = mode == "levels-base";
        dtrain::Checkpointer<dtrain::test::ThreadComm> ckpt(comm, dir + "/shared", o);
        dtrain::test::FakeRun run(0);
        dtrain::test::BigState big(base ? 1 : mib);
        big.fill(base ? 1 : 2);
        run.step(comm);
        if (!base) run.step(comm);
        ckpt.save(base ? 1 : 2, dtrain::named("model", run.model),
                  dtrain::named("optimizer", run.opt), dtrain::named("big", big));
        ckpt.wait();
      });
      return 0;
    }
    dtrain::test::run_ranks(1, [&](dtrain::test::ThreadComm& comm) {
      dtrain::Checkpointer<dtrain::test::ThreadComm> ckpt(comm, dir);
      dtrain::test::FakeRun run(0);
      dtrain::test::BigState big(mode == "base" ? 1 : mib);
      big.fill(1);
      run.step(comm);
      if (mode == "base") {
        ckpt.save(1, dtrain::named("model", run.model), dtrain::named("optimizer", run.opt),
                  dtrain::named("big", big));
        return;
      }
      // The big save: checkpoint 2 carries a tensor of MIB MiB.
      run.step(comm);
      big.fill(2);
      std::printf("writing\n");
      std::fflush(stdout);
      ckpt.save(2, dtrain::named("model", run.model), dtrain::named("optimizer", run.opt),
                dtrain::named("big", big));
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
