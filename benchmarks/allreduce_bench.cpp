// allreduce_bench: dtrain's all-reduce algorithms against the system MPI_Allreduce on the same
// buffers, nccl-tests style (benchmarks/RESULTS.md says how the figures are measured).
//
//   mpiexec.mpich -n 2 build/benchmarks/allreduce_bench -b 4K -e 64M -f 4 --algo ring,tree,auto,mpi
//   mpiexec.mpich -n 2 build/benchmarks/allreduce_bench --transport mpi,mpi-rma --rma-ceiling
//   build/benchmarks/allreduce_bench --transport loopback --ranks 4 -b 1K -e 1M
//
// Flags (strict; --help lists them): -b min bytes, -e max bytes, -f step factor, -n iterations,
// -w warm-up iterations, -R rounds (interleaved: every round times every algorithm of a size
// one after the other, each algorithm after every other one in turn), --stat min|median (what a
// cell reports of its rounds: the best, the default, or the median), -c 0|1 check results,
// -d dtype, -o op, --algo LIST (ring tree rhd rd shm hier hier_leader auto mpi; mpi =
// MPI_Allreduce on the same buffers; NAME@heap = NAME on buffers from the node-shared heap,
// Communicator::shared_allocator, with auto@heap reported against the other @heap cells),
// --transport LIST (mpi mpi-rma ibverbs loopback; each runs the suite in turn),
// --ranks N (loopback), --inplace, --json FILE (rows, the calibrated cost model and, with auto,
// the automatic report below), --rma-ceiling (MPI one-sided put + flush against
// two-sided transfers, the ceiling of mpi-rma), --reproducible (every dtrain algorithm runs as
// its ordered counterpart; ordered and ordered_shm can also be named in --algo).
//
// With auto among the algorithms (and DTRAIN_ALLREDUCE_ALGO unset), the header gives the
// calibrated model, how long the calibration took, the decision table and the calibration's
// validation probes, and a last table gives per size the model's prediction for every algorithm
// (hier and hier_leader too over several nodes), the choice, the measured time of every algorithm
// timed and whether the choice was within 10% of the measured best ("yes"), else whether its
// time lies within the best one's spread over the rounds ("tie": the chosen algorithm's cell at
// or below the best algorithm's third quartile of its rounds), else "NO":
//   mpiexec.mpich -n 2 build/benchmarks/allreduce_bench -b 4K -e 64M -f 4 --algo
//   ring,tree,rhd,rd,shm,auto -R 7 --stat median
// benchmarks/auto_check.sh runs that check repeatedly and tabulates it.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/mpi_rma.hpp>
#ifdef DTRAIN_HAVE_IBVERBS
#include <dtrain/transports/ibverbs.hpp>
#endif

#include <CLI/CLI.hpp>

namespace {

struct Options {
  std::size_t min_bytes = 4096, max_bytes = 64u << 20;
  double factor = 4;
  int iters = 20, warmup = 5, rounds = 3;
  bool median = false;  // --stat median: a cell reports the median of its rounds, not the best
  bool check = true, inplace = false;
  dtrain::DType dtype = dtrain::DType::f32;
  dtrain::ReduceOp op = dtrain::ReduceOp::sum;
  std::vector<std::string> algos{"ring", "tree", "rhd", "auto", "mpi"};
  std::vector<std::string> transports{"mpi"};
  std::string transport = "mpi";  // the one being run
  int loopback_ranks = 2;
  std::string json;
  bool rma_ceiling = false;
};

// --algo auto, per size: what the model predicted for every algorithm, what automatic chose,
// and the measured time of every algorithm this run timed (seconds; mpi left out of `best`).
struct AutoRow {
  std::string transport;
  bool heap = false;  // the NAME@heap cells (buffers in the node-shared heap), else host buffers
  std::size_t bytes = 0;
  std::string chosen;  // the algorithm in use at the end of the run
  std::string first;   // what the decision table gave (an adaptive plan may have changed since)
  int changes = 0;     // how often the adaptive plan changed algorithm (CommConfig::adaptive)
  std::vector<std::pair<std::string, double>> predicted, measured;
  std::string best;
  double best_s = 0, chosen_s = 0, auto_s = 0;
  double best_q75 = 0;  // the best algorithm's third quartile over the rounds
  bool within = false;  // chosen_s <= 1.1 * best_s
  bool tie = false;     // not within, but chosen_s <= best_q75 (inside the best one's spread)
};

struct Row {
  std::string transport;
  std::string algo;
  std::size_t bytes;
  std::size_t count;
  double time_us, algbw, busbw;
  long long wrong;
};

// "4096", "4K", "1.5M", "2G" (K/M/G = 1024^k); anything else is an error.
std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string suf = end ? end : "";
  if (end == s.c_str() || !(v >= 0)) throw CLI::ValidationError("size", "bad size '" + s + "'");
  if (suf == "K" || suf == "k")
    v *= 1024;
  else if (suf == "M" || suf == "m")
    v *= 1024.0 * 1024;
  else if (suf == "G" || suf == "g")
    v *= 1024.0 * 1024 * 1024;
  else if (!suf.empty())
    throw CLI::ValidationError("size", "bad size '" + s + "' (a number with K, M or G)");
  if (v > 64.0 * 1024 * 1024 * 1024) throw CLI::ValidationError("size", "'" + s + "' above 64G");
  return static_cast<std::size_t>(v);
}

// Whether an --algo name is a NAME@heap cell (buffers from the node-shared heap).
bool on_heap(const std::string& a) {
  return a.size() > 5 && a.compare(a.size() - 5, 5, "@heap") == 0;
}

// NAME without its @heap suffix.
std::string base_name(const std::string& a) { return on_heap(a) ? a.substr(0, a.size() - 5) : a; }

// What --algo accepts: every dtrain algorithm, auto and mpi, each also as NAME@heap.
std::vector<std::string> algorithm_names() {
  std::vector<std::string> v{"ring", "tree",        "rhd",     "rd",          "shm",
                             "hier", "hier_leader", "ordered", "ordered_shm", "auto"};
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) v.push_back(v[i] + "@heap");
  v.push_back("mpi");
  return v;
}

// Parses the command line (every rank alike); on --help or an error rank 0 prints and all ranks
// return `exit_code` >= 0.
Options parse(int argc, char** argv, int rank, int& exit_code) {
  Options o;
  CLI::App app{
      "allreduce_bench: dtrain's all-reduce algorithms against MPI_Allreduce, "
      "nccl-tests columns"};
  std::string b = "4K", e = "64M", dtype = "f32", op = "sum";
  int check = 1;
  app.add_option("-b", b, "smallest message in bytes (suffix K, M, G)")->capture_default_str();
  app.add_option("-e", e, "largest message in bytes")->capture_default_str();
  app.add_option("-f", o.factor, "size step factor")
      ->check(CLI::Range(1.01, 1024.0))
      ->capture_default_str();
  app.add_option("-n", o.iters, "timed iterations per round")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("-w", o.warmup, "warm-up iterations per round")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("-R", o.rounds, "interleaved rounds; each cell reports its best")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  std::string stat = "min";
  app.add_option("--stat", stat, "what a cell reports of its rounds: min (the best) or median")
      ->check(CLI::IsMember({"min", "median"}))
      ->capture_default_str();
  app.add_option("-c", check, "check results (0 or 1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("-d", dtype, "element type")
      ->check(CLI::IsMember({"f32", "f64", "i32", "i64", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("-o", op, "reduction")
      ->check(CLI::IsMember({"sum", "avg", "min", "max", "prod"}))
      ->capture_default_str();
  app.add_option("--algo", o.algos,
                 "algorithms (mpi = MPI_Allreduce; NAME@heap = NAME on buffers from the "
                 "communicator's node-shared heap, Communicator::shared_allocator)")
      ->delimiter(',')
      ->check(CLI::IsMember(algorithm_names()))
      ->capture_default_str();
  app.add_option("--transport", o.transports, "transports, each measured in turn")
      ->delimiter(',')
      ->check(CLI::IsMember({"mpi", "mpi-rma", "ibverbs", "loopback"}))
      ->capture_default_str();
  app.add_option("--ranks", o.loopback_ranks, "threads per loopback world")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_flag("--inplace", o.inplace, "in-place all-reduce");
  bool reproducible = false;
  app.add_flag("--reproducible", reproducible,
               "reproducible mode (DTRAIN_COMM_REPRODUCIBLE=1): every dtrain algorithm runs as "
               "its ordered counterpart");
  app.add_option("--json", o.json, "also write the rows to this JSON file");
  app.add_flag("--rma-ceiling", o.rma_ceiling,
               "measure MPI_Put + flush (dynamic and shared-memory windows) against two-sided "
               "transfers first");
  exit_code = -1;
  try {
    app.parse(argc, argv);
    o.min_bytes = parse_size(b);
    o.max_bytes = parse_size(e);
    if (o.min_bytes == 0 || o.max_bytes < o.min_bytes)
      throw CLI::ValidationError("-b/-e", "need 0 < min bytes <= max bytes");
  } catch (const CLI::ParseError& err) {
    if (rank == 0)
      exit_code = app.exit(err);
    else
      exit_code = err.get_exit_code();
    return o;
  }
  o.check = check != 0;
  o.median = stat == "median";
  // The communicators read their configuration from the environment when they are made.
  if (reproducible) ::setenv("DTRAIN_COMM_REPRODUCIBLE", "1", 1);
  o.dtype = dtrain::dtype_from_name(dtype);
  o.op = dtrain::reduce_op_from_name(op);
  return o;
}

// Input of rank r at element i, chosen so every op's exact result is a small integer that all
// dtypes represent exactly.
double input_value(dtrain::ReduceOp op, int r, std::size_t i) {
  if (op == dtrain::ReduceOp::prod) return (r == 0 && i % 7 == 0) ? 2.0 : 1.0;
  return static_cast<double>((r + 1) * static_cast<int>(i % 7 + 1));
}
double expected_value(dtrain::ReduceOp op, int p, std::size_t i) {
  const double k = static_cast<double>(i % 7 + 1);
  switch (op) {
    case dtrain::ReduceOp::sum: return k * p * (p + 1) / 2.0;
    case dtrain::ReduceOp::avg: return std::trunc(k * p * (p + 1) / 2.0 / p);
    case dtrain::ReduceOp::min: return k;
    case dtrain::ReduceOp::max: return k * p;
    case dtrain::ReduceOp::prod: return i % 7 == 0 ? 2.0 : 1.0;
  }
  return 0;
}

// The MPI transport's segments: as the environment says, with a node-shared heap large enough
// for the NAME@heap cells' two buffers when any is asked for.
dtrain::SharedSegmentConfig segments_for(const Options& o) {
  dtrain::SharedSegmentConfig c = dtrain::SharedSegmentConfig::from_env();
  for (const std::string& a : o.algos)
    if (on_heap(a)) c.heap_bytes = std::max(c.heap_bytes, 2 * (o.max_bytes + 64) + (1u << 20));
  return c;
}

void fill(void* data, dtrain::DType t, std::size_t n, dtrain::ReduceOp op, int r) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = input_value(op, r, i);
    switch (t) {
      case dtrain::DType::f32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
      case dtrain::DType::f64: static_cast<double*>(data)[i] = v; break;
      case dtrain::DType::i32:
        static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(v);
        break;
      case dtrain::DType::i64:
        static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(v);
        break;
      case dtrain::DType::f16:
        static_cast<dtrain::half*>(data)[i] = dtrain::half(static_cast<float>(v));
        break;
      case dtrain::DType::bf16:
        static_cast<dtrain::bfloat16*>(data)[i] = dtrain::bfloat16(static_cast<float>(v));
        break;
    }
  }
}

double read(const void* data, dtrain::DType t, std::size_t i) {
  switch (t) {
    case dtrain::DType::f32: return static_cast<const float*>(data)[i];
    case dtrain::DType::f64: return static_cast<const double*>(data)[i];
    case dtrain::DType::i32: return static_cast<const std::int32_t*>(data)[i];
    case dtrain::DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
    case dtrain::DType::f16: return static_cast<float>(static_cast<const dtrain::half*>(data)[i]);
    case dtrain::DType::bf16:
      return static_cast<float>(static_cast<const dtrain::bfloat16*>(data)[i]);
  }
  return 0;
}

long long count_wrong(const void* out, dtrain::DType t, std::size_t n, dtrain::ReduceOp op, int p) {
  long long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double want = expected_value(op, p, i);
    // Floating avg is a true division; integers truncate.
    if (op == dtrain::ReduceOp::avg && dtrain::is_floating(t))
      want = static_cast<double>(i % 7 + 1) * (p + 1) / 2.0;
    if (dtrain::is_floating(t) && t != dtrain::DType::f64) {
      const double tol = (t == dtrain::DType::f32) ? 1e-6 : (t == dtrain::DType::f16 ? 1e-3 : 8e-3);
      if (std::fabs(read(out, t, i) - want) > tol * std::fabs(want)) ++wrong;
    } else if (read(out, t, i) != want) {
      ++wrong;
    }
  }
  return wrong;
}

MPI_Datatype mpi_type(dtrain::DType t) {
  switch (t) {
    case dtrain::DType::f32: return MPI_FLOAT;
    case dtrain::DType::f64: return MPI_DOUBLE;
    case dtrain::DType::i32: return MPI_INT32_T;
    case dtrain::DType::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}
MPI_Op mpi_op(dtrain::ReduceOp op) {
  switch (op) {
    case dtrain::ReduceOp::sum: return MPI_SUM;
    case dtrain::ReduceOp::min: return MPI_MIN;
    case dtrain::ReduceOp::max: return MPI_MAX;
    case dtrain::ReduceOp::prod: return MPI_PROD;
    default: return MPI_OP_NULL;
  }
}

// memcpy rate with `copiers` ranks copying 256 MiB at the same time (best of 3), in GB/s.
template <class Comm>
double measure_bc(Comm& comm) {
  constexpr std::size_t bytes = 256u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    comm.barrier();
    const double t0 = dtrain::now_seconds();
    std::memcpy(b.data(), a.data(), bytes);
    double dt = dtrain::now_seconds() - t0;
    comm.allreduce(dtrain::BufferView(&dt, 1, dtrain::DType::f64), dtrain::ReduceOp::max,
                   dtrain::AllreduceAlgorithm::rd);
    best = std::min(best, dt);
  }
  if (b[bytes / 2] != 1) std::printf("memcpy check failed\n");
  return static_cast<double>(bytes) / best / 1e9;
}

// The calibration's validation probes (rank 0 of the suite): per probe size every algorithm's
// prediction and agreed median, fastest and slowest repetition, the winner, and whether the
// model's pick there was replaced.
void print_probes(const dtrain::detail::Calibration& c, double calibration_s) {
  if (c.probes.empty() || c.seconds > calibration_s + 1e-3) return;  // loaded from a file
  std::printf(
      "# calibration probes (us per call: predicted / median [fastest..slowest] of %d "
      "reps of N calls):\n",
      dtrain::detail::kProbeReps);
  for (const auto& q : c.probes) {
    std::printf("#   %8zu B N=%d pick %s winner %s%s%s:", q.bytes, q.burst, dtrain::name_of(q.pick),
                dtrain::name_of(q.winner), q.replaced ? " (replaced)" : "",
                q.narrowed ? " (narrowed)" : "");
    for (std::size_t k = 0; k < q.algos.size() && k < q.measured.size(); ++k)
      std::printf(" %s %.1f/%.1f[%.1f..%.1f]", dtrain::name_of(q.algos[k]), q.predicted[k] * 1e6,
                  q.measured[k] * 1e6, q.fastest(k) * 1e6, q.slowest(k) * 1e6);
    std::printf("\n");
  }
  if (c.validated_to < 1e299)
    std::printf(
        "#   larger probes skipped (time budget): from %.0f B up the model's picks stand, but for "
        "one the last probe found mispriced (beaten, measured > %.1fx its prediction)\n",
        c.validated_to, dtrain::detail::kMispricedFactor);
}

// The --algo auto report: per size, the model's prediction for each algorithm, the choice, the
// measured times of all algorithms timed in this run, and whether the choice was within 10% of
// the measured best (printed on rank 0 of the suite when `print`). `heap`: the report of auto@heap
// against the other NAME@heap cells, else of auto against the cells on host buffers.
template <class Comm, class Cell>
std::vector<AutoRow> auto_report(Comm& comm, const Options& o,
                                 const std::vector<std::size_t>& sizes,
                                 const std::vector<std::string>& algos,
                                 const std::vector<Cell>& cells, bool heap, bool print) {
  using dtrain::AllreduceAlgorithm;
  const dtrain::CostModel& m = comm.cost_model();
  const int p = comm.size();
  const dtrain::Topology& topo = comm.topology();
  std::vector<AllreduceAlgorithm> modelled{AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                                           AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd};
  if (m.shm_alpha > 0 && topo.nodes <= 1) modelled.push_back(AllreduceAlgorithm::shm);
  if (topo.hierarchical()) {
    modelled.push_back(AllreduceAlgorithm::hier);
    modelled.push_back(AllreduceAlgorithm::hier_leader);
  }
  std::vector<AutoRow> out;
  int within = 0, ties = 0;
  for (std::size_t bytes : sizes) {
    AutoRow a;
    a.transport = o.transport;
    a.heap = heap;
    a.bytes = bytes;
    const std::size_t wide = bytes / dtrain::size_of(o.dtype) *
                             ((o.dtype == dtrain::DType::f16 || o.dtype == dtrain::DType::bf16)
                                  ? 4
                                  : dtrain::size_of(o.dtype));
    for (AllreduceAlgorithm al : modelled)
      a.predicted.emplace_back(dtrain::name_of(al), m.predict(al, wide, p, topo));
    a.best_s = 1e30;
    for (const Cell& c : cells) {
      if (c.bytes != bytes || on_heap(c.algo) != heap) continue;
      const std::string name = base_name(c.algo);
      if (name == "auto") {
        a.chosen = dtrain::name_of(c.plan.algorithm());
        a.first = c.first;
        a.changes = c.plan.algorithm_changes();
        a.auto_s = c.best;
        continue;
      }
      a.measured.emplace_back(name, c.best);
      if (name != "mpi" && c.best < a.best_s) {
        a.best_s = c.best;
        a.best_q75 = c.q75;
        a.best = name;
      }
    }
    a.chosen_s = a.auto_s;  // the chosen algorithm's own cell, when it was timed too
    for (const auto& [name, s] : a.measured)
      if (name == a.chosen) a.chosen_s = s;
    if (a.best.empty()) {
      a.best = a.chosen;
      a.best_s = a.chosen_s;
      a.best_q75 = a.chosen_s;
    }
    a.within = a.chosen_s <= 1.1 * a.best_s;
    a.tie = !a.within && a.chosen_s <= a.best_q75;
    within += a.within;
    ties += a.tie;
    out.push_back(std::move(a));
  }
  if (!print) return out;
  std::printf(
      "\n# transport %s, automatic%s: model prediction (us) per algorithm, choice, measured "
      "time (us) of every algorithm timed, best measured dtrain algorithm\n",
      o.transport.c_str(), heap ? " on node-shared heap buffers (the NAME@heap cells)" : "");
  std::printf("%12s %9s", "size(B)", "chosen");
  for (const auto& [name, s] : out.front().predicted) std::printf(" %9s", ("p:" + name).c_str());
  for (const auto& [name, s] : out.front().measured) std::printf(" %9s", ("m:" + name).c_str());
  std::printf(" %9s %9s %12s %7s %10s %9s\n", "m:auto", "best", "chosen/best", "<=1.1", "auto/best",
              "changes");
  int auto_within = 0, changed = 0;
  for (const AutoRow& a : out) {
    std::printf("%12zu %9s", a.bytes, a.chosen.c_str());
    for (const auto& [name, s] : a.predicted) std::printf(" %9.1f", s * 1e6);
    for (const auto& [name, s] : a.measured) std::printf(" %9.1f", s * 1e6);
    std::printf(" %9.1f %9s %12.3f %7s %10.3f %9s\n", a.auto_s * 1e6, a.best.c_str(),
                a.chosen_s / a.best_s, a.within ? "yes" : (a.tie ? "tie" : "NO"),
                a.auto_s / a.best_s,
                a.changes ? (std::to_string(a.changes) + ":" + a.first).c_str() : "-");
    auto_within += a.auto_s <= 1.1 * a.best_s;
    changed += a.changes > 0;
  }
  std::printf(
      "# `auto` itself (its own cell, adaptive windows included) within 10%% of the best at %d "
      "of %zu sizes; %d size(s) changed algorithm while timed (changes:first choice)\n",
      auto_within, out.size(), changed);
  bool all_timed = true;
  for (const auto& [name, s] : out.front().predicted)
    all_timed = all_timed &&
                std::find(algos.begin(), algos.end(), heap ? name + "@heap" : name) != algos.end();
  std::printf(
      "# automatic within 10%% of the measured best at %d of %zu sizes, within the best one's "
      "spread over the rounds at %d more%s\n",
      within, out.size(), ties,
      all_timed ? ""
      : heap    ? " (not every candidate was timed: use --algo "
                  "ring@heap,tree@heap,rhd@heap,rd@heap,shm@heap,auto@heap)"
                : " (not every candidate was timed: use --algo ring,tree,rhd,rd,shm,auto)");
  std::fflush(stdout);
  return out;
}

template <class Transport>
std::vector<Row> run_suite(dtrain::Communicator<Transport>& comm, const Options& o, bool print,
                           MPI_Comm mpi, dtrain::CostModel* calibrated = nullptr,
                           std::vector<AutoRow>* autos = nullptr) {
  using dtrain::AllreduceAlgorithm;
  const int p = comm.size(), r = comm.rank();
  const std::size_t es = dtrain::size_of(o.dtype);
  const bool automatic = comm.config().default_algorithm == AllreduceAlgorithm::automatic;
  // The calibration, timed (it runs at job start in a real run).
  double calibration_s = 0;
  if (automatic) {
    const double c0 = dtrain::now_seconds();
    comm.cost_model();
    calibration_s = dtrain::now_seconds() - c0;
  }
  const double bc = measure_bc(comm);
  if (print) {
    std::printf(
        "# dtrain allreduce_bench: p=%d transport=%s Bc=%.2f GB/s (memcpy of 256 MiB, %d "
        "concurrent copiers)\n",
        p, o.transport.c_str(), bc, p);
    std::printf(
        "# %s, dtype %s, op %s, %d iterations after %d warm-up, %s of %d interleaved "
        "rounds (each algorithm after every other in turn), slowest rank, check %s\n",
        o.inplace ? "in-place" : "out-of-place", dtrain::name_of(o.dtype), dtrain::name_of(o.op),
        o.iters, o.warmup, o.median ? "median" : "best", o.rounds, o.check ? "on" : "off");
    if (automatic) {
      const auto& m = comm.cost_model();
      std::printf(
          "# cost model (calibrated in %.0f ms): alpha %.2f us, beta %.4f ns/B (%.2f GB/s), "
          "gamma %.4f ns/B, shm alpha %.2f us, shm beta %.4f ns/B, inter alpha %.2f us, inter "
          "beta %.4f ns/B (x%.2f from every rank at once), per call %.2f us, per-byte terms "
          "x%.2f beyond %.0f MiB over %d ranks\n",
          calibration_s * 1e3, m.alpha * 1e6, m.beta * 1e9, 1e-9 / m.beta, m.gamma * 1e9,
          m.shm_alpha * 1e6, m.shm_beta * 1e9, m.inter_alpha * 1e6, m.inter_beta * 1e9,
          m.inter_share, m.call * 1e6, m.mem_factor, m.cache_bytes / (1 << 20), m.cache_ranks);
      std::printf("# automatic decisions (from bytes per rank):");
      for (const auto& d : comm.allreduce_decisions())
        std::printf(" %zu:%s", d.min_bytes, dtrain::name_of(d.algo));
      std::printf("\n");
      print_probes(dtrain::detail::last_calibration(), calibration_s);
    }
    std::fflush(stdout);
  }
  if (calibrated && comm.config().default_algorithm == AllreduceAlgorithm::automatic)
    *calibrated = comm.cost_model();
  // Every (size, algorithm) pair is checked once, then timed in rounds that interleave the
  // algorithms size by size, so that load from other processes on a shared machine hits them
  // alike; each cell reports its best round (the slowest rank's time within a round).
  std::vector<std::size_t> sizes;
  for (double sz = static_cast<double>(o.min_bytes);
       sz <= static_cast<double>(o.max_bytes) * 1.0001; sz *= o.factor)
    sizes.push_back(static_cast<std::size_t>(sz) / es * es);
  struct Cell {
    std::string algo, shown;
    bool is_mpi = false;
    std::size_t bytes = 0, count = 0;
    dtrain::CollectivePlan<Transport> plan;
    std::string first;          // auto: the algorithm the plan started with
    std::vector<double> times;  // per round
    void* ip = nullptr;         // the cell's buffers (the heap's for NAME@heap)
    void* op = nullptr;
    double best = 1e30;  // what the cell reports (--stat), and the rounds' third quartile
    double q75 = 1e30;
    long long wrong = 0;
  };
  std::vector<std::string> algos;
  for (const std::string& a : o.algos) {
    if (a == "mpi") {
      const bool ok = mpi != MPI_COMM_NULL && mpi_type(o.dtype) != MPI_DATATYPE_NULL &&
                      mpi_op(o.op) != MPI_OP_NULL;
      if (!ok) {
        if (print)
          std::printf("# algo mpi: skipped (needs an MPI transport, an MPI dtype and op)\n");
        continue;
      }
    }
    algos.push_back(a);
  }
  const std::size_t max_count = o.max_bytes / es;
  std::vector<unsigned char> in(max_count * es + 64), out(max_count * es + 64);
  void* ip = in.data();
  void* op = o.inplace ? in.data() : out.data();
  // NAME@heap cells: the same sizes on buffers from the node-shared heap (shm, and hier and
  // hier_leader inside each node, then read them in place). A rank alone on its node has none.
  const std::size_t buf_bytes = max_count * es + 64;
  dtrain::Allocator& shared = comm.shared_allocator();
  const bool want_heap = std::any_of(algos.begin(), algos.end(), on_heap);
  struct HeapBuffers {
    dtrain::Allocator* a = nullptr;
    void* in = nullptr;
    void* out = nullptr;
    std::size_t bytes = 0;
    ~HeapBuffers() {
      if (a) a->deallocate(in, bytes), a->deallocate(out, bytes);
    }
  } heap;
  if (want_heap) {
    heap.a = &shared;
    heap.bytes = buf_bytes;
    heap.in = shared.allocate(buf_bytes, 64);
    heap.out = shared.allocate(buf_bytes, 64);
    auto* h = dynamic_cast<dtrain::SharedHeapAllocator*>(&shared);
    const bool in_heap = h && h->owns(heap.in) && h->owns(heap.out);
    if (print && !in_heap)
      std::printf(
          "# NAME@heap: no node-shared heap of %zu B on rank 0 (DTRAIN_SHM_HEAP_MIB, alone on its "
          "node): its cells run on host buffers\n",
          2 * buf_bytes);
  }
  std::vector<Cell> cells;  // [size][algo]
  for (std::size_t bytes : sizes)
    for (const std::string& a : algos) {
      Cell c;
      c.algo = c.shown = a;
      c.is_mpi = a == "mpi";
      c.bytes = bytes;
      c.count = bytes / es;
      const bool heap_cell = on_heap(a);
      const std::string base = base_name(a);
      c.ip = heap_cell ? heap.in : ip;
      c.op = heap_cell ? (o.inplace ? heap.in : heap.out) : op;
      if (!c.is_mpi) {
        c.plan = comm.plan_allreduce(dtrain::BufferView(c.ip, c.count, o.dtype),
                                     dtrain::BufferView(c.op, c.count, o.dtype), o.op,
                                     dtrain::allreduce_algorithm_from_name(base));
        if (base == "auto") {
          c.first = dtrain::name_of(c.plan.algorithm());
          c.shown = a + ":" + c.first;
        }
      }
      cells.push_back(std::move(c));
    }
  auto once = [&](Cell& c) {
    if (c.is_mpi) {
      MPI_Allreduce(o.inplace ? MPI_IN_PLACE : c.ip, c.op, static_cast<int>(c.count),
                    mpi_type(o.dtype), mpi_op(o.op), mpi);
      return;
    }
    c.plan.execute();
  };
  for (Cell& c : cells) {
    if (!o.check) break;
    fill(c.ip, o.dtype, c.count, o.op, r);
    once(c);
    double w = static_cast<double>(count_wrong(c.op, o.dtype, c.count, o.op, p));
    comm.allreduce(dtrain::BufferView(&w, 1, dtrain::DType::f64), dtrain::ReduceOp::sum,
                   AllreduceAlgorithm::rd);
    c.wrong = static_cast<long long>(w);
  }
  // Each round times the algorithms of one size one after the other, in an order that changes
  // each round so that every algorithm follows each other one equally often
  // (detail::balanced_order), so that neither a burst of load nor what the previous algorithm
  // left behind (its cache state, its waits' state) favours one of them.
  const std::size_t na = algos.size();
  for (int round = 0; round < o.rounds; ++round) {
    const std::vector<std::size_t> order =
        dtrain::detail::balanced_order(na, static_cast<std::size_t>(round));
    for (std::size_t si = 0; si < sizes.size(); ++si)
      for (std::size_t j = 0; j < na; ++j) {
        Cell& c = cells[si * na + order[j]];
        fill(c.ip, o.dtype, c.count, o.op, r);  // keeps in-place values bounded
        // Timed in the algorithm's own steady state: the ranks start together, the waits'
        // memory of contention that the previous cell (or the barrier) may have left is
        // cleared, and the warm-up calls let this algorithm's waits set it again if they find
        // the cores contended (detail/backoff.hpp). Carried over, it timed each algorithm in the
        // state of the one before it in the rotation, always the same (benchmarks/RESULTS.md).
        comm.barrier();
        dtrain::detail::forget_contention();
        for (int i = 0; i < o.warmup; ++i) once(c);
        const double t0 = dtrain::now_seconds();
        for (int i = 0; i < o.iters; ++i) once(c);
        double dt = (dtrain::now_seconds() - t0) / std::max(1, o.iters);
        comm.allreduce(dtrain::BufferView(&dt, 1, dtrain::DType::f64), dtrain::ReduceOp::max,
                       AllreduceAlgorithm::rd);
        c.times.push_back(dt);
      }
  }
  for (Cell& c : cells) {
    std::vector<double> t = c.times;
    std::sort(t.begin(), t.end());
    c.best = o.median ? dtrain::detail::median_of(t) : t.front();
    c.q75 = t[(3 * (t.size() - 1) + 3) / 4];  // index ceil(3/4 (n - 1))
  }
  std::vector<Row> rows;
  for (const bool heap_cells : {false, true})
    if (automatic && autos &&
        std::find(algos.begin(), algos.end(), heap_cells ? "auto@heap" : "auto") != algos.end()) {
      const auto mine = auto_report(comm, o, sizes, algos, cells, heap_cells, print);
      autos->insert(autos->end(), mine.begin(), mine.end());
    }
  for (const std::string& a : algos) {
    if (print) {
      std::printf("\n# transport %s, algo %s\n", o.transport.c_str(), a.c_str());
      std::printf("%12s %12s %6s %6s %9s %11s %12s %12s %7s\n", "size(B)", "count", "type", "redop",
                  "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    for (const Cell& c : cells) {
      if (c.algo != a) continue;
      const double algbw = static_cast<double>(c.bytes) / c.best / 1e9;
      const double busbw = algbw * 2.0 * (p - 1) / p;
      rows.push_back(Row{o.transport, a, c.bytes, c.count, c.best * 1e6, algbw, busbw, c.wrong});
      if (print)
        std::printf("%12zu %12zu %6s %6s %9s %11.2f %12.3f %12.3f %7lld\n", c.bytes, c.count,
                    dtrain::name_of(o.dtype), dtrain::name_of(o.op), c.shown.c_str(), c.best * 1e6,
                    algbw, busbw, c.wrong);
    }
  }
  if (print) std::fflush(stdout);
  return rows;
}

// The ceiling of the MPI-RMA transport on this MPI: for each size, one rank's MPI_Put + flush
// to its partner into a dynamic window (what mpi-rma does) and into a shared-memory window
// (MPI_Win_allocate_shared), a plain memcpy into the partner's shared segment, and two-sided
// MPI_Send/MPI_Recv of the same bytes; GB/s of the slowest rank, best of the rounds.
void rma_ceiling(const Options& o, bool print) {
  int p = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (p != 2) {
    if (print) std::printf("# rma ceiling: skipped (needs exactly 2 ranks)\n");
    return;
  }
  const int partner = 1 - r;
  const std::size_t max = o.max_bytes;
  std::vector<unsigned char> src(max, 1), dyn(max, 0), dst2(max, 0);
  MPI_Win dwin, swin;
  MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &dwin);
  MPI_Win_attach(dwin, dyn.data(), static_cast<MPI_Aint>(max));
  MPI_Aint mine = 0, theirs = 0;
  MPI_Get_address(dyn.data(), &mine);
  MPI_Sendrecv(&mine, 1, MPI_AINT, partner, 0, &theirs, 1, MPI_AINT, partner, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  unsigned char* sbase = nullptr;
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(max), 64, MPI_INFO_NULL, node, &sbase, &swin);
  MPI_Aint qbytes = 0;
  int disp = 0;
  unsigned char* peer_seg = nullptr;
  MPI_Win_shared_query(swin, partner, &qbytes, &disp, &peer_seg);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, dwin);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, swin);
  if (print) {
    std::printf("# rma ceiling (2 ranks, both sending at once, best of %d rounds of %d): GB/s\n",
                o.rounds, o.iters);
    std::printf("%12s %14s %14s %14s %14s\n", "size(B)", "put+flush dyn", "put+flush shm",
                "memcpy shm", "send/recv");
  }
  for (double sz = static_cast<double>(o.min_bytes); sz <= static_cast<double>(max) * 1.0001;
       sz *= o.factor) {
    const auto bytes = static_cast<std::size_t>(sz);
    const int n = static_cast<int>(bytes);
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int round = 0; round < o.rounds; ++round)
      for (int mode = 0; mode < 4; ++mode) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < o.iters; ++i) {
          if (mode == 0) {
            MPI_Put(src.data(), n, MPI_BYTE, partner, theirs, n, MPI_BYTE, dwin);
            MPI_Win_flush(partner, dwin);
          } else if (mode == 1) {
            MPI_Put(src.data(), n, MPI_BYTE, partner, 0, n, MPI_BYTE, swin);
            MPI_Win_flush(partner, swin);
          } else if (mode == 2) {
            std::memcpy(peer_seg, src.data(), bytes);
          } else {
            MPI_Sendrecv(src.data(), n, MPI_BYTE, partner, 1, dst2.data(), n, MPI_BYTE, partner, 1,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          }
        }
        double dt = (MPI_Wtime() - t0) / o.iters;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best[mode] = std::min(best[mode], dt);
      }
    if (print)
      std::printf("%12zu %14.3f %14.3f %14.3f %14.3f\n", bytes, bytes / best[0] / 1e9,
                  bytes / best[1] / 1e9, bytes / best[2] / 1e9, bytes / best[3] / 1e9);
  }
  if (print) std::fflush(stdout);
  MPI_Win_unlock_all(swin);
  MPI_Win_unlock_all(dwin);
  MPI_Win_free(&swin);
  MPI_Win_detach(dwin, dyn.data());
  MPI_Win_free(&dwin);
  MPI_Comm_free(&node);
}

// Round trip of one cache line between the first two ranks of rank 0's node, through a
// node-shared window, in ns: the median of 5 bursts of 2000 round trips. It tells where the two
// cores sit relative to each other: on the machine measured 50-65 ns where they share an L3 and
// 310-350 ns where they do not, and a virtual machine's cores moved between the two within a
// run (benchmarks/RESULTS.md). Negative where it does not apply: fewer than 2 ranks on the node,
// more ranks than cores (a spinning partner would hold the core the other needs), or a burst past
// its 2 s deadline. Collective over MPI_COMM_WORLD.
double core_round_trip_ns() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 0, r = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_rank(node, &r);
  const unsigned cores = std::thread::hardware_concurrency();
  const bool apply = n >= 2 && (cores == 0 || static_cast<unsigned>(n) <= cores);
  MPI_Win win;
  unsigned char* base = nullptr;
  MPI_Win_allocate_shared(r == 0 ? 128 : 0, 64, MPI_INFO_NULL, node, &base, &win);
  MPI_Aint qbytes = 0;
  int disp = 0;
  unsigned char* line = nullptr;
  MPI_Win_shared_query(win, 0, &qbytes, &disp, &line);
  auto* a = reinterpret_cast<std::atomic<std::uint64_t>*>(line);
  if (r == 0) new (a) std::atomic<std::uint64_t>(0);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
  MPI_Win_sync(win);
  MPI_Barrier(node);
  constexpr int kBursts = 5, kTrips = 2000;
  std::vector<double> ns;
  int failed = 0;
  for (int b = 0; b < kBursts && apply; ++b) {
    MPI_Barrier(node);
    const std::uint64_t first = static_cast<std::uint64_t>(b) * 2 * kTrips;
    const double t0 = MPI_Wtime();
    if (r < 2) {
      for (int k = 0; k < kTrips && !failed; ++k) {
        // Rank 0 answers even values, rank 1 odd ones; each waits for the other's store.
        const std::uint64_t want = first + 2 * static_cast<std::uint64_t>(k) + r;
        for (unsigned spins = 0; a->load(std::memory_order_acquire) != want;)
          if (++spins % 4096 == 0 && MPI_Wtime() - t0 > 2.0) {
            failed = 1;
            break;
          }
        if (!failed) a->store(want + 1, std::memory_order_release);
      }
    }
    ns.push_back((MPI_Wtime() - t0) / kTrips * 1e9);
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, node);
    if (failed) break;  // else the counter stands at the next burst's first value
  }
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  MPI_Comm_free(&node);
  double out = -1;
  if (apply && !failed) {
    std::sort(ns.begin(), ns.end());
    out = ns[ns.size() / 2];
  }
  // Rank 0 of the world reports its node's figure.
  MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return out;
}

void print_round_trip(const char* when) {
  const double ns = core_round_trip_ns();
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r != 0) return;
  if (ns > 0)
    std::printf("# core-to-core round trip %s (node ranks 0 and 1, one shared line): %.0f ns\n",
                when, ns);
  else
    std::printf(
        "# core-to-core round trip %s: not measured (needs 2 to as many ranks as cores "
        "on rank 0's node)\n",
        when);
  std::fflush(stdout);
}

// `cm`: the cost model the last suite calibrated (written when valid; allreduce_model reads it).
void write_json(const std::string& path, const std::vector<Row>& rows, const Options& o, int p,
                const dtrain::CostModel& cm, const std::vector<AutoRow>& autos) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw dtrain::IoError("cannot write " + path);
  std::fprintf(f, "{\"p\": %d, \"dtype\": \"%s\", \"op\": \"%s\",", p, dtrain::name_of(o.dtype),
               dtrain::name_of(o.op));
  if (cm.valid())
    std::fprintf(f,
                 " \"cost_model\": {\"alpha\": %.6e, \"beta\": %.6e, \"gamma\": %.6e, "
                 "\"shm_alpha\": %.6e, \"shm_beta\": %.6e, \"shm_chunk\": %.0f, "
                 "\"inter_alpha\": %.6e, \"inter_beta\": %.6e, \"inter_share\": %.4f, "
                 "\"call\": %.6e, \"cache_bytes\": %.0f, \"mem_factor\": %.4f, "
                 "\"cache_ranks\": %d},",
                 cm.alpha, cm.beta, cm.gamma, cm.shm_alpha, cm.shm_beta, cm.shm_chunk,
                 cm.inter_alpha, cm.inter_beta, cm.inter_share, cm.call, cm.cache_bytes,
                 cm.mem_factor, cm.cache_ranks);
  std::fprintf(f, " \"rows\": [\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "  {\"transport\": \"%s\", \"algo\": \"%s\", \"bytes\": %zu, \"time_us\": %.3f, "
                 "\"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %lld}%s\n",
                 r.transport.c_str(), r.algo.c_str(), r.bytes, r.time_us, r.algbw, r.busbw, r.wrong,
                 i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "], \"auto\": [\n");
  auto pairs = [&](const std::vector<std::pair<std::string, double>>& v) {
    std::fprintf(f, "{");
    for (std::size_t k = 0; k < v.size(); ++k)
      std::fprintf(f, "%s\"%s\": %.3f", k ? ", " : "", v[k].first.c_str(), v[k].second * 1e6);
    std::fprintf(f, "}");
  };
  for (std::size_t i = 0; i < autos.size(); ++i) {
    const AutoRow& a = autos[i];
    std::fprintf(f,
                 "  {\"transport\": \"%s\", \"heap\": %s, \"bytes\": %zu, \"chosen\": \"%s\", "
                 "\"predicted_us\": ",
                 a.transport.c_str(), a.heap ? "true" : "false", a.bytes, a.chosen.c_str());
    pairs(a.predicted);
    std::fprintf(f, ", \"measured_us\": ");
    pairs(a.measured);
    std::fprintf(f,
                 ", \"auto_us\": %.3f, \"best\": \"%s\", \"chosen_over_best\": %.4f, "
                 "\"within_10pct\": %s, \"within_spread\": %s, \"first_choice\": \"%s\", "
                 "\"changes\": %d, \"auto_over_best\": %.4f}%s\n",
                 a.auto_s * 1e6, a.best.c_str(), a.chosen_s / a.best_s, a.within ? "true" : "false",
                 a.within || a.tie ? "true" : "false", a.first.c_str(), a.changes,
                 a.auto_s / a.best_s, i + 1 < autos.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  int code = 0;
  try {
    int exit_code = -1;
    Options o = parse(argc, argv, world_rank, exit_code);
    if (exit_code >= 0) {
      MPI_Finalize();
      return exit_code;
    }
    std::vector<Row> rows;
    int p = 0;
    dtrain::CostModel model;
    std::vector<AutoRow> auto_rows;
    print_round_trip("at the start");
    if (o.rma_ceiling) rma_ceiling(o, world_rank == 0);
    for (const std::string& tr : o.transports) {
      o.transport = tr;
      std::vector<Row> got;
      if (tr == "mpi") {
        dtrain::MpiTransport t(MPI_COMM_WORLD, segments_for(o));
        dtrain::Communicator comm(t);
        p = comm.size();
        got = run_suite(comm, o, world_rank == 0, t.mpi_comm(), &model, &auto_rows);
      } else if (tr == "mpi-rma") {
        dtrain::MpiRmaTransport t(MPI_COMM_WORLD);
        dtrain::Communicator comm(t);
        p = comm.size();
        got = run_suite(comm, o, world_rank == 0, t.backend().mpi_comm(), &model, &auto_rows);
      } else if (tr == "ibverbs") {
#ifdef DTRAIN_HAVE_IBVERBS
        dtrain::IbverbsTransport t(MPI_COMM_WORLD);
        dtrain::Communicator comm(t);
        p = comm.size();
        if (world_rank == 0)
          std::printf("# ibverbs device: %s\n", t.backend().device_description().c_str());
        got = run_suite(comm, o, world_rank == 0, MPI_COMM_WORLD, &model, &auto_rows);
#else
        throw dtrain::InvalidArgument("--transport ibverbs: built without libibverbs");
#endif
      } else {
        // Every MPI process runs its own loopback world; only world rank 0 reports.
        p = o.loopback_ranks;
        std::mutex m;
        dtrain::run_loopback(o.loopback_ranks, [&](dtrain::LoopbackTransport& t) {
          dtrain::Communicator comm(t);
          dtrain::CostModel cm;
          std::vector<AutoRow> mine_auto;
          auto mine =
              run_suite(comm, o, world_rank == 0 && t.rank() == 0, MPI_COMM_NULL, &cm, &mine_auto);
          if (t.rank() == 0) {
            std::lock_guard<std::mutex> lock(m);
            got = std::move(mine);
            model = cm;
            auto_rows.insert(auto_rows.end(), mine_auto.begin(), mine_auto.end());
          }
        });
      }
      rows.insert(rows.end(), got.begin(), got.end());
    }
    print_round_trip("at the end");
    long long wrong = 0;
    for (const Row& r : rows) wrong += r.wrong;
    if (world_rank == 0) {
      std::printf("\n# total wrong: %lld\n", wrong);
      if (!o.json.empty()) write_json(o.json, rows, o, p, model, auto_rows);
    }
    code = wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    code = 2;
  }
  MPI_Finalize();
  return code;
}
