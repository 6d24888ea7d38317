// Fully sharded training (FullyShardedSync): each rank holds its part of every unit's
// parameters, gradients and optimizer state; units are all-gathered before their forward and
// backward, their gradients reduce-scattered. Against the replicated step (GradientSync's
// all-reduce, every rank updating everything) on the same data:
// - 1-4 ranks in reproducible mode, and 2 ranks without it: the same parameter and optimizer
//   state bits after several steps, with AdamW and SGD (momentum, weight decay), for units of
//   one layer, one unit for everything and units given by their first layers, 1 (the
//   memory-tight mode), 2 and 3 working buffers, with and without prefetch; the model has
//   built-in layers, a residual block and a layer of the test's own (through the Layer
//   interface);
// - gradients accumulated over two micro-batches and the global-norm clipping agree with the
//   replicated step to rounding;
// - the live bytes of the model's allocator (a counting allocator) stay within this rank's
//   parts plus the working buffers and activations, well below the replicated model's; with
//   one working buffer, the parts plus exactly two buffers of the largest unit; a model built
//   with deferred arenas gives the same bits and its peak is that steady state (the whole arenas
//   never exist), where a model built whole peaks at construction;
// - on the emulated device (device memory the loopback transport cannot reach, staged through host
//   buffers): the host replicated step's parameter, optimizer-state and loss bits at 1-4 ranks
//   with 1, 2 and 3 buffers, deferred arenas, eager streams; accumulation and clipping to
//   rounding;
// - optimizers made before the sync (the freed whole arenas, or a model built with deferred
//   arenas) follow the model to its parts: the same bits; parameters decayed and clamped between
//   wait(opt) and the next forward reach every unit (1, 2 and 3 buffers): the same bits;
// - wait(opt) refuses an optimizer made from the views the sync freed;
// - a saving visitor that does not take parts is refused; passes after the sync is gone throw.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/loopback.hpp>

#include "../support/emulated_device.hpp"
#include "../support/fully_sharded.hpp"
#include "../support/memory_state.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_fully_sharded_test {

using namespace dtrain;
using test::pick;

namespace {

float noise(std::uint64_t seed, std::size_t i) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
  s ^= s >> 31, s *= 0x94D049BB133111EBull, s ^= s >> 29;
  return static_cast<float>(static_cast<double>(s % 2000003) / 1000001.0 - 1.0);
}

// A layer of the test's own: y = x * w per feature, w learned.
template <class T, class Exec>
class FeatureScale final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  const char* kind() const noexcept override { return "feature_scale"; }
  Shape configure(const Shape& in) override {
    n_ = static_cast<std::int64_t>(element_count(in));
    return in;
  }
  std::vector<LayerParam> params() const override { return {{"weight", {n_}, 0}}; }
  void init(std::uint64_t, std::uint64_t, T* w) override {
    for (std::int64_t i = 0; i < n_; ++i) w[i] = T(1) + T(0.05) * static_cast<T>(i);
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    this->exec().host_kernel(s, "feature_scale forward", &fwd, x, this->parameters(), y, rows, n_);
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    this->exec().host_kernel(s, "feature_scale backward", &bwd, x, this->parameters(), dy, dx,
                             this->gradients(), rows, n_);
  }

 private:
  static void fwd(const T* x, const T* w, T* y, std::int64_t rows, std::int64_t n) {
    for (std::int64_t i = 0; i < rows * n; ++i) y[i] = x[i] * w[i % n];
  }
  static void bwd(const T* x, const T* w, const T* dy, T* dx, T* dw, std::int64_t rows,
                  std::int64_t n) {
    for (std::int64_t i = 0; i < rows * n; ++i) {
      dw[i % n] += dy[i] * x[i];
      if (dx) dx[i] = dy[i] * w[i % n];
    }
  }
  std::int64_t n_ = 0;
};

// 8 layers: a user layer, a residual block, layers without parameters between units.
std::vector<Sequential::entry_type> layers() {
  return {Linear(6, 24),
          Tanh(),
          custom<FeatureScale>(),
          Residual{Linear(24, 24), Gelu()},
          LayerNorm(24),
          Linear(24, 7),
          Relu(),
          Linear(7, 3)};
}
// 8 square layers of 32: many small units, where a rank's parts and the working buffers of
// the largest unit are well below the replicated state.
std::vector<Sequential::entry_type> deep_layers() {
  std::vector<Sequential::entry_type> l{Linear(6, 32), Tanh()};
  for (int i = 0; i < 6; ++i) l.push_back(Linear(32, 32));
  l.push_back(Linear(32, 3));
  return l;
}
constexpr std::int64_t rows = 5;

// Counts the live and peak bytes of the blocks it hands out.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = default_allocator().allocate(bytes, alignment);
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    default_allocator().deallocate(p, bytes);
    live_ -= bytes;
  }
  Space space() const noexcept override { return Space::host; }
  std::size_t live() const noexcept { return live_; }
  std::size_t peak() const noexcept { return peak_; }
  void reset_peak() noexcept { peak_ = live_; }

 private:
  std::size_t live_ = 0, peak_ = 0;
};

struct Config {
  int ranks = 2;
  bool reproducible = true;
  bool adamw = true;
  int micro = 1;    // micro-batches per step
  double clip = 0;  // global-norm clipping
  int steps = 4;
  bool deep = false;       // deep_layers()
  bool deferred = false;   // sharded: built with deferred_arenas, init after the sync
  bool opt_first = false;  // the optimizers made before the sync (and before a deferred init)
  bool edit = false;       // after each update the parameters decay and are clamped
  FullyShardedOptions fs;
};

struct RankResult {
  std::vector<float> params;  // whole (replicated) or this rank's parts (sharded)
  std::vector<float> state;   // the optimizer's state arenas, back to back
  StateParts parts;           // sharded: the parts held
  std::vector<double> losses;
  std::size_t live_steady = 0, peak = 0;  // allocator bytes after the second step, peak after
  std::size_t first_peak = 0;             // the peak until then (construction included)
  std::size_t working = 0, held = 0, largest = 0;
  double norm = 0;
};

template <class Opt>
void keep_state(Opt& opt, std::vector<float>& out) {
  opt.for_each_state_arena([&](BufferView s) {
    const auto* f = static_cast<const float*>(s.data);
    out.insert(out.end(), f, f + s.count);
  });
}

// Each rank's rows of step s, micro-batch m.
void data(int rank, int step, int m, std::vector<float>& x, std::vector<float>& y) {
  x.resize(rows * 6);
  y.resize(rows * 3);
  const std::uint64_t seed = static_cast<std::uint64_t>(rank * 1000 + step * 10 + m);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = noise(seed, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = noise(seed + 7, i);
}

std::vector<RankResult> train(const Config& cfg, bool sharded) {
  std::vector<RankResult> out(static_cast<std::size_t>(cfg.ranks));
  run_loopback(cfg.ranks, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    c.reproducible = cfg.reproducible;
    Communicator comm(t, c);
    RankResult& res = out[static_cast<std::size_t>(t.rank())];
    CountingAllocator alloc;
    const bool deferred = sharded && cfg.deferred;
    std::unique_ptr<Sequential> model_p =
        deferred ? std::make_unique<Sequential>(cfg.deep ? deep_layers() : layers(), alloc,
                                                deferred_arenas)
                 : std::make_unique<Sequential>(cfg.deep ? deep_layers() : layers(), alloc);
    Sequential& model = *model_p;
    if (!deferred) model.init(11);
    SgdOptions so;
    so.momentum = 0.9;
    so.weight_decay = 1e-3;
    std::unique_ptr<AdamW> adamw_p;
    std::unique_ptr<Sgd> sgd_p;
    auto make_optimizers = [&] {
      adamw_p = std::make_unique<AdamW>(model, Schedule::constant(0.01));
      sgd_p = std::make_unique<Sgd>(model, Schedule::constant(0.05), so);
    };
    // Made before the sync, they hold the whole arenas' views, which the sync frees.
    if (cfg.opt_first) make_optimizers();
    std::unique_ptr<FullyShardedSync<Sequential>> fs;
    std::unique_ptr<GradientSync> sync;
    if (sharded)
      fs = std::make_unique<FullyShardedSync<Sequential>>(comm, model, cfg.fs);
    else
      sync = std::make_unique<GradientSync>(comm, model.gradients(), 256);
    if (deferred) model.init(11);  // draws this rank's parts
    if (!cfg.opt_first) make_optimizers();
    AdamW& adamw = *adamw_p;
    Sgd& sgd = *sgd_p;
    std::vector<float> x, y;
    for (int step = 0; step < cfg.steps; ++step) {
      model.zero_grad();
      double loss = 0;
      for (int m = 0; m < cfg.micro; ++m) {
        data(t.rank(), step, m, x, y);
        PassOptions pass;
        pass.loss_scale = 1.0 / cfg.micro;
        const bool last = m + 1 == cfg.micro;
        if (sharded || !last)
          loss += model.forward_backward(x.data(), y.data(), rows, Loss::mse, {}, pass);
        else
          loss += model.forward_backward(x.data(), y.data(), rows, Loss::mse, *sync, pass);
      }
      res.losses.push_back(loss);
      if (sharded) {
        if (cfg.clip > 0) {
          fs->wait();
          res.norm = fs->clip_grad_norm(cfg.clip);
          if (cfg.adamw)
            adamw.step();
          else
            sgd.step();
        } else if (cfg.adamw) {
          fs->wait(adamw);
        } else {
          fs->wait(sgd);
        }
      } else {
        sync->wait();
        if (cfg.clip > 0) res.norm = clip_grad_norm(model.gradients(), cfg.clip);
        if (cfg.adamw)
          adamw.step();
        else
          sgd.step();
      }
      if (cfg.edit) {
        // Collectives complete in order: whatever a sync started before this barrier (a gather
        // ahead of the next forward) has read the parts before they change.
        comm.barrier();
        // An average and a clamping of one's own, element-wise: the same bits in either mode.
        for (float& v : model.parameter_span()) v = std::clamp(0.97f * v, -0.3f, 0.3f);
      }
      if (step == 1) {  // the model's second input stage is made at the second pass
        res.first_peak = alloc.peak();
        res.live_steady = alloc.live();
        alloc.reset_peak();
      }
    }
    res.peak = alloc.peak();
    const auto p = model.parameter_span();
    res.params.assign(p.begin(), p.end());
    if (cfg.adamw)
      keep_state(adamw, res.state);
    else
      keep_state(sgd, res.state);
    if (sharded) {
      res.parts = model.arena_parts();
      res.working = fs->working_bytes();
      res.held = fs->held_elements();
      res.largest = fs->largest_unit();
    }
  });
  return out;
}

// The state arenas are back to back: pick each arena's parts.
std::vector<float> pick_state(const std::vector<float>& whole, std::size_t n,
                              const StateParts& parts) {
  std::vector<float> v;
  for (std::size_t a = 0; a * n < whole.size(); ++a) {
    const std::vector<float> arena(whole.begin() + static_cast<std::ptrdiff_t>(a * n),
                                   whole.begin() + static_cast<std::ptrdiff_t>((a + 1) * n));
    const auto part = pick(arena, parts);
    v.insert(v.end(), part.begin(), part.end());
  }
  return v;
}

void check_same_bits(const Config& cfg) {
  const auto ref = train(cfg, false);
  const auto fs = train(cfg, true);
  const std::size_t n = ref[0].params.size();
  std::size_t held = 0;
  for (int r = 0; r < cfg.ranks; ++r) {
    CAPTURE(r);
    const auto& a = ref[static_cast<std::size_t>(r)];
    const auto& b = fs[static_cast<std::size_t>(r)];
    const auto want = pick(a.params, b.parts);
    REQUIRE(want.size() == b.params.size());
    CHECK(std::memcmp(want.data(), b.params.data(), want.size() * sizeof(float)) == 0);
    const auto want_state = pick_state(a.state, n, b.parts);
    REQUIRE(want_state.size() == b.state.size());
    CHECK(std::memcmp(want_state.data(), b.state.data(), want_state.size() * sizeof(float)) == 0);
    CHECK(a.losses == b.losses);
    held += b.params.size();
  }
  CHECK(held == n);  // the parts cover the arena once
}

}  // namespace

TEST_CASE("fully sharded steps give the replicated step's bits (reproducible mode, 1-4 ranks)") {
  // Two working buffers (the default, gathering ahead) and one (the memory-tight mode).
  for (int buffers : {2, 1})
    for (int p = 1; p <= 4; ++p)
      for (bool adamw : {true, false}) {
        CAPTURE(buffers);
        CAPTURE(p);
        CAPTURE(adamw);
        Config cfg;
        cfg.ranks = p;
        cfg.adamw = adamw;
        cfg.fs.buffers = buffers;
        check_same_bits(cfg);
      }
}

TEST_CASE("fully sharded steps: unit layouts, buffers and prefetch keep the bits") {
  SUBCASE("2 ranks without reproducible mode") {
    Config cfg;
    cfg.reproducible = false;
    check_same_bits(cfg);
  }
  SUBCASE("one unit for the whole model") {
    Config cfg;
    cfg.ranks = 3;
    cfg.fs.unit_bytes = 1 << 20;
    check_same_bits(cfg);
  }
  SUBCASE("units of about 2 KiB, 3 buffers") {
    Config cfg;
    cfg.ranks = 3;
    cfg.fs.unit_bytes = 2048;
    cfg.fs.buffers = 3;
    check_same_bits(cfg);
  }
  SUBCASE("units of about 2 KiB, one buffer") {
    Config cfg;
    cfg.ranks = 3;
    cfg.fs.unit_bytes = 2048;
    cfg.fs.buffers = 1;
    cfg.fs.prefetch = false;
    check_same_bits(cfg);
  }
  SUBCASE("units given by their first layers, no prefetch") {
    Config cfg;
    cfg.ranks = 4;
    cfg.fs.unit_starts = {0, 3, 5};
    cfg.fs.prefetch = false;
    check_same_bits(cfg);
  }
}

TEST_CASE("fully sharded: accumulation and clipping agree with the replicated step") {
  // Variants 2 and 3 repeat 0 and 1 with one working buffer: the accumulating reduce-scatter
  // and its scratch part then share the single gradient buffer.
  for (int variant = 0; variant < 4; ++variant) {
    CAPTURE(variant);
    Config cfg;
    cfg.ranks = 3;
    if (variant % 2 == 0)
      cfg.micro = 2;
    else
      cfg.clip = 0.05;
    if (variant >= 2) cfg.fs.buffers = 1;
    const auto ref = train(cfg, false);
    const auto fs = train(cfg, true);
    for (int r = 0; r < cfg.ranks; ++r) {
      const auto& a = ref[static_cast<std::size_t>(r)];
      const auto& b = fs[static_cast<std::size_t>(r)];
      const auto want = pick(a.params, b.parts);
      REQUIRE(want.size() == b.params.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        REQUIRE(std::fabs(want[i] - b.params[i]) <= 1e-5f * (1 + std::fabs(want[i])));
      if (cfg.clip > 0) {
        CHECK(a.norm > cfg.clip);  // the clipping ran
        CHECK(std::fabs(a.norm - b.norm) <= 1e-9 * a.norm + 1e-12);
      }
    }
  }
}

TEST_CASE("fully sharded: a rank's live bytes are its parts plus the working buffers") {
  for (int p = 2; p <= 4; ++p) {
    CAPTURE(p);
    Config cfg;
    cfg.ranks = p;
    cfg.steps = 2;
    cfg.fs.unit_bytes = 0;  // a unit per layer with parameters
    const auto ref = train(cfg, false);
    const auto fs = train(cfg, true);
    const std::size_t n = ref[0].params.size();
    for (int r = 0; r < cfg.ranks; ++r) {
      CAPTURE(r);
      const auto& a = ref[static_cast<std::size_t>(r)];
      const auto& b = fs[static_cast<std::size_t>(r)];
      // Replicated: parameters, gradients, AdamW's two moments; sharded: this rank's parts of
      // the four, within one element per unit of n / p.
      const std::size_t units = 6;
      CHECK(b.held <= n / static_cast<std::size_t>(p) + units);
      // Everything else (activations, staging, loss slots) is the same in both models.
      const std::size_t other = a.live_steady - 4 * n * sizeof(float);
      CHECK(b.live_steady == 4 * b.held * sizeof(float) + b.working + other);
      // No step allocates, in either mode.
      CHECK(a.peak == a.live_steady);
      CHECK(b.peak == b.live_steady);
    }
  }
}

TEST_CASE("fully sharded, one working buffer: live bytes are the parts plus two unit buffers") {
  for (int p = 2; p <= 4; ++p) {
    CAPTURE(p);
    Config cfg;
    cfg.ranks = p;
    cfg.steps = 2;
    cfg.fs.buffers = 1;
    const auto ref = train(cfg, false);
    const auto fs = train(cfg, true);
    const std::size_t n = ref[0].params.size();
    for (int r = 0; r < cfg.ranks; ++r) {
      CAPTURE(r);
      const auto& a = ref[static_cast<std::size_t>(r)];
      const auto& b = fs[static_cast<std::size_t>(r)];
      // Linear(24, 24) inside the residual block: 600 elements, the largest unit.
      CHECK(b.largest == 600);
      // One parameter and one gradient buffer of the largest unit, nothing else.
      CHECK(b.working == 2 * b.largest * sizeof(float));
      const std::size_t other = a.live_steady - 4 * n * sizeof(float);
      CHECK(b.live_steady == 4 * b.held * sizeof(float) + 2 * b.largest * sizeof(float) + other);
      CHECK(a.peak == a.live_steady);
      CHECK(b.peak == b.live_steady);
    }
  }
}

TEST_CASE("fully sharded, deferred arenas: the same bits, and the whole arenas never exist") {
  for (int p = 1; p <= 4; ++p) {
    for (int buffers : {1, 2}) {
      CAPTURE(p);
      CAPTURE(buffers);
      Config cfg;
      cfg.ranks = p;
      cfg.fs.buffers = buffers;
      cfg.deferred = true;
      check_same_bits(cfg);
    }
  }
  for (int p = 2; p <= 4; ++p) {
    CAPTURE(p);
    Config cfg;
    cfg.ranks = p;
    cfg.steps = 2;
    cfg.deep = true;
    cfg.fs.buffers = 1;
    const auto ref = train(cfg, false);
    const auto whole = train(cfg, true);
    cfg.deferred = true;
    const auto lean = train(cfg, true);
    const std::size_t n = ref[0].params.size();
    for (int r = 0; r < cfg.ranks; ++r) {
      CAPTURE(r);
      const auto& a = ref[static_cast<std::size_t>(r)];
      const auto& b = whole[static_cast<std::size_t>(r)];
      const auto& c = lean[static_cast<std::size_t>(r)];
      // Built whole, the model's construction holds both whole arenas and init's staging.
      CHECK(b.first_peak >= 3 * n * sizeof(float));
      // Built deferred, nothing before the steps holds more than the steps do.
      CHECK(c.first_peak == c.live_steady);
      CHECK(c.first_peak < b.first_peak);
      CHECK(c.live_steady == b.live_steady);
      CHECK(c.live_steady < a.live_steady);
    }
  }
}

TEST_CASE("fully sharded: a model built with deferred arenas refuses use before it is sharded") {
  Sequential model(layers(), default_allocator(), deferred_arenas);
  CHECK(model.parameters().count == 0);
  CHECK(model.parameter_count() > 0);
  CHECK_THROWS_AS(model.init(1), InvalidArgument);
  std::vector<float> x(rows * 6, 0.5f);
  CHECK_THROWS_AS(model.forward(x.data(), rows), InvalidArgument);
  test::MemoryState state;
  CHECK_THROWS_AS(model.visit_state(state), InvalidArgument);
}

TEST_CASE("fully sharded: a model over a rank's budget trains on 4 ranks, same losses") {
  Config cfg;
  cfg.ranks = 4;
  cfg.deep = true;
  cfg.steps = 3;
  const auto ref = train(cfg, false);
  const auto fs = train(cfg, true);
  // The budget: 60% of what a replicated rank holds; the replicated run exceeds it, the fully
  // sharded one stays within it at every step (its peak after construction).
  const std::size_t budget = ref[0].live_steady * 6 / 10;
  for (int r = 0; r < cfg.ranks; ++r) {
    CAPTURE(r);
    const auto& a = ref[static_cast<std::size_t>(r)];
    const auto& b = fs[static_cast<std::size_t>(r)];
    CHECK(a.peak > budget);
    CHECK(b.peak <= budget);
    CHECK(a.losses == b.losses);  // the same loss curve, bit for bit (reproducible mode)
  }
}

namespace {

// The layers of the device runs: built-in layers only (the test's own layer reads its
// parameters on the host), a residual block among them.
std::vector<LayerSpec> device_layers() {
  return {Linear(6, 24), Tanh(),        Residual{Linear(24, 24), Gelu()},
          LayerNorm(24), Linear(24, 7), Relu(),
          Linear(7, 3)};
}

struct DeviceConfig {
  Config base;
  bool deferred = false;  // the device model built with deferred_arenas
  bool eager = false;     // the emulated device runs its streams eagerly
};

std::vector<float> floats_of(const std::vector<unsigned char>& b) {
  std::vector<float> v(b.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// One rank's steps on the policy `exec` (a model of Exec): replicated through GradientSync, or
// fully sharded. Parameters (whole or this rank's parts), optimizer state and losses into `res`;
// `download` brings exec memory to the host.
template <class Exec, class Comm, class Download>
void train_on(Exec& exec, Comm& comm, const DeviceConfig& dc, bool sharded, int rank,
              RankResult& res, bool& staged, Download download) {
  const Config& cfg = dc.base;
  using Model = BasicSequential<float, Exec>;
  const std::vector<LayerSpec> specs = device_layers();
  std::unique_ptr<Model> model_p =
      sharded && dc.deferred ? std::make_unique<Model>(std::vector<typename Model::entry_type>(
                                                           specs.begin(), specs.end()),
                                                       exec, deferred_arenas)
                             : std::make_unique<Model>(specs, exec);
  Model& model = *model_p;
  if (!(sharded && dc.deferred)) model.init(11);
  std::unique_ptr<FullyShardedSync<Model>> fs;
  std::unique_ptr<BasicGradientSync<Exec>> sync;
  if (sharded)
    fs = std::make_unique<FullyShardedSync<Model>>(comm, model, cfg.fs);
  else
    sync = std::make_unique<BasicGradientSync<Exec>>(exec, comm, model.gradients(), 256);
  if (sharded && dc.deferred) model.init(11);
  staged = fs ? fs->staged() : sync->staged();
  SgdOptions so;
  so.momentum = 0.9;
  so.weight_decay = 1e-3;
  BasicAdamW<Exec> adamw(model, Schedule::constant(0.01));
  BasicSgd<Exec> sgd(model, Schedule::constant(0.05), so);
  std::vector<float> x, y;
  for (int step = 0; step < cfg.steps; ++step) {
    model.zero_grad();
    double loss = 0;
    for (int m = 0; m < cfg.micro; ++m) {
      data(rank, step, m, x, y);
      PassOptions pass;
      pass.loss_scale = 1.0 / cfg.micro;
      auto ready = [&](std::size_t o, std::size_t c) {
        if (sync && m + 1 == cfg.micro) sync->ready(o, c);
      };
      loss += model.forward_backward(x.data(), y.data(), rows, Loss::mse, ready, pass);
    }
    res.losses.push_back(loss);
    if (sharded) {
      fs->wait();
      if (cfg.clip > 0) res.norm = fs->clip_grad_norm(cfg.clip);
    } else {
      sync->wait();
      if (cfg.clip > 0) {
        GradNormClipper<Exec> clip(exec);
        res.norm = clip(model.gradients(), cfg.clip);
      }
    }
    if (cfg.adamw)
      adamw.step();
    else
      sgd.step();
  }
  res.params = download(model.parameters());
  auto keep = [&](auto& opt) {
    opt.for_each_state_arena([&](BufferView v) {
      const std::vector<float> f = download(v);
      res.state.insert(res.state.end(), f.begin(), f.end());
    });
  };
  if (cfg.adamw)
    keep(adamw);
  else
    keep(sgd);
  if (sharded) res.parts = model.arena_parts();
}

// Replicated on the host, or fully sharded on the emulated device, per rank.
std::vector<RankResult> train_device(const DeviceConfig& dc, bool device,
                                     std::vector<char>& staged) {
  const Config& cfg = dc.base;
  std::vector<RankResult> out(static_cast<std::size_t>(cfg.ranks));
  staged.assign(static_cast<std::size_t>(cfg.ranks), 0);
  run_loopback(cfg.ranks, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    c.reproducible = cfg.reproducible;
    Communicator comm(t, c);
    const auto r = static_cast<std::size_t>(t.rank());
    bool st = false;
    if (device) {
      test::EmulatedDevice::Options o;
      o.lazy = !dc.eager;
      test::EmulatedDevice dev(o);
      train_on(dev, comm, dc, true, t.rank(), out[r], st,
               [&](BufferView v) { return floats_of(test::bytes_of(dev, v)); });
    } else {
      HostExec host;
      train_on(host, comm, dc, false, t.rank(), out[r], st,
               [&](BufferView v) { return floats_of(test::bytes_of(v)); });
    }
    staged[r] = st;
  });
  return out;
}

// The device run's parts against the host replicated run: the same bits (exact), or within
// rounding (tolerance > 0: accumulation, clipping).
void check_device(const DeviceConfig& dc, float tolerance = 0) {
  std::vector<char> host_staged, device_staged;
  const auto ref = train_device(dc, false, host_staged);
  const auto dev = train_device(dc, true, device_staged);
  const std::size_t n = ref[0].params.size();
  std::size_t held = 0;
  for (int r = 0; r < dc.base.ranks; ++r) {
    CAPTURE(r);
    const auto& a = ref[static_cast<std::size_t>(r)];
    const auto& b = dev[static_cast<std::size_t>(r)];
    // The loopback transport reaches host memory only: more than one rank stages.
    CHECK(static_cast<bool>(device_staged[static_cast<std::size_t>(r)]) == (dc.base.ranks > 1));
    const auto want = pick(a.params, b.parts);
    const auto want_state = pick_state(a.state, n, b.parts);
    REQUIRE(want.size() == b.params.size());
    REQUIRE(want_state.size() == b.state.size());
    if (tolerance == 0) {
      CHECK(std::memcmp(want.data(), b.params.data(), want.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(want_state.data(), b.state.data(), want_state.size() * sizeof(float)) == 0);
      CHECK(a.losses == b.losses);
    } else {
      for (std::size_t i = 0; i < want.size(); ++i)
        REQUIRE(std::fabs(want[i] - b.params[i]) <= tolerance * (1 + std::fabs(want[i])));
    }
    if (dc.base.clip > 0) {
      CHECK(a.norm > dc.base.clip);  // the clipping ran
      CHECK(std::fabs(a.norm - b.norm) <= 1e-9 * a.norm + 1e-12);
    }
    held += b.params.size();
  }
  CHECK(held == n);
}

}  // namespace

TEST_CASE("fully sharded on the emulated device gives the host replicated step's bits") {
  for (int p = 1; p <= 4; ++p) {
    for (int buffers : {1, 2}) {
      for (bool adamw : {true, false}) {
        CAPTURE(p);
        CAPTURE(buffers);
        CAPTURE(adamw);
        DeviceConfig dc;
        dc.base.ranks = p;
        dc.base.adamw = adamw;
        dc.base.fs.buffers = buffers;
        check_device(dc);
      }
    }
  }
  {  // 3 buffers, units of about 2 KiB, deferred arenas, eager streams
    DeviceConfig dc;
    dc.base.ranks = 3;
    dc.base.fs.buffers = 3;
    dc.base.fs.unit_bytes = 2048;
    dc.deferred = true;
    dc.eager = true;
    check_device(dc);
  }
  {  // one buffer, no prefetch, deferred arenas, 4 ranks
    DeviceConfig dc;
    dc.base.ranks = 4;
    dc.base.fs.buffers = 1;
    dc.base.fs.prefetch = false;
    dc.deferred = true;
    check_device(dc);
  }
}

TEST_CASE("fully sharded on the emulated device: passes are ordered by events, not by syncs") {
  // Gathers and reduce-scatters wait for device work on events: a pass queues every unit
  // without synchronising the compute stream (each forward refreshes the host copy of the
  // parameter parts once: the host reads them), and the steps keep the replicated bits (above).
  for (int buffers : {1, 2}) {
    CAPTURE(buffers);
    run_loopback(2, [&](LoopbackTransport& t) {
      CommConfig c;
      c.timeout_s = 60;
      Communicator comm(t, c);
      test::EmulatedDevice dev;
      using Model = BasicSequential<float, test::EmulatedDevice>;
      Model model(device_layers(), dev);
      model.init(11);
      FullyShardedOptions o;
      o.buffers = buffers;
      FullyShardedSync<Model> fs(comm, model, o);
      REQUIRE(fs.staged());
      REQUIRE(fs.unit_count() >= 4);
      BasicAdamW<test::EmulatedDevice> opt(model, Schedule::constant(0.01));
      std::vector<float> x, y;
      for (int step = 0; step < 3; ++step) {
        data(t.rank(), step, 0, x, y);
        model.zero_grad();
        const std::uint64_t before = dev.stream_synchronizations();
        model.forward_backward(x.data(), y.data(), rows, Loss::mse);
        const std::uint64_t during = dev.stream_synchronizations() - before;
        // One synchronisation per pass: its forward refreshes the host copy of the parameter
        // parts that the step before updated on the device (parameters may change between steps);
        // no unit's gather or reduce-scatter synchronises.
        CHECK(during == 1u);
        fs.wait(opt);
      }
    });
  }
}

TEST_CASE("fully sharded on the emulated device: accumulation and clipping to rounding") {
  for (int buffers : {1, 2}) {
    for (int variant = 0; variant < 2; ++variant) {
      CAPTURE(buffers);
      CAPTURE(variant);
      DeviceConfig dc;
      dc.base.ranks = 3;
      dc.base.fs.buffers = buffers;
      if (variant == 0)
        dc.base.micro = 2;
      else
        dc.base.clip = 0.05;
      check_device(dc, 1e-5f);
    }
  }
}

TEST_CASE("fully sharded: an optimizer made before the sync follows the model to its parts") {
  // The order model, optimizer, sync: the optimizer saw the whole arenas that the sync frees.
  for (bool deferred : {false, true})
    for (bool adamw : {true, false}) {
      CAPTURE(deferred);
      CAPTURE(adamw);
      Config cfg;
      cfg.steps = 3;
      cfg.adamw = adamw;
      cfg.deferred = deferred;
      cfg.opt_first = true;
      check_same_bits(cfg);
    }
}

TEST_CASE("fully sharded: parameters changed between wait(opt) and the next forward are seen") {
  // With units gathered ahead (2 and 3 buffers) and without; the edit changes every part.
  for (int buffers : {2, 3, 1}) {
    CAPTURE(buffers);
    Config cfg;
    cfg.steps = 3;
    cfg.edit = true;
    cfg.fs.buffers = buffers;
    check_same_bits(cfg);
  }
}

TEST_CASE("fully sharded: wait(opt) refuses an optimizer of the freed whole arenas") {
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t);
    Sequential model(layers());
    model.init(3);
    // Made from the views, not the model: it cannot follow.
    Sgd stale(model.parameters(), model.gradients(), Schedule::constant(0.1));
    FullyShardedSync fs(comm, model);
    std::vector<float> x(rows * 6, 0.5f), y(rows * 3, 0.25f);
    model.zero_grad();
    model.forward_backward(x.data(), y.data(), rows, Loss::mse);
    CHECK_THROWS_WITH_AS(fs.wait(stale), doctest::Contains("not the sharded model's parts"),
                         InvalidArgument);
  });
}

TEST_CASE("fully sharded: refused visitors and a sync that is gone") {
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t);
    Sequential model(layers());
    model.init(3);
    std::vector<float> x(rows * 6, 0.5f), y(rows * 3, 0.25f);
    {
      FullyShardedSync fs(comm, model);
      CHECK(model.fully_sharded());
      test::MemoryState saver;  // takes whole tensors only
      CHECK_THROWS_AS(model.visit_state(saver), InvalidArgument);
      model.zero_grad();
      model.forward_backward(x.data(), y.data(), rows, Loss::mse);
      fs.wait();
      CHECK_THROWS_WITH_AS(fs.wait(), doctest::Contains("no backward pass since the last step"),
                           InvalidArgument);
    }
    CHECK_THROWS_AS(model.forward(x.data(), rows), InvalidArgument);
  });
}

}  // namespace dtrain_test_comm_fully_sharded_test
