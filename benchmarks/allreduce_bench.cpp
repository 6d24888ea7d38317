// allreduce_bench: dtrain's all-reduce algorithms against the system MPI_Allreduce on the same
// buffers, nccl-tests style (see shared/PERFORMANCE.md for the conventions).
//
//   mpiexec.mpich -n 2 build/benchmarks/allreduce_bench -b 4K -e 64M -f 4 --algo
//   ring,tree,rhd,auto,mpi build/benchmarks/allreduce_bench --transport loopback --ranks 4 -b 1K -e
//   1M
//
// Flags: -b min bytes, -e max bytes, -f step factor, -n iterations, -w warm-up iterations,
// -R rounds (each cell reports its best round),
// -c 0|1 check results, -d dtype, -o op, --algo LIST (ring tree rhd rd auto mpi),
// --transport mpi|loopback, --ranks N (loopback), --inplace, --json FILE.
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
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>
#include <dtrain/transports/mpi.hpp>

namespace {

struct Options {
  std::size_t min_bytes = 4096, max_bytes = 64u << 20;
  double factor = 4;
  int iters = 20, warmup = 5, rounds = 3;
  bool check = true, inplace = false;
  dtrain::DType dtype = dtrain::DType::f32;
  dtrain::ReduceOp op = dtrain::ReduceOp::sum;
  std::vector<std::string> algos{"ring", "tree", "rhd", "auto", "mpi"};
  std::string transport = "mpi";
  int loopback_ranks = 2;
  std::string json;
};

struct Row {
  std::string algo;
  std::size_t bytes;
  std::size_t count;
  double time_us, algbw, busbw;
  long long wrong;
};

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suf = end ? end : "";
  if (suf == "K" || suf == "k")
    v *= 1024;
  else if (suf == "M" || suf == "m")
    v *= 1024.0 * 1024;
  else if (suf == "G" || suf == "g")
    v *= 1024.0 * 1024 * 1024;
  else if (!suf.empty())
    throw dtrain::InvalidArgument("bad size '" + s + "'");
  return static_cast<std::size_t>(v);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t c = s.find(',', start);
    out.push_back(s.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw dtrain::InvalidArgument("missing value after " + a);
      return argv[++i];
    };
    if (a == "-b")
      o.min_bytes = parse_size(next());
    else if (a == "-e")
      o.max_bytes = parse_size(next());
    else if (a == "-f")
      o.factor = std::atof(next().c_str());
    else if (a == "-n")
      o.iters = std::atoi(next().c_str());
    else if (a == "-w")
      o.warmup = std::atoi(next().c_str());
    else if (a == "-R")
      o.rounds = std::max(1, std::atoi(next().c_str()));
    else if (a == "-c")
      o.check = std::atoi(next().c_str()) != 0;
    else if (a == "-d")
      o.dtype = dtrain::dtype_from_name(next());
    else if (a == "-o")
      o.op = dtrain::reduce_op_from_name(next());
    else if (a == "--algo")
      o.algos = split(next());
    else if (a == "--transport")
      o.transport = next();
    else if (a == "--ranks")
      o.loopback_ranks = std::atoi(next().c_str());
    else if (a == "--inplace")
      o.inplace = true;
    else if (a == "--json")
      o.json = next();
    else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: allreduce_bench [-b 4K] [-e 64M] [-f 4] [-n 20] [-w 5] [-R 3] [-c 1] [-d f32] "
          "[-o sum] [--algo ring,tree,rhd,rd,auto,mpi] [--transport mpi|loopback] "
          "[--ranks 2] [--inplace] [--json FILE]\n");
      std::exit(0);
    } else {
      throw dtrain::InvalidArgument("unknown flag " + a);
    }
  }
  if (o.factor <= 1) o.factor = 2;
  if (o.min_bytes == 0) o.min_bytes = 4;
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

template <class Transport>
std::vector<Row> run_suite(dtrain::Communicator<Transport>& comm, const Options& o, bool print) {
  using dtrain::AllreduceAlgorithm;
  const int p = comm.size(), r = comm.rank();
  const std::size_t es = dtrain::size_of(o.dtype);
  const double bc = measure_bc(comm);
  if (print) {
    std::printf(
        "# dtrain allreduce_bench: p=%d transport=%s Bc=%.2f GB/s (memcpy of 256 MiB, %d "
        "concurrent copiers)\n",
        p, o.transport.c_str(), bc, p);
    std::printf(
        "# %s, dtype %s, op %s, %d iterations after %d warm-up, best of %d interleaved "
        "rounds, slowest rank, check %s\n",
        o.inplace ? "in-place" : "out-of-place", dtrain::name_of(o.dtype), dtrain::name_of(o.op),
        o.iters, o.warmup, o.rounds, o.check ? "on" : "off");
    if (comm.config().default_algorithm == AllreduceAlgorithm::automatic) {
      const auto& m = comm.cost_model();
      std::printf("# cost model: alpha %.2f us, beta %.4f ns/B (%.2f GB/s), gamma %.4f ns/B\n",
                  m.alpha * 1e6, m.beta * 1e9, 1e-9 / m.beta, m.gamma * 1e9);
    }
    std::fflush(stdout);
  } else if (comm.config().default_algorithm == AllreduceAlgorithm::automatic) {
    comm.cost_model();
  }
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
    double best = 1e30;
    long long wrong = 0;
  };
  std::vector<std::string> algos;
  for (const std::string& a : o.algos) {
    if (a == "mpi") {
      const bool ok = std::is_same_v<Transport, dtrain::MpiTransport> &&
                      mpi_type(o.dtype) != MPI_DATATYPE_NULL && mpi_op(o.op) != MPI_OP_NULL;
      if (!ok) {
        if (print)
          std::printf("# algo mpi: skipped (needs --transport mpi, an MPI dtype and an MPI op)\n");
        continue;
      }
    }
    algos.push_back(a);
  }
  const std::size_t max_count = o.max_bytes / es;
  std::vector<unsigned char> in(max_count * es + 64), out(max_count * es + 64);
  void* ip = in.data();
  void* op = o.inplace ? in.data() : out.data();
  std::vector<Cell> cells;  // [size][algo]
  for (std::size_t bytes : sizes)
    for (const std::string& a : algos) {
      Cell c;
      c.algo = c.shown = a;
      c.is_mpi = a == "mpi";
      c.bytes = bytes;
      c.count = bytes / es;
      if (!c.is_mpi) {
        c.plan = comm.plan_allreduce(dtrain::BufferView(ip, c.count, o.dtype),
                                     dtrain::BufferView(op, c.count, o.dtype), o.op,
                                     dtrain::allreduce_algorithm_from_name(a));
        if (a == "auto") c.shown = std::string("auto:") + dtrain::name_of(c.plan.algorithm());
      }
      cells.push_back(std::move(c));
    }
  auto once = [&](Cell& c) {
    if constexpr (std::is_same_v<Transport, dtrain::MpiTransport>) {
      if (c.is_mpi) {
        MPI_Allreduce(o.inplace ? MPI_IN_PLACE : ip, op, static_cast<int>(c.count),
                      mpi_type(o.dtype), mpi_op(o.op), comm.transport().mpi_comm());
        return;
      }
    }
    c.plan.execute();
  };
  for (Cell& c : cells) {
    if (!o.check) break;
    fill(ip, o.dtype, c.count, o.op, r);
    once(c);
    double w = static_cast<double>(count_wrong(op, o.dtype, c.count, o.op, p));
    comm.allreduce(dtrain::BufferView(&w, 1, dtrain::DType::f64), dtrain::ReduceOp::sum,
                   AllreduceAlgorithm::rd);
    c.wrong = static_cast<long long>(w);
  }
  for (int round = 0; round < o.rounds; ++round)
    for (Cell& c : cells) {
      fill(ip, o.dtype, c.count, o.op, r);  // keeps in-place values bounded
      for (int i = 0; i < o.warmup; ++i) once(c);
      comm.barrier();
      const double t0 = dtrain::now_seconds();
      for (int i = 0; i < o.iters; ++i) once(c);
      double dt = (dtrain::now_seconds() - t0) / std::max(1, o.iters);
      comm.allreduce(dtrain::BufferView(&dt, 1, dtrain::DType::f64), dtrain::ReduceOp::max,
                     AllreduceAlgorithm::rd);
      c.best = std::min(c.best, dt);
    }
  std::vector<Row> rows;
  for (const std::string& a : algos) {
    if (print) {
      std::printf("\n# algo %s\n", a.c_str());
      std::printf("%12s %12s %6s %6s %9s %11s %12s %12s %7s\n", "size(B)", "count", "type", "redop",
                  "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    for (const Cell& c : cells) {
      if (c.algo != a) continue;
      const double algbw = static_cast<double>(c.bytes) / c.best / 1e9;
      const double busbw = algbw * 2.0 * (p - 1) / p;
      rows.push_back(Row{a, c.bytes, c.count, c.best * 1e6, algbw, busbw, c.wrong});
      if (print)
        std::printf("%12zu %12zu %6s %6s %9s %11.2f %12.3f %12.3f %7lld\n", c.bytes, c.count,
                    dtrain::name_of(o.dtype), dtrain::name_of(o.op), c.shown.c_str(), c.best * 1e6,
                    algbw, busbw, c.wrong);
    }
  }
  if (print) std::fflush(stdout);
  return rows;
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Options& o, int p) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw dtrain::IoError("cannot write " + path);
  std::fprintf(
      f, "{\"p\": %d, \"transport\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\", \"rows\": [\n", p,
      o.transport.c_str(), dtrain::name_of(o.dtype), dtrain::name_of(o.op));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "  {\"algo\": \"%s\", \"bytes\": %zu, \"time_us\": %.3f, \"algbw\": %.4f, "
                 "\"busbw\": %.4f, \"wrong\": %lld}%s\n",
                 r.algo.c_str(), r.bytes, r.time_us, r.algbw, r.busbw, r.wrong,
                 i + 1 < rows.size() ? "," : "");
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
    const Options o = parse(argc, argv);
    std::vector<Row> rows;
    int p = 0;
    if (o.transport == "mpi") {
      dtrain::MpiTransport t(MPI_COMM_WORLD);
      dtrain::Communicator comm(t);
      p = comm.size();
      rows = run_suite(comm, o, world_rank == 0);
    } else if (o.transport == "loopback") {
      // Every MPI process runs its own loopback world; only world rank 0 reports.
      p = o.loopback_ranks;
      std::mutex m;
      dtrain::run_loopback(o.loopback_ranks, [&](dtrain::LoopbackTransport& t) {
        dtrain::Communicator comm(t);
        auto mine = run_suite(comm, o, world_rank == 0 && t.rank() == 0);
        if (t.rank() == 0) {
          std::lock_guard<std::mutex> lock(m);
          rows = std::move(mine);
        }
      });
    } else {
      throw dtrain::InvalidArgument("--transport must be mpi or loopback");
    }
    long long wrong = 0;
    for (const Row& r : rows) wrong += r.wrong;
    if (world_rank == 0) {
      std::printf("\n# total wrong: %lld\n", wrong);
      if (!o.json.empty()) write_json(o.json, rows, o, p);
    }
    code = wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    code = 2;
  }
  MPI_Finalize();
  return code;
}
