// Helper for the SIGKILL test: `kill_writer DIR base MIB` writes checkpoint 1 and exits;
// `kill_writer DIR big MIB` restores it, trains one step and saves checkpoint 2 (the test kills
// it while that file is being written).
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
