// Example 10: data-parallel training of an MLP on Fashion-MNIST, one process per MPI rank.
//
// The whole dtrain loop: every rank reads only its shard of an HDF5 file (parallel HDF5), runs
// forward and backward on the CPU, averages gradients in buckets that start while backward is
// still running, applies the same AdamW step, and saves verified HDF5 checkpoints from which a
// restarted run continues exactly. Rank 0 prints one progress line per interval.
//
// Self-check: exits non-zero unless the test accuracy after training reaches --target (default
// 0.80) and the replicas' parameters are bit-identical on every rank at the end.
//
//   mpiexec.mpich -n 2 train_fashion_mnist --data fashion_mnist.h5 [--epochs 2] [--batch 64]
//       [--hidden 256] [--lr 2e-3] [--run-dir DIR] [--ckpt-every 200] [--max-steps N]
//       [--target 0.80] [--seed 1] [--bucket-kib 256]
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/log.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/hdf5.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/transports/mpi.hpp>

namespace {

struct Config {
  std::string data = "fashion_mnist.h5";
  std::string run_dir;
  int epochs = 2;
  std::size_t batch = 64;
  std::int64_t hidden = 256;
  double lr = 2e-3;
  std::int64_t ckpt_every = 0;
  std::int64_t max_steps = -1;
  double target = 0.80;
  std::uint64_t seed = 1;
  std::size_t bucket_kib = 256;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "train_fashion_mnist: %s\n", msg);
  std::exit(2);
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--data")
      c.data = value();
    else if (a == "--run-dir")
      c.run_dir = value();
    else if (a == "--epochs")
      c.epochs = std::atoi(value().c_str());
    else if (a == "--batch")
      c.batch = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--hidden")
      c.hidden = std::atoll(value().c_str());
    else if (a == "--lr")
      c.lr = std::atof(value().c_str());
    else if (a == "--ckpt-every")
      c.ckpt_every = std::atoll(value().c_str());
    else if (a == "--max-steps")
      c.max_steps = std::atoll(value().c_str());
    else if (a == "--target")
      c.target = std::atof(value().c_str());
    else if (a == "--seed")
      c.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--bucket-kib")
      c.bucket_kib = std::strtoull(value().c_str(), nullptr, 10);
    else
      usage(("unknown option " + a).c_str());
  }
  if (c.epochs < 1 || c.batch < 1 || c.hidden < 1 || c.bucket_kib < 1) usage("bad option value");
  return c;
}

// Fraction of the test set classified correctly: each rank evaluates its contiguous share of the
// rows, the counts are summed over ranks.
template <class Comm, class Model>
double evaluate(Comm& comm, Model& model, dtrain::Hdf5Dataset& test,
                const dtrain::Normalize& norm) {
  const std::size_t n = test.size();
  const std::size_t p = static_cast<std::size_t>(comm.size()),
                    r = static_cast<std::size_t>(comm.rank());
  const std::size_t begin = n * r / p, end = n * (r + 1) / p;
  const std::size_t chunk = 1000;
  const std::size_t features = dtrain::element_count(test.sample_shape());
  std::vector<std::int64_t> idx;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::int64_t counts[2] = {0, static_cast<std::int64_t>(end - begin)};
  for (std::size_t s = begin; s < end; s += chunk) {
    const std::size_t b = std::min(chunk, end - s);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::int64_t>(s + i);
    x.resize(b * features);
    y.resize(b);
    test.read(dtrain::span<const std::int64_t>(idx.data(), b),
              dtrain::span<float>(x.data(), x.size()), dtrain::span<std::int32_t>(y.data(), b),
              norm);
    counts[0] += model.count_correct(x.data(), y.data(), static_cast<std::int64_t>(b));
  }
  comm.allreduce(dtrain::BufferView(counts, 2, dtrain::DType::i64), dtrain::ReduceOp::sum);
  return counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
}

// Every rank's parameters must be bit-identical: compare each with rank 0's by max/min of a hash.
template <class Comm, class Model>
bool replicas_identical(Comm& comm, Model& model) {
  auto params = model.parameters().template as<float>();
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the parameter bytes
  const auto* bytes = reinterpret_cast<const unsigned char*>(params.data());
  for (std::size_t i = 0; i < params.size() * sizeof(float); ++i)
    h = (h ^ bytes[i]) * 1099511628211ull;
  std::int64_t lo = static_cast<std::int64_t>(h >> 1), hi = lo;
  comm.allreduce(dtrain::BufferView(&lo, 1, dtrain::DType::i64), dtrain::ReduceOp::min);
  comm.allreduce(dtrain::BufferView(&hi, 1, dtrain::DType::i64), dtrain::ReduceOp::max);
  return lo == hi;
}

int run(const Config& cfg) {
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  dtrain::Communicator comm(transport);
  const int rank = comm.rank(), world = comm.size();
  dtrain::detail::RankScope scope(rank);
  const dtrain::Timer wall;

  // 1. Shard: each rank reads only the rows its sampler hands it, on the loader's background
  //    thread (double buffering), through parallel HDF5 (MPI-IO at MPI_THREAD_MULTIPLE).
  dtrain::Hdf5Dataset train(cfg.data, "train/images", "train/labels", comm.transport().mpi_comm());
  dtrain::Hdf5Dataset test(cfg.data, "test/images", "test/labels", comm.transport().mpi_comm());
  const auto norm = dtrain::Normalize::from_unit_range(0.2860f, 0.3530f);
  dtrain::DistributedSampler sampler(train.size(), comm, cfg.seed);
  dtrain::LoaderOptions lopt;
  lopt.prefetch_depth = 2;
  lopt.transform = norm;
  lopt.flatten = true;
  dtrain::Loader loader(train, sampler, cfg.batch, lopt);
  const std::int64_t in = static_cast<std::int64_t>(dtrain::element_count(train.sample_shape()));

  // 2. Model: identical initialisation on every rank from the seed, no communication.
  dtrain::Sequential model{dtrain::Linear(in, cfg.hidden), dtrain::Relu(),
                           dtrain::Linear(cfg.hidden, cfg.hidden), dtrain::Relu(),
                           dtrain::Linear(cfg.hidden, 10)};
  model.init(cfg.seed);
  const std::int64_t steps_per_epoch = static_cast<std::int64_t>(sampler.num_batches(cfg.batch));
  std::int64_t total_steps = steps_per_epoch * cfg.epochs;
  if (cfg.max_steps >= 0 && cfg.max_steps < total_steps) total_steps = cfg.max_steps;
  dtrain::AdamW opt(model, dtrain::Schedule::warmup_cosine(
                               cfg.lr, std::min<std::int64_t>(100, total_steps / 10 + 1),
                               total_steps, cfg.lr * 0.05));

  // 3. Reconcile: gradient buckets all-reduce while backward is still running.
  dtrain::GradientSync sync(comm, model.gradients(), cfg.bucket_kib * 1024);

  // 5. Save: verified HDF5 checkpoints; a restarted run continues from the newest valid one.
  std::unique_ptr<dtrain::Checkpointer<decltype(comm)>> ckpt;
  std::int64_t step = 0;
  if (!cfg.run_dir.empty()) {
    dtrain::CheckpointOptions copt;
    copt.every_steps = cfg.ckpt_every;
    copt.keep_last = 2;
    copt.config = "model=mlp-784-" + std::to_string(cfg.hidden) + "-" + std::to_string(cfg.hidden) +
                  "-10 batch=" + std::to_string(cfg.batch) + " lr=" + std::to_string(cfg.lr);
    ckpt = std::make_unique<dtrain::Checkpointer<decltype(comm)>>(comm, cfg.run_dir, copt);
    if (auto restored =
            ckpt->restore_latest(dtrain::named("model", model), dtrain::named("optimizer", opt),
                                 dtrain::named("sampler", sampler))) {
      step = *restored;
      if (rank == 0)
        std::printf("restored step %lld (epoch %lld, position %llu) from %s\n",
                    static_cast<long long>(step), static_cast<long long>(sampler.epoch()),
                    static_cast<unsigned long long>(sampler.position()), cfg.run_dir.c_str());
    }
  }

  if (rank == 0)
    std::printf(
        "dtrain %s: %d ranks, %zu parameters, batch %zu per rank (%zu global), %lld steps/epoch, "
        "%lld steps\n",
        dtrain::version_string(), world, model.parameter_count(), cfg.batch, cfg.batch * world,
        static_cast<long long>(steps_per_epoch), static_cast<long long>(total_steps));

  dtrain::Batch batch;
  double t_data = 0, t_compute = 0, t_sync = 0, t_opt = 0, loss_sum = 0;
  std::int64_t loss_n = 0, samples = 0;
  const dtrain::Timer train_time;
  dtrain::Timer interval;
  bool done = step >= total_steps;
  for (std::int64_t epoch = sampler.epoch(); !done && epoch < cfg.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    for (;;) {
      if (step >= total_steps) {
        done = true;
        break;
      }
      dtrain::Timer t;
      if (!loader.next(batch)) break;
      t_data += t.seconds();
      t.reset();
      model.zero_grad();
      dtrain::PassOptions pass;
      pass.step = step;
      pass.sample_ids = batch.indices.data();
      const double loss = model.forward_backward(
          batch.features.as<float>().data(), batch.labels.as<std::int32_t>().data(),
          static_cast<std::int64_t>(batch.size), dtrain::Loss::softmax_cross_entropy,
          [&](std::size_t offset, std::size_t count) { sync.ready(offset, count); }, pass);
      t_compute += t.seconds();
      t.reset();
      sync.wait();
      t_sync += t.seconds();
      t.reset();
      opt.step();
      t_opt += t.seconds();
      ++step;
      samples += static_cast<std::int64_t>(batch.size);
      loss_sum += loss;
      ++loss_n;
      if (ckpt)
        ckpt->maybe_save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
                         dtrain::named("sampler", sampler));
      if (rank == 0 && (interval.seconds() >= 2.0 || step == total_steps)) {
        std::printf("epoch %lld step %6lld/%lld  loss %.4f  lr %.2e  %.0f samples/s (all ranks)\n",
                    static_cast<long long>(epoch), static_cast<long long>(step),
                    static_cast<long long>(total_steps), loss_sum / static_cast<double>(loss_n),
                    opt.current_lr(), static_cast<double>(samples * world) / train_time.seconds());
        std::fflush(stdout);
        loss_sum = 0;
        loss_n = 0;
        interval.reset();
      }
    }
  }
  const double train_s = train_time.seconds();
  if (ckpt)
    ckpt->save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
               dtrain::named("sampler", sampler));

  const double acc = evaluate(comm, model, test, norm);
  const bool same = replicas_identical(comm, model);
  if (rank == 0) {
    const double per = samples ? train_s / static_cast<double>(samples) * 1e6 : 0;
    std::printf(
        "trained %lld steps in %.1f s: %.0f samples/s over %d ranks (%.1f us/sample/rank)\n",
        static_cast<long long>(step), train_s,
        train_s > 0 ? static_cast<double>(samples * world) / train_s : 0.0, world, per);
    const double tot = t_data + t_compute + t_sync + t_opt;
    if (tot > 0)
      std::printf(
          "rank 0 time split: data %.0f%%, forward+backward %.0f%%, gradient sync wait %.0f%%, "
          "optimizer %.0f%%\n",
          100 * t_data / tot, 100 * t_compute / tot, 100 * t_sync / tot, 100 * t_opt / tot);
    std::printf("test accuracy %.4f (target %.2f), replicas %s, wall %.1f s\n", acc, cfg.target,
                same ? "bit-identical" : "DIFFER", wall.seconds());
  }
  if (!same) return 1;
  return acc >= cfg.target ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const Config cfg = parse(argc, argv);
  int code = 0;
  try {
    code = run(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
