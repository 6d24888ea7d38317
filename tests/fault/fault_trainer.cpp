// Fault-injection trainer: a small data-parallel loop over the real pieces that matter when a
// rank fails (an MPI transport and Communicator, an Hdf5Dataset on the MPI-IO driver, whose file
// close is collective, and a Checkpointer), with one fault injected on one rank at one step.
//
//   fault_trainer --make-data FILE                      write the small dataset (one process)
//   fault_trainer --data FILE --run-dir DIR [--steps N] [--every K] [--policy abort|propagate]
//                 [--fault none|kill|stop|throw|mismatch|diskfull] [--fault-rank R]
//                 [--fault-step S]                      train (under mpiexec)
//   fault_trainer --verify DIR                          check the newest checkpoint (one process)
//
// The parameters follow a closed form: every step each rank adds (step + 1) * (i + 1) to
// parameter i through an all-reduce, so after `s` steps on `w` ranks parameter i holds
// (i + 1) * w * s (s + 1) / 2 exactly (small integers in doubles). --verify restores the newest
// checkpoint on one rank and checks that, the step and the world size stored with it; it prints
// "verify: step S ok" and exits 0, or names what is wrong and exits 1.
#include <hdf5.h>
#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/failure.hpp>
#include <dtrain/data/hdf5.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/mpi_abort.hpp>

namespace {

constexpr int kParams = 64;
constexpr std::int64_t kSamples = 64;
constexpr std::int64_t kFeatures = 8;

struct State {
  std::vector<double> params = std::vector<double>(kParams, 0.0);
  std::int64_t step = 0;
  std::int64_t world = 0;
  template <class V>
  void visit_state(V& v) {
    v.tensor("params", dtrain::BufferView(params.data(), params.size(), dtrain::DType::f64),
             dtrain::Shape{kParams});
    v.scalar("step", step);
    v.scalar("world", world);
  }
};

struct Args {
  std::string make_data, data, run_dir, verify, fault = "none", policy = "abort";
  std::int64_t steps = 12, every = 2, fault_step = 5;
  int fault_rank = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "fault_trainer: %s\n", why.c_str());
  std::exit(2);
}

std::int64_t to_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v < 0) usage(std::string(flag) + " needs a non-negative integer");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--make-data")
      a.make_data = val();
    else if (f == "--data")
      a.data = val();
    else if (f == "--run-dir")
      a.run_dir = val();
    else if (f == "--verify")
      a.verify = val();
    else if (f == "--fault")
      a.fault = val();
    else if (f == "--policy")
      a.policy = val();
    else if (f == "--steps")
      a.steps = to_int(val(), "--steps");
    else if (f == "--every")
      a.every = to_int(val(), "--every");
    else if (f == "--fault-step")
      a.fault_step = to_int(val(), "--fault-step");
    else if (f == "--fault-rank")
      a.fault_rank = static_cast<int>(to_int(val(), "--fault-rank"));
    else
      usage("unknown option " + f);
  }
  const std::string faults[] = {"none", "kill", "stop", "throw", "mismatch", "diskfull"};
  bool known = false;
  for (const auto& k : faults) known = known || a.fault == k;
  if (!known) usage("unknown --fault " + a.fault);
  if (a.policy != "abort" && a.policy != "propagate") usage("--policy is abort or propagate");
  return a;
}

int make_data(const std::string& path) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return 1;
  std::vector<float> x(static_cast<std::size_t>(kSamples * kFeatures));
  std::vector<std::int32_t> y(static_cast<std::size_t>(kSamples));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) / 17.0f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 10);
  hsize_t xd[2] = {static_cast<hsize_t>(kSamples), static_cast<hsize_t>(kFeatures)};
  hsize_t yd[1] = {static_cast<hsize_t>(kSamples)};
  hid_t xs = H5Screate_simple(2, xd, nullptr), ys = H5Screate_simple(1, yd, nullptr);
  hid_t dx = H5Dcreate2(f, "x", H5T_IEEE_F32LE, xs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  hid_t dy = H5Dcreate2(f, "y", H5T_STD_I32LE, ys, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = H5Dwrite(dx, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()) >= 0 &&
                  H5Dwrite(dy, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data()) >= 0;
  H5Dclose(dx), H5Dclose(dy), H5Sclose(xs), H5Sclose(ys);
  return H5Fclose(f) >= 0 && ok ? 0 : 1;
}

/// One rank of a world of size 1, for --verify.
struct SelfComm {
  int rank() const { return 0; }
  int size() const { return 1; }
  void barrier() {}
  void broadcast(dtrain::BufferView, int) {}
  void allreduce(dtrain::BufferView, dtrain::ReduceOp) {}
};

int verify(const std::string& dir) {
  SelfComm comm;
  dtrain::Checkpointer<SelfComm> ckpt(comm, dir, dtrain::CheckpointOptions{});
  const auto files = ckpt.files();
  if (files.empty()) {
    std::printf("verify: no checkpoint in %s\n", dir.c_str());
    return 1;
  }
  State s;
  const std::int64_t newest = files.front().step;
  const auto step = ckpt.restore_latest(dtrain::named("state", s));
  if (!step || *step != newest) {
    std::printf("verify: newest checkpoint (step %lld) is not the one restored\n",
                static_cast<long long>(newest));
    return 1;
  }
  if (s.step != *step || s.world < 1) {
    std::printf("verify: stored step %lld / world %lld do not match the file\n",
                static_cast<long long>(s.step), static_cast<long long>(s.world));
    return 1;
  }
  for (int i = 0; i < kParams; ++i) {
    const double want = static_cast<double>(i + 1) * static_cast<double>(s.world) *
                        static_cast<double>(s.step * (s.step + 1) / 2);
    if (s.params[static_cast<std::size_t>(i)] != want) {
      std::printf("verify: parameter %d is %.17g, expected %.17g\n", i,
                  s.params[static_cast<std::size_t>(i)], want);
      return 1;
    }
  }
  std::printf("verify: step %lld ok (%zu checkpoint files)\n", static_cast<long long>(*step),
              files.size());
  return 0;
}

int train(const Args& a) {
  dtrain::MpiTransport transport(MPI_COMM_WORLD);
  dtrain::Communicator comm(transport);
  const int rank = comm.rank(), p = comm.size();
  if (rank == a.fault_rank && a.fault != "none") {
    // The process manager reports processes by pid; this line maps the pid to the rank.
    std::fprintf(stderr, "fault_trainer: rank %d is pid %ld\n", rank, static_cast<long>(getpid()));
    std::fflush(stderr);
  }
  dtrain::Hdf5Options ho;
  ho.driver = dtrain::Hdf5Driver::mpio;  // collective open and close: the unwind-path hazard
  dtrain::Hdf5Dataset data(a.data, "x", "y", MPI_COMM_WORLD, ho);
  dtrain::CheckpointOptions co;
  co.every_steps = a.every;
  co.keep_last = 3;
  dtrain::Checkpointer ckpt(comm, a.run_dir, co);
  State s;
  s.world = p;
  std::vector<std::int64_t> idx(4);
  std::vector<float> x(idx.size() * kFeatures);
  std::vector<std::int32_t> y(idx.size());
  std::vector<double> grad(kParams);
  for (std::int64_t step = 0; step < a.steps; ++step) {
    for (std::size_t k = 0; k < idx.size(); ++k)
      idx[k] = (step * 7 + rank * 4 + static_cast<std::int64_t>(k)) % kSamples;
    data.read(idx, x, y, dtrain::Normalize{});
    const bool here = rank == a.fault_rank && step == a.fault_step;
    if (here) {
      std::fprintf(stderr, "fault_trainer: rank %d injects '%s' at step %lld\n", rank,
                   a.fault.c_str(), static_cast<long long>(step));
      std::fflush(stderr);
    }
    if (here && a.fault == "kill") raise(SIGKILL);
    if (here && a.fault == "stop") raise(SIGSTOP);
    if (here && a.fault == "throw")
      dtrain::raise<dtrain::InvalidArgument>(
          "fault_trainer step " + std::to_string(step),
          "injected failure (label 10 of sample 6 is outside [0, 10))");
    if (here && a.fault == "diskfull") {
      // The next checkpoint write on this rank runs out of space: writes beyond 4 KiB fail with
      // EFBIG, as on a full file system (SIGXFSZ ignored so that write() reports it).
      signal(SIGXFSZ, SIG_IGN);
      rlimit lim{512, 512};
      setrlimit(RLIMIT_FSIZE, &lim);
    }
    for (int i = 0; i < kParams; ++i)
      grad[static_cast<std::size_t>(i)] = static_cast<double>((step + 1) * (i + 1));
    if (here && a.fault == "mismatch") {
      comm.broadcast(dtrain::BufferView(grad.data(), grad.size(), dtrain::DType::f64), 0);
    } else {
      comm.allreduce(dtrain::BufferView(grad.data(), grad.size(), dtrain::DType::f64),
                     dtrain::ReduceOp::sum);
    }
    for (int i = 0; i < kParams; ++i)
      s.params[static_cast<std::size_t>(i)] += grad[static_cast<std::size_t>(i)];
    s.step = step + 1;
    ckpt.maybe_save(s.step, dtrain::named("state", s));
  }
  std::printf("fault_trainer: rank %d finished %lld steps\n", rank,
              static_cast<long long>(a.steps));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!a.make_data.empty()) return make_data(a.make_data);
  if (!a.verify.empty()) return verify(a.verify);
  if (a.data.empty() || a.run_dir.empty()) usage("--data and --run-dir are required");
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  dtrain::install_mpi_fail_fast(MPI_COMM_WORLD, a.policy == "abort"
                                                    ? dtrain::FailurePolicy::abort_job
                                                    : dtrain::FailurePolicy::propagate);
  const int code = dtrain::run_main([&] { return train(a); });
  // Under propagate the error came back here after unwinding (without collectives). An
  // application that cannot recover ends the job; MPI_Finalize would wait for the peers. The
  // error line is already printed; abort_job ends the job through the installed MPI hook, which
  // lets that line reach mpiexec before MPI_Abort.
  if (code != 0) dtrain::abort_job("fault_trainer: ending the job after a propagated error", code);
  MPI_Finalize();
  return code;
}
