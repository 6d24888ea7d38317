// parts_bench: dtrain's reduce_scatter and allgather against MPICH's MPI_Reduce_scatter_block
// and MPI_Allgather, on one node:
//
//   mpiexec.mpich -n 2 build/benchmarks/parts_bench --min-kib 4 --max-kib 65536 -R 5
//
// Cells per size (the whole vector's bytes, f32, sum):
//   rs@heap, ag@heap  dtrain on buffers from the node-shared heap (one hand-off, read in place;
//                     algo/shm_parts.hpp)
//   rs, ag            dtrain on private buffers (the ring over MPI, after the hand-off)
//   rs_mpi, ag_mpi    MPI_Reduce_scatter_block / MPI_Allgather on the same private buffers
//   ar@heap           dtrain's shm all-reduce on heap buffers, in place (what gradient sync runs),
//                     next to rs@heap + ag@heap (what a sharded optimizer step would run instead)
// Rounds are interleaved (every round times every cell of a size in turn); a cell reports the
// best round's mean time per call, the slowest rank's. Results are checked once per cell.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi.hpp>

#include <CLI/CLI.hpp>

namespace {

struct Options {
  std::size_t min_kib = 4, max_kib = 64 * 1024;
  int factor = 4, iters = 20, warmup = 5, rounds = 5;
};

struct Cell {
  std::string name;
  std::function<void()> call;
  std::function<long long()> wrong;  // elements that differ from the exact result
  double best_us = 1e30;
};

// Mean seconds per call over `iters` calls, the slowest rank's.
double time_calls(const std::function<void()>& f, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) f();
  double dt = (MPI_Wtime() - t0) / iters, worst = 0;
  MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

float value(std::size_t i, int r) {
  return static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 13) % 101);
}

int run(const Options& o) {
  int r = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  dtrain::SharedSegmentConfig seg = dtrain::SharedSegmentConfig::from_env();
  seg.heap_bytes = std::max(seg.heap_bytes, 4 * (o.max_kib * 1024 + 4096) + (1u << 20));
  dtrain::MpiTransport t(MPI_COMM_WORLD, seg);
  dtrain::Communicator comm(t);
  if (!dtrain::shared_segments_of(t)) {
    if (r == 0)
      std::printf("# no node-shared segments (several nodes, one rank or DTRAIN_SHM=0)\n");
    return 1;
  }
  dtrain::Allocator& heap = comm.shared_allocator();
  if (r == 0)
    std::printf(
        "# parts_bench: %d ranks, f32 sum, %d iterations x %d rounds (best round), us per call\n"
        "%10s %10s %10s %10s %10s %10s %10s %10s %12s %12s\n",
        p, o.iters, o.rounds, "bytes", "rs@heap", "rs", "rs_mpi", "ag@heap", "ag", "ag_mpi",
        "ar@heap", "rs/rs_mpi@h", "ag/ag_mpi@h");
  for (std::size_t kib = o.min_kib; kib <= o.max_kib; kib *= static_cast<std::size_t>(o.factor)) {
    const std::size_t n =
        kib * 1024 / sizeof(float) / static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
    const std::size_t part = n / static_cast<std::size_t>(p),
                      b0 = part * static_cast<std::size_t>(r);
    auto* h_in = static_cast<float*>(heap.allocate(n * 4, 4096));
    auto* h_part = static_cast<float*>(heap.allocate(part * 4, 4096));
    auto* h_all = static_cast<float*>(heap.allocate(n * 4, 4096));
    auto* h_ar = static_cast<float*>(heap.allocate(n * 4, 4096));
    std::vector<float> in(n), mine(part), all(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = h_in[i] = value(i, r);
    using dtrain::BufferView;
    using dtrain::DType;
    auto rs_wrong = [&](const float* got) {
      long long bad = 0;
      for (std::size_t j = 0; j < part; ++j) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += value(b0 + j, q);
        bad += got[j] != want;
      }
      return bad;
    };
    auto ag_wrong = [&](const float* got, const float* src) {
      long long bad = 0;
      for (int q = 0; q < p; ++q)
        for (std::size_t j = 0; j < part; ++j)
          bad += got[static_cast<std::size_t>(q) * part + j] != src[j] + static_cast<float>(q - r);
      return bad;
    };
    std::vector<Cell> cells = {
        {"rs@heap",
         [&] {
           comm.reduce_scatter(BufferView(h_in, n, DType::f32),
                               BufferView(h_part, part, DType::f32), dtrain::ReduceOp::sum);
         },
         [&] { return rs_wrong(h_part); }},
        {"rs",
         [&] {
           comm.reduce_scatter(BufferView(in.data(), n, DType::f32),
                               BufferView(mine.data(), part, DType::f32), dtrain::ReduceOp::sum);
         },
         [&] { return rs_wrong(mine.data()); }},
        {"rs_mpi",
         [&] {
           MPI_Reduce_scatter_block(in.data(), mine.data(), static_cast<int>(part), MPI_FLOAT,
                                    MPI_SUM, MPI_COMM_WORLD);
         },
         [&] { return rs_wrong(mine.data()); }},
        {"ag@heap",
         [&] {
           comm.allgather(BufferView(h_part, part, DType::f32), BufferView(h_all, n, DType::f32));
         },
         [&] { return 0LL; }},
        {"ag",
         [&] {
           comm.allgather(BufferView(mine.data(), part, DType::f32),
                          BufferView(all.data(), n, DType::f32));
         },
         [&] { return 0LL; }},
        {"ag_mpi",
         [&] {
           MPI_Allgather(mine.data(), static_cast<int>(part), MPI_FLOAT, all.data(),
                         static_cast<int>(part), MPI_FLOAT, MPI_COMM_WORLD);
         },
         [&] { return 0LL; }},
        {"ar@heap",
         [&] {
           comm.allreduce(BufferView(h_ar, n, DType::f32), dtrain::ReduceOp::avg,
                          dtrain::AllreduceAlgorithm::shm);
         },
         [&] { return 0LL; }},
    };
    // Checked once each: reduce_scatter exactly; allgather gathers each rank's part of rank-
    // specific values (rank q's element j = rank r's + q - r).
    long long bad = 0;
    for (std::size_t c : {std::size_t{0}, std::size_t{1}, std::size_t{2}}) {
      cells[c].call();
      bad += cells[c].wrong();
    }
    for (std::size_t j = 0; j < part; ++j)
      h_part[j] = mine[j] = value(j, 0) + static_cast<float>(r);
    cells[3].call();
    bad += ag_wrong(h_all, h_part);
    for (std::size_t j = 0; j < part; ++j) h_part[j] = value(j, 0) + static_cast<float>(r);
    cells[4].call();
    bad += ag_wrong(all.data(), mine.data());
    cells[5].call();
    bad += ag_wrong(all.data(), mine.data());
    long long bad_all = 0;
    MPI_Allreduce(&bad, &bad_all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    for (Cell& c : cells)
      for (int w = 0; w < o.warmup; ++w) c.call();
    for (int round = 0; round < o.rounds; ++round)
      for (std::size_t k = 0; k < cells.size(); ++k) {
        Cell& c = cells[(k + static_cast<std::size_t>(round)) % cells.size()];
        c.best_us = std::min(c.best_us, 1e6 * time_calls(c.call, o.iters));
      }
    if (r == 0)
      std::printf("%10zu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %12.2f %12.2f%s\n", n * 4,
                  cells[0].best_us, cells[1].best_us, cells[2].best_us, cells[3].best_us,
                  cells[4].best_us, cells[5].best_us, cells[6].best_us,
                  cells[0].best_us / cells[2].best_us, cells[3].best_us / cells[5].best_us,
                  bad_all ? "  WRONG RESULTS" : "");
    heap.deallocate(h_ar, n * 4);
    heap.deallocate(h_all, n * 4);
    heap.deallocate(h_part, part * 4);
    heap.deallocate(h_in, n * 4);
    if (bad_all) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"parts_bench: dtrain's reduce_scatter and allgather against MPI on one node"};
  app.add_option("--min-kib", o.min_kib, "smallest vector in KiB")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-kib", o.max_kib, "largest vector in KiB")->check(CLI::Range(1, 1 << 22));
  app.add_option("-f", o.factor, "size step factor")->check(CLI::Range(2, 1024));
  app.add_option("-n", o.iters, "timed calls per round")->check(CLI::Range(1, 1000000));
  app.add_option("-w", o.warmup, "warm-up calls per cell")->check(CLI::Range(0, 1000000));
  app.add_option("-R", o.rounds, "interleaved rounds")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
    if (o.min_kib > o.max_kib) throw CLI::ValidationError("--min-kib", "above --max-kib");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 1;
  try {
    rc = run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parts_bench: %s\n", e.what());
  }
  MPI_Finalize();
  return rc;
}
