// Example 10: data-parallel training of an MLP on Fashion-MNIST, one process per MPI rank.
//
// The whole dtrain loop: every rank reads only its shard of an HDF5 file (parallel HDF5), runs
// forward and backward, averages gradients in buckets that start while backward is still running,
// applies the same AdamW step, and saves verified HDF5 checkpoints from which a restarted run
// continues exactly (on the same or another number of ranks). Rank 0 draws a progress line and
// the test accuracy after every epoch. --run-dir DIR holds the checkpoints, metrics.csv, every
// rank's timing file and a lock; scripts/plot-metrics draws DIR/metrics.png. Bad data, ranks with
// different options and restarts that change the model or schedule stop with a message naming
// the problem. Self-check: exits non-zero unless the test accuracy reaches --target (default 0.80)
// and the replicas' parameters are bit-identical on every rank at the end.
//
//   mpiexec.mpich -n 2 train_fashion_mnist --data fashion_mnist.h5 [--epochs 2] [--batch 64]
//       [--run-dir DIR] [--ckpt-every 200] [--device auto|cpu|cuda|hip] ...  (--help: all options)
// --device cuda|hip needs the GPU build of this file (train_fashion_mnist_cuda / _hip): the model,
// gradients and optimizer state then live on the rank's GPU.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/core/version.hpp>
#include <dtrain/data/distributed_sampler.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/model/model.hpp>
#include <dtrain/optim/optim.hpp>
#include <dtrain/train/train.hpp>
#include <dtrain/transports/mpi.hpp>

#include "common/classification_data.hpp"
#include "common/exec_policy.hpp"
#include "common/mpi_main.hpp"
#include "common/train_run.hpp"

namespace {

constexpr std::int64_t kClasses = 10;
const std::string kProgram = "train_fashion_mnist";

struct Config : dtrain_cli::TrainOptions {  // --epochs --batch --lr --run-dir --step ...
  std::string data = "fashion_mnist.h5";
};

// Collective: every rank parses; returns -1 to continue, otherwise the exit code of every rank.
int parse(int argc, char** argv, Config& c) {
  CLI::App app(
      "Example 10: data-parallel training of an MLP 784-H-H-10 on Fashion-MNIST (HDF5 from example "
      "01), one process per MPI rank. Run under mpiexec; every rank needs the same options.",
      kProgram);
  app.add_option("--data", c.data, "HDF5 file written by convert_idx_to_hdf5")
      ->type_name("FILE")
      ->capture_default_str();
  dtrain_cli::add_train_options(app, c);
  return dtrain_cli::parse_train_options(app, argc, argv, c, kProgram.c_str());
}

// The node-shared segments: as the environment says, and on the CPU a node-shared heap for the
// model (unless DTRAIN_SHM_HEAP_MIB sets one): parameters, gradients, AdamW's moments, the
// activations of a batch, and room for the all-reduce calibration's buffers.
dtrain::SharedSegmentConfig shared_segments(const Config& cfg, bool host) {
  dtrain::SharedSegmentConfig seg = dtrain::SharedSegmentConfig::from_env();
  if (host && seg.heap_bytes == 0) {
    const std::size_t h = static_cast<std::size_t>(cfg.hidden), c = kClasses,
                      b = static_cast<std::size_t>(cfg.batch);
    const std::size_t params = 784 * h + h + h * h + h + h * c + c;
    seg.heap_bytes = 4 * (4 * params + 4 * b * (784 + 2 * h + c)) + (24u << 20);
  }
  return seg;
}

template <class Exec>
int run(const Config& cfg, Exec& given_exec, const dtrain_cli::DeviceChoice& device) {
  constexpr bool host = std::is_constructible_v<Exec, dtrain::Allocator&>;
  dtrain::MpiTransport transport(MPI_COMM_WORLD, shared_segments(cfg, host));
  // The run directory keeps the all-reduce calibration (unless DTRAIN_TUNING_FILE names one): a
  // resumed run then picks the same algorithm per message size and goes on bit for bit.
  dtrain::CommConfig comm_config = dtrain::CommConfig::from_env();
  if (comm_config.tuning_file.empty() && !cfg.run_dir.empty())
    comm_config.tuning_file = cfg.run_dir + "/allreduce_tuning.txt";
  dtrain::Communicator comm(transport, comm_config);
  // On the CPU the model lives in the node-shared heap, so the shm all-reduce reads its gradient
  // buckets in place.
  std::unique_ptr<Exec> heap_exec;
  if constexpr (host) heap_exec = std::make_unique<Exec>(comm.shared_allocator());
  Exec& exec = heap_exec ? *heap_exec : given_exec;
  const int rank = comm.rank(), world = comm.size();
  dtrain::detail::RankScope scope(rank);
  const dtrain::Timer wall;
  const auto lock = dtrain::lock_run_directory(comm, cfg.run_dir);  // one job per run directory

  // 1. Shard: each rank reads only the rows its sampler hands it, on the loader's background
  //    thread, through parallel HDF5. Every rank checks its share of the data first. Bytes hold
  //    Fashion-MNIST's grey levels (statistics quoted in [0, 1]); other types are normalised by
  //    the training set's own mean and standard deviation.
  auto data = dtrain_cli::open_classification_data(
      comm, cfg.data, kClasses, kProgram, dtrain::Normalize::from_unit_range(0.2860f, 0.3530f));
  dtrain::Hdf5Dataset &train = *data.train, &test = *data.test;
  const dtrain::Normalize norm = data.norm;
  dtrain::DistributedSampler sampler(train.size(), comm, cfg.seed);
  dtrain::LoaderOptions lopt;
  lopt.prefetch_depth = 2;
  lopt.transform = norm;
  lopt.flatten = true;
  const std::size_t batch_size = static_cast<std::size_t>(cfg.batch);
  dtrain::Loader loader(train, sampler, batch_size, lopt);

  // 2. Model: identical initialisation on every rank from the seed, no communication.
  const std::int64_t in = static_cast<std::int64_t>(dtrain::element_count(train.sample_shape()));
  dtrain::BasicSequential<float, Exec> model(
      {dtrain::Linear(in, cfg.hidden), dtrain::Relu(), dtrain::Linear(cfg.hidden, cfg.hidden),
       dtrain::Relu(), dtrain::Linear(cfg.hidden, kClasses)},
      exec);
  model.init(cfg.seed);

  // 5. Save: verified HDF5 checkpoints. The newest one's run record is read first, so that the
  //    optimizer is built with the schedule it continues.
  const auto steps_per_epoch = static_cast<std::int64_t>(sampler.num_batches(batch_size));
  dtrain_cli::RunPlan plan = dtrain_cli::plan_run(cfg, steps_per_epoch, world);
  std::unique_ptr<dtrain::Checkpointer<decltype(comm)>> ckpt;
  if (!cfg.run_dir.empty()) {
    const std::string h = std::to_string(cfg.hidden);
    ckpt = std::make_unique<dtrain::Checkpointer<decltype(comm)>>(
        comm, cfg.run_dir,
        dtrain_cli::checkpoint_options(cfg, "model=mlp-784-" + h + "-" + h +
                                                "-10 batch=" + std::to_string(cfg.batch) +
                                                " lr=" + std::to_string(cfg.lr)));
    const auto& levels = ckpt->options().levels;  // --ckpt-local-dir, or DTRAIN_CKPT_*
    if (rank == 0 && levels.enabled()) {
      const int m = levels.shared_every;
      const std::string flushed = m == 0   ? "none"
                                  : m == 1 ? "every one"
                                           : "every " + std::to_string(m) + "th";
      std::printf(
          "checkpoints of run %s: node-local in %s on %d node%s (%s), %s flushed to %s\n",
          ckpt->run_id().c_str(), levels.local_dir.c_str(), ckpt->nodes(),
          ckpt->nodes() == 1 ? "" : "s",
          levels.partner && ckpt->nodes() > 1 ? "copied to the next node" : "no partner copies",
          flushed.c_str(), cfg.run_dir.c_str());
    }
    dtrain_cli::read_saved_run(*ckpt, plan, cfg, kProgram);
  }
  dtrain::BasicAdamW<Exec> opt(model, plan.record.make_schedule());
  // 3. Reconcile: gradient buckets all-reduce while backward is still running. Sharded steps need
  //    host gradients or device gradients handed over (an agreed error where they are staged);
  //    the optimizer state is sharded at once.
  dtrain::BasicGradientSync<Exec> sync(exec, comm, model.gradients(),
                                       static_cast<std::size_t>(cfg.bucket_kib) * 1024);
  if (cfg.step_mode == "sharded")
    dtrain::agreed(comm, [&] { sync.shard_updates(model.parameters(), opt); });
  std::int64_t step = 0;
  // The checkpoint whose run record was checked (sharded moments: its parts), at whichever level
  // holds it (node-local, a partner copy or --run-dir).
  if (plan.resumed) {
    const auto again =
        ckpt->restore_latest(dtrain::named("model", model), dtrain::named("optimizer", opt),
                             dtrain::named("sampler", sampler), dtrain::named("run", plan.saved));
    if (again != plan.resumed)  // the same answer on every rank
      throw dtrain::AgreedError(std::string(kProgram) +
                                ": the newest checkpoint changed from step " +
                                std::to_string(*plan.resumed) + " while restoring it");
    step = *again;
  }
  dtrain_cli::continue_run(plan, cfg, sampler, batch_size, steps_per_epoch, step, world);
  opt.set_schedule(plan.record.make_schedule());
  const std::int64_t first_step = step, total_steps = plan.total_steps;

  // Rank 0's progress line and metrics.csv, every rank's timing file (in the run directory).
  dtrain::TrainingLog<decltype(comm)> log(comm, cfg.run_dir, plan.resumed ? step : -1, cfg.epochs,
                                          total_steps);
  if (rank == 0) {
    std::printf(
        "dtrain %s: %d ranks, %zu parameters, batch %lld per rank (%lld global), %lld "
        "steps/epoch, %lld steps, on %s\n",
        dtrain::version_string(), world, model.parameter_count(), static_cast<long long>(cfg.batch),
        static_cast<long long>(cfg.batch * world), static_cast<long long>(steps_per_epoch),
        static_cast<long long>(total_steps), device.describe().c_str());
    dtrain_cli::print_resume(plan, cfg, sampler, step);
    std::fflush(stdout);
  }

  // The training loop: every rank runs the same steps.
  dtrain::Batch batch;
  dtrain::StepMeter meter;
  double test_acc = NAN, train_acc = NAN;
  std::int64_t epochs_done = 0;
  const dtrain::Timer train_time;
  bool done = step >= total_steps;
  for (std::int64_t epoch = sampler.epoch(); !done && epoch < cfg.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    bool epoch_ended = false;
    while (!(done = step >= total_steps ||
                    (cfg.stop_after > 0 && step - first_step >= cfg.stop_after))) {
      meter.start_step();
      if (!loader.next(batch)) {
        epoch_ended = true;
        break;
      }
      meter.data_done();
      model.zero_grad();
      dtrain::PassOptions pass;
      pass.step = step;
      pass.sample_ids = batch.indices.data();
      const double loss =
          model.forward_backward(batch, sync, dtrain::Loss::softmax_cross_entropy, pass);
      meter.compute_done();
      if (cfg.step_mode == "separate") {
        sync.wait();
        meter.sync_done();
        opt.step();
        meter.optimizer_done();
      } else {
        sync.wait(opt);  // the buckets' updates run inside the wait
        meter.sync_done();
      }
      meter.step_done(batch.size, loss);
      ++step;
      if (ckpt)  // every --ckpt-every steps
        ckpt->maybe_save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
                         dtrain::named("sampler", sampler), dtrain::named("run", plan.record));
      if (step % cfg.log_every == 0 || step == total_steps)  // the same steps on every rank
        log.interval(step, epoch, meter, opt.current_lr());
    }
    if (epoch_ended || (done && sampler.remaining_batches(batch_size) == 0)) {
      // End of an epoch: distributed accuracy on the test set and on up to 10000 training rows.
      test_acc = dtrain::evaluate_accuracy(comm, model, test, norm, test.size());
      train_acc = dtrain::evaluate_accuracy(comm, model, train, norm, 10000);
      ++epochs_done;
      char b[200];
      std::snprintf(b, sizeof b,
                    "epoch %lld/%d done at step %lld: test accuracy %.4f, train accuracy %.4f "
                    "(first 10000 rows), mean loss %.4f",
                    static_cast<long long>(epoch + 1), cfg.epochs, static_cast<long long>(step),
                    test_acc, train_acc, meter.epoch_mean_loss());
      log.message(b);
      log.evaluation(step, epoch, opt.current_lr(), train_acc, test_acc);
      meter.start_epoch();
    }
  }
  const double train_s = train_time.seconds();
  // The last step, unless maybe_save has just written it (--ckpt-every dividing the step).
  if (ckpt && step > first_step && ckpt->last_step() != step)
    ckpt->save(step, dtrain::named("model", model), dtrain::named("optimizer", opt),
               dtrain::named("sampler", sampler), dtrain::named("run", plan.record));

  if (std::isnan(test_acc))
    test_acc = dtrain::evaluate_accuracy(comm, model, test, norm, test.size());
  const bool same = dtrain::replicas_identical(comm, model);
  // The gradient sync has fixed the choice by now: nothing is measured here.
  const std::string choice = step > first_step ? dtrain_cli::allreduce_choice(comm) : "";
  const double samples = static_cast<double>(meter.total_samples());  // this rank's
  const double samples_per_s = train_s > 0 ? samples * world / train_s : 0.0;
  if (rank == 0) {
    log.end_line();
    if (step > first_step) {
      std::printf(
          "trained %lld steps in %.1f s: %.0f samples/s over %d ranks (%.1f "
          "us/sample/rank)\n",
          static_cast<long long>(step - first_step), train_s, samples_per_s, world,
          samples > 0 ? train_s / samples * 1e6 : 0.0);
      dtrain_cli::print_time_split(meter.total_times(), cfg.step_mode);
      const auto* heap = dynamic_cast<const dtrain::SharedHeapAllocator*>(&comm.shared_allocator());
      std::printf("all-reduce per message size (bytes:algorithm): %s; gradients %s\n",
                  choice.c_str(),
                  heap && heap->owns(model.gradients().data)
                      ? "in the node-shared heap (the node's ranks read them in place)"
                      : "in private memory");
    }
    dtrain_cli::print_run_end(plan, cfg, first_step, step);
    std::printf("test accuracy %.4f (target %.2f), replicas %s, wall %.1f s\n", test_acc,
                cfg.target, same ? "bit-identical" : "DIFFER", wall.seconds());
    dtrain_cli::print_run_directory(cfg);
    if (!cfg.json_summary.empty()) {
      dtrain::JsonSummary js;
      js.add("test_accuracy", test_acc)
          .add("train_accuracy", train_acc)
          .add("train_loss", log.last_loss())
          .add("epochs", sampler.epoch() + (sampler.remaining_batches(batch_size) == 0))
          .add("epochs_this_run", epochs_done)
          .add("steps", step)
          .add("total_steps", total_steps)
          .add("samples_per_s", samples_per_s)
          .add("wall_s", wall.seconds())
          .add("world_size", world)
          .add("batch_per_rank", cfg.batch)
          .add("schedule", plan.record.schedule)
          .add("allreduce_choice", choice)
          .add("step_mode", cfg.step_mode)
          .add("replicas_identical", same)
          .add("target", cfg.target)
          .add("complete", step >= total_steps)
          .add("passed", same && test_acc >= cfg.target);
      if (plan.resumed)
        js.add("resumed_from_step", first_step);
      else
        js.add_raw("resumed_from_step", "null");
      js.write(cfg.json_summary);
    }
    std::fflush(stdout);
  }
  return same && test_acc >= cfg.target ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return dtrain_cli::mpi_main(argc, argv, [](int argc, char** argv) {
    Config cfg;
    if (const int code = parse(argc, argv, cfg); code >= 0) return code;
    return dtrain_cli::with_exec_policy(cfg.device, kProgram, [&](auto& exec, const auto& device) {
      return run(cfg, exec, device);
    });
  });
}
