// ParameterSet through the HDF5 Checkpointer over loopback ranks: a run stopped at a checkpoint
// and resumed (into owned or adopted arenas) continues to the bits of the uninterrupted run, and
// a set named like a Sequential's layers writes a file the Sequential restores.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_own_model_ckpt_test {

namespace fs = std::filesystem;
using namespace dtrain;
using LoopComm = Communicator<LoopbackTransport>;

namespace {
std::vector<ParameterSpec> specs() {
  return {{"encoder/weight", {16, 6}, ParameterInit::kaiming_uniform},
          {"encoder/bias", {16}, ParameterInit::zeros},
          {"head/weight", {2, 16}, ParameterInit::xavier_uniform},
          {"head/bias", {2}, ParameterInit::zeros}};
}

std::string run_dir(const char* what) {
  return (fs::temp_directory_path() /
          ("dtrain_own_model_" + std::string(what) + "_" + std::to_string(::getpid())))
      .string();
}

// One training step with made-up rank-dependent gradients (a function of the parameters, the
// step and the rank), averaged by GradientSync, clipped, then AdamW.
void train_step(ParameterSet& set, AdamW& opt, GradientSync& sync, int rank, std::int64_t step) {
  set.zero_grad();
  for (std::size_t i = set.size(); i-- > 0;) {
    const auto r = set.tensor(i);
    for (std::size_t k = 0; k < r.count; ++k)
      r.grad[k] = r.param[k] * 0.5f + static_cast<float>((rank + 1) * ((step + k) % 5)) * 0.1f;
    set.grad_ready(i, sync);
  }
  sync.wait();
  clip_grad_norm(set.gradients(), 1.0);
  opt.step();
}
}  // namespace

TEST_CASE("own_model: a resumed run continues to the uninterrupted run's bits") {
  for (int p : {1, 2}) {
    CAPTURE(p);
    const std::string dir = run_dir(("resume" + std::to_string(p)).c_str());
    fs::remove_all(dir);
    std::atomic<int> bad{0};
    run_loopback(p, [&](LoopbackTransport& t) {
      LoopComm comm(t);
      const auto schedule = Schedule::warmup_cosine(0.02, 2, 8);
      // Uninterrupted: 8 steps.
      ParameterSet ref(specs());
      ref.init(3);
      AdamW ref_opt(ref, schedule);
      GradientSync ref_sync(comm, ref.gradients(), 256);
      for (std::int64_t s = 0; s < 8; ++s) train_step(ref, ref_opt, ref_sync, t.rank(), s);
      {
        // Stopped after step 5, with checkpoints every 3 steps: the newest is step 3.
        ParameterSet set(specs());
        set.init(3);
        AdamW opt(set, schedule);
        GradientSync sync(comm, set.gradients(), 256);
        CheckpointOptions o;
        o.every_steps = 3;
        Checkpointer<LoopComm> ckpt(comm, dir, o);
        for (std::int64_t s = 0; s < 5; ++s) {
          train_step(set, opt, sync, t.rank(), s);
          ckpt.maybe_save(s + 1, named("model", set), named("optimizer", opt));
        }
      }
      // Resumed into buffers the application owns, with another init seed (overwritten).
      std::vector<float> params(ref.parameter_count()), grads(ref.parameter_count());
      ParameterSet set(BufferView(span<float>(params)), BufferView(span<float>(grads)), specs());
      set.init(99);
      AdamW opt(set, schedule);
      GradientSync sync(comm, set.gradients(), 256);
      Checkpointer<LoopComm> ckpt(comm, dir);
      const auto step = ckpt.restore_latest(named("model", set), named("optimizer", opt));
      if (!step || *step != 3 || opt.step_count() != 3 || set.seed() != 3) ++bad;
      for (std::int64_t s = step.value_or(0); s < 8; ++s) train_step(set, opt, sync, t.rank(), s);
      if (std::memcmp(params.data(), ref.parameter_span().data(), params.size() * sizeof(float)))
        ++bad;
      const auto m = opt.exp_avg().as<float>(), mr = ref_opt.exp_avg().as<float>();
      if (std::memcmp(m.data(), mr.data(), m.size() * sizeof(float))) ++bad;
    });
    CHECK(bad.load() == 0);
    fs::remove_all(dir);
  }
}

TEST_CASE("own_model: a set named like a Sequential's layers writes a file the Sequential loads") {
  const std::string dir = run_dir("seq");
  fs::remove_all(dir);
  std::atomic<int> bad{0};
  run_loopback(2, [&](LoopbackTransport& t) {
    LoopComm comm(t);
    Sequential seq{Linear(3, 5), Relu(), Linear(5, 2)};
    std::vector<ParameterSpec> s;
    for (const auto& p : seq.parameter_info())
      s.push_back({p.name, p.shape,
                   p.shape.size() == 2 ? ParameterInit::kaiming_normal : ParameterInit::ones});
    ParameterSet set(s);
    set.init(21);
    Checkpointer<LoopComm> ckpt(comm, dir);
    ckpt.save(1, named("model", set));
    if (ckpt.restore_latest(named("model", seq)) != 1) ++bad;
    if (std::memcmp(seq.parameter_span().data(), set.parameter_span().data(),
                    set.parameter_count() * sizeof(float)))
      ++bad;
    // And back: the model's own file restores into the set.
    seq.init(8);
    ckpt.save(2, named("model", seq));
    if (ckpt.restore_latest(named("model", set)) != 2) ++bad;
    if (set.seed() != 8) ++bad;
    if (std::memcmp(seq.parameter_span().data(), set.parameter_span().data(),
                    set.parameter_count() * sizeof(float)))
      ++bad;
  });
  CHECK(bad.load() == 0);
  fs::remove_all(dir);
}

}  // namespace dtrain_test_own_model_ckpt_test
