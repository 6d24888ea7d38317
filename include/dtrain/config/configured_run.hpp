// SPDX-License-Identifier: BSD-3-Clause
// dtrain: a whole training run built from its description (RunConfig) on an MPI communicator:
// model, optimizer, gradient sync in the configured mode, checkpointer, and an optional in-situ
// store of samples with running normalisation. What the C API (bindings/c/dtrain.h) and the
// Fortran module drive; C++ code may use it directly. Needs the `config`, `mpi` and `hdf5`
// components.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/checkpointer.hpp>
#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/fully_sharded.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/config/build.hpp>
#include <dtrain/config/run_config.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/data/running_stats.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/model/loss.hpp>
#include <dtrain/model/sequential.hpp>
#include <dtrain/optim/clip.hpp>
#include <dtrain/transports/mpi.hpp>

namespace dtrain {

/// Options of ConfiguredRun::open_store.
struct StoreOptions {
  /// Samples kept on this rank (at least 1).
  std::int64_t capacity = 0;
  /// What a full store does with a new sample (InMemoryDataset's Eviction).
  Eviction eviction = Eviction::oldest;
  /// Normalise the inputs per channel by the running statistics of every input fed so far on
  /// every rank (RunningStats, merged over the ranks at each step from the store); predict and
  /// evaluate apply the statistics of the last such step (this rank's own before the first).
  bool normalise = false;
};

/// Loss, and for class labels the fraction classified correctly (-1 for value targets).
struct Evaluation {
  double loss = 0;
  double accuracy = -1;
};

namespace detail {

// Whether policy E tells its own memory from other memory: `bool is_device(const void*)`.
template <class E, class = void>
struct exec_tells_memory : std::false_type {};
template <class E>
struct exec_tells_memory<
    E, std::void_t<decltype(bool{std::declval<E&>().is_device(std::declval<const void*>())})>>
    : std::true_type {};

// The run for one scalar type, policy and optimizer: everything ConfiguredRun owns past the
// communicator. Arrays come in as void pointers with their dtype; host arrays of the model's own
// type are read in place, the other float type is converted through a staging buffer; device
// arrays (train_device, predict_device) are the model's type, copied device to device.
class ConfiguredRunBase {
 public:
  virtual ~ConfiguredRunBase() = default;
  virtual bool on_device() const = 0;
  // 1: p is the policy's (device) memory; 0: it is not; -1: the policy cannot tell.
  virtual int holds(const void* p) const = 0;
  virtual double train_device(const void* x, DType xt, const void* t, DType tt, std::int64_t b) = 0;
  virtual void predict_device(const void* x, DType xt, void* y, DType yt, std::int64_t b) = 0;
  virtual const Shape& input_shape() const = 0;
  virtual const Shape& output_shape() const = 0;
  virtual std::size_t parameter_count() const = 0;
  virtual std::int64_t step() const = 0;
  virtual double train(const void* x, DType xt, const void* t, DType tt, std::int64_t b) = 0;
  virtual void predict(const void* x, DType xt, void* y, DType yt, std::int64_t b) = 0;
  virtual Evaluation evaluate(const void* x, DType xt, const void* t, DType tt, std::int64_t b) = 0;
  virtual void copy_parameters(void* out, DType t) = 0;
  virtual void save() = 0;
  virtual bool maybe_save() = 0;
  virtual std::optional<std::int64_t> restore_latest() = 0;
  virtual void wait_checkpoints() = 0;
  virtual void open_store(const StoreOptions& o) = 0;
  virtual void store_add(const void* x, DType xt, const void* t, DType tt, std::int64_t n) = 0;
  virtual std::int64_t store_size() const = 0;
  virtual std::int64_t store_fed() const = 0;
  virtual double train_from_store(std::int64_t b) = 0;
  virtual void checkpoint_array(const std::string& name, void* data, DType t, std::int64_t n) = 0;
};

template <class To>
const To* as_type(const void* p, DType t, std::size_t n, std::vector<To>& stage) {
  if (t == dtype_of_v<To>) return static_cast<const To*>(p);
  stage.resize(n);
  if (t == DType::f32)
    std::copy_n(static_cast<const float*>(p), n, stage.begin());
  else
    std::copy_n(static_cast<const double*>(p), n, stage.begin());
  return stage.data();
}

// Opt: BasicSgd<Exec> or BasicAdamW<Exec>. exec: the policy the run borrows (null: the model's
// own, made from the default allocator, which is how a host run is built).
template <class T, class Exec, class Opt>
class ConfiguredRunOf final : public ConfiguredRunBase {
 public:
  using Model = BasicSequential<T, Exec>;

  ConfiguredRunOf(Communicator<MpiTransport>& comm, const RunConfig& cfg, Exec* exec)
      : comm_(comm), cfg_(cfg), model_(build(cfg, exec)) {
    const SyncConfig& s = cfg.sync;
    if (s.mode == SyncMode::fully_sharded) {
      fully_ = std::make_unique<FullyShardedSync<Model>>(comm, model_, fully_sharded_options(cfg));
    } else {
      DTRAIN_REQUIRE(s.mode == SyncMode::replicated || cfg.optimizer.clip_grad_norm <= 0,
                     "ConfiguredRun",
                     cfg.source << ": optimizer.clip_grad_norm needs sync.mode replicated or "
                                   "fully_sharded (a sharded step averages each rank's part only)");
      sync_ = std::make_unique<BasicGradientSync<Exec>>(model_.exec(), comm, model_.gradients(),
                                                        s.bucket_bytes, s.algorithm);
      if (cfg.optimizer.clip_grad_norm > 0)
        clipper_ = std::make_unique<GradNormClipper<Exec>>(model_.exec());
    }
    opt_ = std::make_unique<Opt>(make_optimizer<Opt>(model_, cfg.optimizer));
    if (s.mode == SyncMode::sharded) sync_->shard_updates(model_.parameters());
    if (!cfg.checkpoint.directory.empty()) {
      ckpt_ = std::make_unique<Checkpointer<Communicator<MpiTransport>>>(
          comm, cfg.checkpoint.directory, checkpoint_options(cfg));
    }
  }

  const Shape& input_shape() const override { return model_.input_shape(); }
  const Shape& output_shape() const override { return model_.output_shape(); }
  std::size_t parameter_count() const override { return model_.parameter_count(); }
  std::int64_t step() const override { return opt_->step_count(); }
  bool on_device() const override { return Exec::space != Space::host; }
  int holds(const void* p) const override {
    if constexpr (exec_tells_memory<Exec>::value)
      return model_.exec().is_device(p) ? 1 : 0;
    else
      return -1;
  }

  double train_device(const void* x, DType xt, const void* t, DType tt, std::int64_t b) override {
    constexpr const char* op = "ConfiguredRun::train_step_device";
    model_type(op, "x", xt);
    if (tt != DType::i32) model_type(op, "the targets", tt);
    PassOptions o;
    o.exec_inputs = true;
    const T* xp = static_cast<const T*>(x);
    if (tt == DType::i32) return step_on(xp, static_cast<const std::int32_t*>(t), b, o);
    return step_on(xp, static_cast<const T*>(t), b, o);
  }

  void predict_device(const void* x, DType xt, void* y, DType yt, std::int64_t b) override {
    constexpr const char* op = "ConfiguredRun::predict_device";
    model_type(op, "x", xt);
    model_type(op, "y", yt);
    DTRAIN_REQUIRE(!normalise_, op,
                   "the store normalises the inputs on the host (open_store with normalise): "
                   "predict from host arrays");
    PassOptions eval;
    eval.training = false;
    eval.exec_inputs = true;
    const T* o = model_.forward(static_cast<const T*>(x), b, eval);
    Exec& e = model_.exec();
    e.copy_d2d(e.compute_stream(), y, o, n_out(b) * sizeof(T));
    exec_synchronize(e, e.compute_stream(), exec_timeout_s(), op);
  }

  double train(const void* x, DType xt, const void* t, DType tt, std::int64_t b) override {
    const T* xp = as_type<T>(x, xt, n_in(b), xs_);
    if (tt == DType::i32) return step_on(xp, static_cast<const std::int32_t*>(t), b);
    return step_on(xp, as_type<T>(t, tt, n_out(b), ts_), b);
  }

  void predict(const void* x, DType xt, void* y, DType yt, std::int64_t b) override {
    const T* o = forward_eval(x, xt, b);
    const std::size_t n = n_out(b);
    if (yt == DType::f32)
      std::copy_n(o, n, static_cast<float*>(y));
    else
      std::copy_n(o, n, static_cast<double*>(y));
  }

  Evaluation evaluate(const void* x, DType xt, const void* t, DType tt, std::int64_t b) override {
    const T* o = forward_eval(x, xt, b);
    const std::int64_t classes = model_.out_features();
    const std::size_t n = n_out(b);
    Evaluation e;
    if (tt == DType::i32) {
      const auto* labels = static_cast<const std::int32_t*>(t);
      std::int64_t right = 0;
      for (std::int64_t r = 0; r < b; ++r)
        right += std::max_element(o + r * classes, o + (r + 1) * classes) - (o + r * classes) ==
                 labels[r];
      e.accuracy = b > 0 ? double(right) / double(b) : 0.0;
      if (cfg_.loss == Loss::softmax_cross_entropy) {
        e.loss = softmax_cross_entropy<T>(
            span<const T>(o, n), span<const std::int32_t>(labels, std::size_t(b)), b, classes);
      } else {
        ts_.assign(n, T(0));
        for (std::int64_t r = 0; r < b; ++r) {
          DTRAIN_REQUIRE(
              labels[r] >= 0 && labels[r] < classes, "ConfiguredRun::evaluate",
              "label " << labels[r] << " of sample " << r << " is not in [0, " << classes << ")");
          ts_[std::size_t(r * classes + labels[r])] = T(1);
        }
        e.loss = mse<T>(span<const T>(o, n), span<const T>(ts_.data(), n));
      }
    } else {
      DTRAIN_REQUIRE(cfg_.loss == Loss::mse, "ConfiguredRun::evaluate",
                     "value targets need loss mse, but " << cfg_.source << " configures "
                                                         << name_of(cfg_.loss));
      const T* tp = as_type<T>(t, tt, n, ts_);
      e.loss = mse<T>(span<const T>(o, n), span<const T>(tp, n));
    }
    return e;
  }

  void copy_parameters(void* out, DType t) override {
    constexpr const char* op = "ConfiguredRun::copy_parameters";
    DTRAIN_REQUIRE(!fully_, op,
                   "sync.mode fully_sharded: each rank holds a part of the parameters only");
    const BufferView v = model_.parameters();
    out_.resize(v.count);
    Exec& e = model_.exec();
    e.copy_d2h(e.compute_stream(), out_.data(), v.data, v.bytes());
    exec_synchronize(e, e.compute_stream(), exec_timeout_s(), op);
    if (t == DType::f32)
      std::copy(out_.begin(), out_.end(), static_cast<float*>(out));
    else
      std::copy(out_.begin(), out_.end(), static_cast<double*>(out));
  }

  void save() override {
    with_items([&](const auto&... o) { ckpt("save").save(step(), o...); });
  }
  bool maybe_save() override {
    if (!ckpt_) return false;
    return with_items([&](const auto&... o) { return ckpt_->maybe_save(step(), o...); });
  }
  std::optional<std::int64_t> restore_latest() override {
    auto& c = ckpt("restore_latest");
    if (store_) {
      // A store's saved shapes follow its sample count: its count first, then the store sized to
      // it (the restore overwrites every slot), so that the sampler over it restores too.
      if (!c.restore_latest(per_rank("store_count", store_count_))) return std::nullopt;
      const std::vector<float> in(std::size_t(model_.in_features()), 0.0f),
          out(std::size_t(model_.out_features()), 0.0f);
      while (std::int64_t(store_->size()) < store_count_.stored) store_->append_pair(in, out);
      sampler_->set_num_samples(std::size_t(store_count_.sampled));
    }
    return with_items([&](const auto&... o) { return c.restore_latest(o...); });
  }
  void wait_checkpoints() override {
    if (ckpt_) ckpt_->wait();
  }

  void checkpoint_array(const std::string& name, void* data, DType t, std::int64_t n) override {
    constexpr const char* op = "ConfiguredRun::checkpoint_array";
    DTRAIN_REQUIRE(!name.empty() && name.size() <= 64 &&
                       std::all_of(name.begin(), name.end(),
                                   [](char c) {
                                     return std::isalnum(static_cast<unsigned char>(c)) ||
                                            c == '_' || c == '-' || c == '.';
                                   }),
                   op,
                   "name '" << name
                            << "': 1-64 letters, digits, '_', '-' or '.' (a dataset name in the "
                               "checkpoint)");
    DTRAIN_REQUIRE(n >= 1, op, "'" << name << "': count " << n << " (at least 1)");
    DTRAIN_REQUIRE(data, op, "'" << name << "': the array is null");
    DTRAIN_REQUIRE(t == DType::f32 || t == DType::f64 || t == DType::i32, op,
                   "'" << name << "': element type " << name_of(t) << " (f32, f64 or i32)");
    for (const auto& a : arrays_.entries)
      DTRAIN_REQUIRE(a.name != name, op, "'" << name << "' is registered already");
    arrays_.entries.push_back({name, data, t, n});
  }

  void open_store(const StoreOptions& o) override {
    constexpr const char* op = "ConfiguredRun::open_store";
    DTRAIN_REQUIRE(!store_, op, "the store is open already (once per run)");
    DTRAIN_REQUIRE(o.capacity >= 1, op, "capacity " << o.capacity << " (at least 1)");
    InMemoryOptions io;
    io.eviction = o.eviction;
    io.seed = cfg_.seed;
    store_ = std::make_unique<InMemoryDataset>(model_.input_shape(), model_.output_shape(),
                                               std::size_t(o.capacity), io);
    SamplerOptions so;
    so.drop_last = true;
    sampler_ = std::make_unique<DistributedSampler>(0, 0, 1, cfg_.seed, so);
    normalise_ = o.normalise;
    const Shape& s = model_.input_shape();
    // Channels-first samples: statistics per channel over the spatial points; a flat sample:
    // per feature.
    channels_ = s.size() > 1 ? std::size_t(s[0]) : std::size_t(model_.in_features());
    inner_ = std::size_t(model_.in_features()) / channels_;
    stats_ = std::make_unique<RunningStats>(channels_);  // checkpointed whether used or not
  }

  void store_add(const void* x, DType xt, const void* t, DType tt, std::int64_t n) override {
    DTRAIN_REQUIRE(store_, "ConfiguredRun::store_add", "no store: call open_store first");
    const float* xf = as_type<float>(x, xt, n_in(n), xf_);
    const float* tf = as_type<float>(t, tt, n_out(n), tf_);
    if (normalise_) stats_->update(span<const float>(xf, n_in(n)), inner_);
    store_->append_pairs(span<const float>(xf, n_in(n)), span<const float>(tf, n_out(n)));
  }
  std::int64_t store_size() const override { return store_ ? std::int64_t(store_->size()) : 0; }
  std::int64_t store_fed() const override { return store_ ? std::int64_t(store_->appended()) : 0; }

  double train_from_store(std::int64_t b) override {
    constexpr const char* op = "ConfiguredRun::train_step_from_store";
    DTRAIN_REQUIRE(store_, op, "no store: call open_store first");
    DTRAIN_REQUIRE(
        b >= 1 && std::size_t(b) <= store_->size(), op,
        "batch " << b << " but this rank's store holds " << store_->size() << " samples");
    const auto B = std::size_t(b);
    if (sampler_->num_samples() != store_->size()) sampler_->set_num_samples(store_->size());
    if (sampler_->batch_rows_at(sampler_->position(), B) == 0)
      sampler_->set_epoch(sampler_->epoch() + 1);
    const auto idx = sampler_->next_indices(B);
    sampler_->advance(B);
    xf_.resize(n_in(b));
    tf_.resize(n_out(b));
    store_->read_pairs(idx, xf_, tf_);
    if (normalise_) {
      merged_ = std::make_unique<RunningStats>(stats_->merged(comm_));
      merged_->normalise(span<float>(xf_), inner_);
    }
    const T* xp = as_type<T>(xf_.data(), DType::f32, n_in(b), xs_);
    return step_on(xp, as_type<T>(tf_.data(), DType::f32, n_out(b), ts_), b);
  }

 private:
  static Model build(const RunConfig& cfg, Exec* exec) {
    if constexpr (std::is_constructible_v<Exec, Allocator&>) {
      if (!exec) return make_model<T, Exec>(cfg);
    }
    return make_model<T>(cfg, *exec);
  }

  std::size_t n_in(std::int64_t b) const { return std::size_t(b * model_.in_features()); }
  std::size_t n_out(std::int64_t b) const { return std::size_t(b * model_.out_features()); }

  // Device arrays are read in place: they must be the model's own type.
  void model_type(const char* op, const char* name, DType t) const {
    DTRAIN_REQUIRE(t == dtype_of_v<T>, op,
                   name << " is " << name_of(t) << " but the model is " << name_of(dtype_of_v<T>)
                        << " (" << cfg_.source
                        << ": model.dtype): device arrays are read in place, in the model's type");
  }

  template <class Target>
  double step_on(const T* x, const Target* t, std::int64_t b, const PassOptions& o = {}) {
    model_.zero_grad();
    if (fully_) {
      const double loss = model_.forward_backward(x, t, b, cfg_.loss, {}, o).get();
      fully_->wait(*opt_);
      return loss;
    }
    const double loss = model_.forward_backward(x, t, b, cfg_.loss, *sync_, o).get();
    if (clipper_) {
      sync_->wait();
      (*clipper_)(model_.gradients(), cfg_.optimizer.clip_grad_norm);
      opt_->step();
    } else {
      sync_->wait(*opt_);
    }
    return loss;
  }

  const T* forward_eval(const void* x, DType xt, std::int64_t b) {
    const T* xp = nullptr;
    if (normalise_) {
      const RunningStats* s = merged_ ? merged_.get() : stats_.get();
      xn_.resize(n_in(b));
      const T* raw = as_type<T>(x, xt, n_in(b), xs_);
      std::copy_n(raw, n_in(b), xn_.begin());
      s->normalise(span<T>(xn_), inner_);
      xp = xn_.data();
    } else {
      xp = as_type<T>(x, xt, n_in(b), xs_);
    }
    PassOptions eval;
    eval.training = false;
    model_.forward(xp, b, eval);
    out_.resize(n_out(b));
    model_.copy_output(out_.data());
    return out_.data();
  }

  Checkpointer<Communicator<MpiTransport>>& ckpt(const char* what) {
    DTRAIN_REQUIRE(ckpt_, std::string("ConfiguredRun::") + what,
                   cfg_.source << " configures no checkpoint directory (checkpoint.directory)");
    return *ckpt_;
  }

  // Everything a checkpoint holds: the run's description first (a restore under another
  // description is refused before anything loads), the model and the optimizer; with a store,
  // each rank's samples, the sampler's position over them and the running statistics.
  // Then the caller's registered arrays, each rank's own (checkpoint_array).
  template <class F>
  decltype(auto) with_items(F&& f) {
    auto and_arrays = [&](const auto&... o) -> decltype(auto) {
      if (arrays_.entries.empty()) return f(o...);
      return f(o..., per_rank("arrays", arrays_));
    };
    if (!store_)
      return and_arrays(named("run_config", cfg_), named("model", model_),
                        named("optimizer", *opt_));
    store_count_.stored = std::int64_t(store_->size());
    store_count_.sampled = std::int64_t(sampler_->num_samples());
    return and_arrays(named("run_config", cfg_), named("model", model_), named("optimizer", *opt_),
                      per_rank("store_count", store_count_), per_rank("store", *store_),
                      per_rank("store_sampler", *sampler_), per_rank("store_stats", *stats_));
  }

  // The caller's arrays saved and restored in place (one dataset each, 1-d).
  struct CallerArrays {
    struct Entry {
      std::string name;
      void* data;
      DType dtype;
      std::int64_t count;
    };
    std::vector<Entry> entries;
    template <class V>
    void visit_state(V& v) {
      for (const Entry& e : entries)
        v.tensor(e.name, BufferView(e.data, std::size_t(e.count), e.dtype), Shape{e.count});
    }
  };

  // The samples a rank's store held when saved and those its sampler covered (it catches up
  // with the store at the next step): restored first, they size the store and the sampler.
  struct StoreCount {
    std::int64_t stored = 0, sampled = 0;
    template <class V>
    void visit_state(V& v) {
      v.scalar("stored", stored);
      v.scalar("sampled", sampled);
    }
  };

  Communicator<MpiTransport>& comm_;
  CallerArrays arrays_;
  RunConfig cfg_;
  Model model_;
  std::unique_ptr<FullyShardedSync<Model>> fully_;
  std::unique_ptr<BasicGradientSync<Exec>> sync_;
  std::unique_ptr<GradNormClipper<Exec>> clipper_;
  std::unique_ptr<Opt> opt_;
  std::unique_ptr<Checkpointer<Communicator<MpiTransport>>> ckpt_;
  std::vector<T> xs_, ts_, xn_, out_;  // out_: host copy of an output or of the parameters
  std::vector<float> xf_, tf_;
  std::unique_ptr<InMemoryDataset> store_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<RunningStats> stats_, merged_;
  StoreCount store_count_;
  bool normalise_ = false;
  std::size_t channels_ = 1, inner_ = 1;
};

}  // namespace detail

/// A training run built from its description: the model of RunConfig::layers (initialised from
/// RunConfig::seed), its optimizer and schedule, the gradient sync of RunConfig::sync (replicated,
/// sharded or fully sharded), a Checkpointer on RunConfig::checkpoint (when it names a
/// directory), and on request an in-situ store of (input, target) pairs. The same objects a C++
/// user builds by hand (see <dtrain/config/build.hpp>); the C API and the Fortran module are
/// handles over this class.
///
/// Arrays are owned by the caller, read or written during the call only: x is a batch of
/// channels-first samples in C order [batch][input shape...] (a Fortran x(nx, ny, nchan, nbatch)
/// as it is), targets [batch][output shape...] or int32 class labels [batch]. Host arrays go to
/// train_step, predict, evaluate and store_add: float or double, the model's own type
/// (RunConfig::dtype) read in place, the other converted. A run built on a device policy (the
/// constructor taking one) keeps model, gradients and optimizer state in the device's memory;
/// host arrays are staged to it, and device arrays of the model's type go to train_step_device
/// and predict_device. A policy that tells its memory from other memory (`bool is_device(const
/// void*)`: GpuExec, the tests' emulated device) has each array checked against the call.
///
/// Collective over the communicator: construction, destruction (waits for checkpoint writes),
/// train_step, train_step_from_store, save, maybe_save, restore_latest, wait_checkpoints; with
/// sync.mode fully_sharded also predict and evaluate (every forward gathers parameters). The rest
/// is local. Not thread-safe: one thread drives a run.
class ConfiguredRun {
 public:
  /// Collective over `comm` (duplicated by the transport). Builds the run `config` describes.
  /// MPI must be initialised (any thread level; MPI_THREAD_MULTIPLE enables the communicator's
  /// progress thread). Throws InvalidArgument on a description the library refuses.
  ConfiguredRun(MPI_Comm comm, RunConfig config)
      : config_(std::move(config)),
        transport_(std::make_unique<MpiTransport>(comm)),
        comm_(std::make_unique<Communicator<MpiTransport>>(*transport_, comm_config(config_))) {
    build<HostExec>(nullptr);
  }
  /// Collective over `comm`. Builds the run `config` describes on execution policy `exec`
  /// (borrowed: it must outlive the run), e.g. GpuExec: model, gradients and optimizer state in
  /// its memory, every kernel on its compute stream. Sync modes as the policy supports them
  /// (sharded updates need host gradients: InvalidArgument on a device).
  template <class Exec>
  ConfiguredRun(MPI_Comm comm, RunConfig config, Exec& exec)
      : config_(std::move(config)),
        transport_(std::make_unique<MpiTransport>(comm)),
        comm_(std::make_unique<Communicator<MpiTransport>>(*transport_, comm_config(config_))) {
    static_assert(detail::check_exec_policy<Exec>(), "ConfiguredRun needs an execution policy");
    build<Exec>(&exec);
  }
  /// Collective. Reads the description from `config_path` (read_run_config: IoError when
  /// unreadable, InvalidArgument naming file and key when malformed) and builds it.
  ConfiguredRun(MPI_Comm comm, const std::string& config_path)
      : ConfiguredRun(comm, read_run_config(config_path)) {}
  ConfiguredRun(const ConfiguredRun&) = delete;
  ConfiguredRun& operator=(const ConfiguredRun&) = delete;

  /// The description the run was built from.
  const RunConfig& config() const noexcept { return config_; }
  /// The run's communicator (for the caller's own collectives beside the run's).
  Communicator<MpiTransport>& communicator() noexcept { return *comm_; }
  int rank() const noexcept { return static_cast<int>(comm_->rank()); }
  int size() const noexcept { return static_cast<int>(comm_->size()); }
  /// Scalar type of the model (f32 or f64).
  DType dtype() const noexcept { return config_.dtype; }
  /// Whether the model lives in device memory (a run built on a device policy).
  bool on_device() const { return run_->on_device(); }
  /// Shape of one input (output) sample and its elements.
  const Shape& input_shape() const { return run_->input_shape(); }
  const Shape& output_shape() const { return run_->output_shape(); }
  std::int64_t in_features() const { return elements(input_shape()); }
  std::int64_t out_features() const { return elements(output_shape()); }
  /// Learnable scalars of the whole model.
  std::size_t parameter_count() const { return run_->parameter_count(); }
  /// Optimizer steps taken (restored by restore_latest).
  std::int64_t step() const { return run_->step(); }

  /// Collective. One optimizer step on this rank's `batch` samples: zero the gradients, forward,
  /// loss against `targets` (X-typed values for mse, int32 labels), backward with the gradients
  /// averaged over the ranks, update. Returns the mean loss of this rank's batch.
  template <class X, class Y>
  double train_step(const X* x, const Y* targets, std::int64_t batch) {
    constexpr const char* op = "ConfiguredRun::train_step";
    check_types<X, Y>(op, x, targets, batch);
    host_memory(op, "x", x);
    host_memory(op, "the targets", targets);
    return run_->train(x, dtype_of_v<X>, targets, dtype_of_v<Y>, batch);
  }
  /// Collective. train_step on device arrays (a run on a device policy): x and targets in the
  /// policy's memory, of the model's type (labels int32), copied on the run's compute stream.
  /// The caller's device work that writes them must be complete; they may change on return.
  template <class X, class Y>
  double train_step_device(const X* x, const Y* targets, std::int64_t batch) {
    constexpr const char* op = "ConfiguredRun::train_step_device";
    check_types<X, Y>(op, x, targets, batch);
    device_memory(op, "x", x);
    device_memory(op, "the targets", targets);
    return run_->train_device(x, dtype_of_v<X>, targets, dtype_of_v<Y>, batch);
  }
  /// Evaluation forward of `batch` samples into y ([batch][output shape...]). Local (collective
  /// when fully sharded).
  template <class X, class Y>
  void predict(const X* x, Y* y, std::int64_t batch) {
    static_assert(!std::is_same_v<Y, std::int32_t>, "predict writes float or double outputs");
    constexpr const char* op = "ConfiguredRun::predict";
    check_types<X, Y>(op, x, y, batch);
    host_memory(op, "x", x);
    host_memory(op, "y", y);
    run_->predict(x, dtype_of_v<X>, y, dtype_of_v<Y>, batch);
  }
  /// predict on device arrays (a run on a device policy; the model's type): y is written when
  /// the call returns. Local (collective when fully sharded). Not with a normalising store.
  template <class X, class Y>
  void predict_device(const X* x, Y* y, std::int64_t batch) {
    static_assert(!std::is_same_v<Y, std::int32_t>, "predict writes float or double outputs");
    constexpr const char* op = "ConfiguredRun::predict_device";
    check_types<X, Y>(op, x, y, batch);
    device_memory(op, "x", x);
    device_memory(op, "y", y);
    run_->predict_device(x, dtype_of_v<X>, y, dtype_of_v<Y>, batch);
  }
  /// Evaluation of `batch` samples against targets (as train_step). Local (collective when
  /// fully sharded).
  template <class X, class Y>
  Evaluation evaluate(const X* x, const Y* targets, std::int64_t batch) {
    constexpr const char* op = "ConfiguredRun::evaluate";
    check_types<X, Y>(op, x, targets, batch);
    host_memory(op, "x", x);
    host_memory(op, "the targets", targets);
    return run_->evaluate(x, dtype_of_v<X>, targets, dtype_of_v<Y>, batch);
  }
  /// Local. Copies the whole parameter arena (parameter_count() values, converted to P) into
  /// out. Not when fully sharded (InvalidArgument).
  template <class P>
  void copy_parameters(P* out) {
    static_assert(std::is_same_v<P, float> || std::is_same_v<P, double>, "float or double");
    DTRAIN_REQUIRE(out, "ConfiguredRun::copy_parameters", "null output");
    host_memory("ConfiguredRun::copy_parameters", "out", out);
    run_->copy_parameters(out, dtype_of_v<P>);
  }

  /// Collective. Saves checkpoint step() (the description, the model, the optimizer).
  /// InvalidArgument when the description names no checkpoint directory.
  void save() { run_->save(); }
  /// Collective. Saves when step() is due by the configured interval; whether it saved.
  bool maybe_save() { return run_->maybe_save(); }
  /// Collective. Restores the newest valid checkpoint and returns its step (nothing restored:
  /// std::nullopt). A checkpoint of another description is refused (InvalidArgument).
  std::optional<std::int64_t> restore_latest() { return run_->restore_latest(); }
  /// Collective, blocking (bounded): waits for checkpoint writes and flushes, rethrowing their
  /// errors. Nothing without checkpoints.
  void wait_checkpoints() { run_->wait_checkpoints(); }

  /// Local. Registers the caller's array `data` of `count` elements under `name`: every later
  /// save holds this rank's values (a per-rank dataset "arrays/<name>"), and restore_latest
  /// loads them back into the same memory, which must stay valid for the run's lifetime. For a
  /// solver's own state (fields, counters), so that one checkpoint holds solver and model.
  /// Register before restore_latest, with the same names and counts as the run that saved (a
  /// checkpoint without them is refused, naming the array). Names: 1-64 letters, digits, '_',
  /// '-', '.'; each once. float, double or int32 host memory.
  template <class V>
  void checkpoint_array(const std::string& name, V* data, std::int64_t count) {
    static_assert(
        std::is_same_v<V, float> || std::is_same_v<V, double> || std::is_same_v<V, std::int32_t>,
        "float, double or std::int32_t");
    host_memory("ConfiguredRun::checkpoint_array", "the array", data);
    run_->checkpoint_array(name, data, dtype_of_v<V>, count);
  }

  /// Local. Opens this rank's store of (input, target) pairs (f32 copies). Once per run, before
  /// restore_latest when the checkpoints hold a store: from then on checkpoints also hold each
  /// rank's samples, its sampler's position and the running statistics.
  void open_store(const StoreOptions& options) { run_->open_store(options); }
  /// Local. Copies `n` pairs into the store (the statistics see every input fed).
  template <class X, class Y>
  void store_add(const X* x, const Y* targets, std::int64_t n) {
    static_assert(!std::is_same_v<Y, std::int32_t>, "the store holds value targets");
    check_types<X, Y>("ConfiguredRun::store_add", x, targets, n);
    host_memory("ConfiguredRun::store_add", "x", x);
    host_memory("ConfiguredRun::store_add", "the targets", targets);
    run_->store_add(x, dtype_of_v<X>, targets, dtype_of_v<Y>, n);
  }
  /// Local. Pairs stored on this rank, and pairs ever fed to it.
  std::int64_t store_size() const { return run_->store_size(); }
  std::int64_t store_fed() const { return run_->store_fed(); }
  /// Collective. One optimizer step on `batch` pairs drawn from this rank's store (a shuffled
  /// pass over its slots, a new permutation each pass); returns this rank's mean loss.
  double train_step_from_store(std::int64_t batch) { return run_->train_from_store(batch); }

 private:
  template <class Exec>
  void build(Exec* exec) {
    const bool adamw = config_.optimizer.kind == OptimizerKind::adamw;
    DTRAIN_REQUIRE(config_.dtype == DType::f32 || config_.dtype == DType::f64, "ConfiguredRun",
                   config_.source << ": dtype " << name_of(config_.dtype)
                                  << " (a model trains in f32 or f64)");
    using detail::ConfiguredRunOf;
    if (config_.dtype == DType::f32) {
      if (adamw)
        run_ =
            std::make_unique<ConfiguredRunOf<float, Exec, BasicAdamW<Exec>>>(*comm_, config_, exec);
      else
        run_ =
            std::make_unique<ConfiguredRunOf<float, Exec, BasicSgd<Exec>>>(*comm_, config_, exec);
    } else {
      if (adamw)
        run_ = std::make_unique<ConfiguredRunOf<double, Exec, BasicAdamW<Exec>>>(*comm_, config_,
                                                                                 exec);
      else
        run_ =
            std::make_unique<ConfiguredRunOf<double, Exec, BasicSgd<Exec>>>(*comm_, config_, exec);
    }
  }
  // Host entry points refuse memory the run's policy knows as its own; device entry points need
  // a device run and refuse memory the policy knows is not its own.
  void host_memory(const char* op, const char* name, const void* p) const {
    DTRAIN_REQUIRE(run_->holds(p) != 1, op,
                   name << " is device memory: host arrays only here (device arrays go to the "
                           "_device form of the call)");
  }
  void device_memory(const char* op, const char* name, const void* p) const {
    DTRAIN_REQUIRE(run_->on_device(), op,
                   "the run is on the host: device arrays need a run built on a device policy");
    DTRAIN_REQUIRE(run_->holds(p) != 0, op,
                   name << " is not the device's memory (host arrays go to the call without "
                           "_device)");
  }
  static std::int64_t elements(const Shape& s) {
    std::int64_t n = 1;
    for (auto d : s) n *= d;
    return n;
  }
  template <class X, class Y>
  static void check_types(const char* op, const void* x, const void* y, std::int64_t batch) {
    static_assert(std::is_same_v<X, float> || std::is_same_v<X, double>,
                  "inputs are float or double");
    static_assert(
        std::is_same_v<Y, float> || std::is_same_v<Y, double> || std::is_same_v<Y, std::int32_t>,
        "targets are float, double or int32 class labels");
    DTRAIN_REQUIRE(batch >= 1, op, "batch " << batch << " (at least 1)");
    DTRAIN_REQUIRE(x && y, op, (x ? "the targets are null" : "the inputs are null"));
  }

  RunConfig config_;
  std::unique_ptr<MpiTransport> transport_;
  std::unique_ptr<Communicator<MpiTransport>> comm_;
  std::unique_ptr<detail::ConfiguredRunBase> run_;
};

}  // namespace dtrain
