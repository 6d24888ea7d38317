// A checkpoint records the run's description (serializer<RunConfig>) and a restore under another
// description fails, naming both files, before the model is touched. Two ranks as threads.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/config/build.hpp>

#include "ckpt/test_comm.hpp"

using namespace dtrain;
using dtrain::test::run_ranks;
using dtrain::test::ThreadComm;

TEST_CASE("a checkpoint records the run description and refuses another one") {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("dtrain-config-ckpt-" + std::to_string(::getpid())))
                              .string();
  const std::string text = "seed: 5\nmodel: {layers: [{linear: {in: 3, out: 2}}]}\n";
  const RunConfig run = parse_run_config(text, "first.yaml");
  // The same model in a file that differs (a comment is a different description too).
  const RunConfig other = parse_run_config(text + "# lr changed\n", "second.yaml");
  run_ranks(2, [&](ThreadComm& comm) {
    Checkpointer<ThreadComm> ckpt(comm, dir, checkpoint_options(run));
    auto model = make_model<float>(run);
    RunConfig saved = run;
    ckpt.save(1, named("run_config", saved), named("model", model));

    // The same description restores, and the RunConfig read back is the one saved.
    auto back = make_model<float>(run);
    RunConfig same = run;
    CHECK(ckpt.restore_latest(named("run_config", same), named("model", back)) ==
          std::optional<std::int64_t>(1));
    CHECK(same.text == run.text);
    CHECK(same.source == run.source);

    // Another description: an error naming both, and the model keeps its own parameters.
    auto fresh = make_model<float>(other);
    std::vector<float> before(fresh.parameter_count());
    for (std::size_t i = 0; i < before.size(); ++i) before[i] = 100.0f + static_cast<float>(i);
    std::memcpy(fresh.parameters().data, before.data(), before.size() * sizeof(float));
    RunConfig changed = other;
    try {
      ckpt.restore_latest(named("run_config", changed), named("model", fresh));
      FAIL("a checkpoint of another run description was restored");
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      CHECK(what.find("first.yaml") != std::string::npos);
      CHECK(what.find("second.yaml") != std::string::npos);
    }
    CHECK(changed.text == other.text);
    CHECK(std::memcmp(before.data(), fresh.parameters().data, before.size() * sizeof(float)) == 0);
  });
  std::filesystem::remove_all(dir);
}
