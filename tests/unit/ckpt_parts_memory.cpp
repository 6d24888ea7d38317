// The memory of a checkpoint save and restore of a tensor held in parts over thread ranks,
// counted with a replaced global operator new: rank 0's write to the run directory stores each
// rank's parts as they stream in, and with levels every rank writes its own node-local part file
// and sends it to its partner, so the bytes the save allocates stay at one piece of the stream or
// transfer, far below the whole tensor that assembling it would allocate. The restore loads each
// rank's parts only (from its part file, or from the one file by rank 0's pieces), within the
// same kind of bound, and gives the values back exactly. The file holds the whole tensor: read
// back (every checksum checked) and compared element by element with the values the ranks held.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include <dtrain/ckpt/hdf5.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

// The replacement pairs malloc with free on purpose.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
// Live and peak bytes allocated through operator new by every thread (a size header per block).
std::atomic<long long> g_live{0}, g_peak{0};
void* counted(std::size_t n) {
  void* p = std::malloc(n + 16);
  if (!p) throw std::bad_alloc();
  std::memcpy(p, &n, sizeof n);
  const long long now = g_live.fetch_add(static_cast<long long>(n)) + static_cast<long long>(n);
  long long peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return static_cast<char*>(p) + 16;
}
void uncounted(void* q) noexcept {
  if (!q) return;
  void* p = static_cast<char*>(q) - 16;
  std::size_t n;
  std::memcpy(&n, p, sizeof n);
  g_live.fetch_sub(static_cast<long long>(n));
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p); }
// The nothrow forms too (std::stable_sort's temporary buffer): every block the replaced deletes
// free must carry the size header.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { uncounted(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { uncounted(p); }

namespace dtrain_test_ckpt_parts_memory {

using namespace dtrain;
namespace fs = std::filesystem;
using LoopComm = Communicator<LoopbackTransport>;

namespace {

constexpr std::size_t whole_n = std::size_t{8} << 20;  // floats: 32 MiB whole

// A state of one tensor held in parts: rank r of p holds elements [r n / p, (r + 1) n / p) with
// value f(i) = i * 0.5 - 7 (exact in float up to 2^24).
struct PartsState {
  std::vector<float> held;
  Shape whole{static_cast<std::int64_t>(whole_n / 1024), 1024};
  StateParts parts;
  template <class V>
  void visit_state(V& v) {
    v.tensor_parts("m", BufferView(held.data(), held.size(), DType::f32), whole, parts);
  }
};

float value(std::size_t i) { return static_cast<float>(i) * 0.5f - 7.0f; }

}  // namespace

TEST_CASE("a save of a tensor held in parts allocates a piece, not the whole tensor") {
  const std::string base =
      (fs::temp_directory_path() / ("dtrain_ckpt_parts_mem_" + std::to_string(::getpid())))
          .string();
  fs::remove_all(base);
  const int p = 2;
  // The verification of a copy (partner transfer, flush) reads in pieces of this size.
  detail::ckpt_h5::read_piece_bytes() = std::size_t{1} << 20;
  for (bool levels : {false, true}) {
    CAPTURE(levels);
    const std::string dir = base + (levels ? "/run_levels" : "/run");
    std::vector<PartsState> states(p);
    for (int r = 0; r < p; ++r) {
      auto& s = states[static_cast<std::size_t>(r)];
      const std::size_t lo = whole_n * r / p, hi = whole_n * (r + 1) / p;
      s.parts = {{lo, hi - lo}};
      s.held.resize(hi - lo);
      for (std::size_t i = lo; i < hi; ++i) s.held[i - lo] = value(i);
    }
    long long before = 0, peak = 0, restore_before = 0, restore_peak = 0;
    std::vector<std::int64_t> restored(p, 0);
    std::vector<CheckpointLevel> levels_used(p);
    run_loopback(p, [&](LoopbackTransport& t) {
      CommConfig c;
      c.timeout_s = 60;
      LoopComm comm(t, c);
      CheckpointOptions o;
      o.read_env = false;
      if (levels) {
        o.levels.local_dir = base + "/node" + std::to_string(t.rank());  // ranks are nodes
        o.levels.node = t.rank();
        o.levels.local_every = 1;
        o.levels.shared_every = 1;
        o.levels.transfer_timeout_seconds = 30;
      }
      Checkpointer<LoopComm> ckpt(comm, dir, o);
      comm.barrier();
      if (t.rank() == 0) {
        before = g_live.load();
        g_peak.store(before);
      }
      comm.barrier();
      ckpt.save(5, named("opt", states[static_cast<std::size_t>(t.rank())]));
      ckpt.wait();
      comm.barrier();
      if (t.rank() == 0) peak = g_peak.load();
      comm.barrier();
      // The restore into the parts, zeroed first: from each rank's node-local part file (levels),
      // or from the one file, rank 0 reading each rank's parts and sending them a piece at a time.
      auto& s = states[static_cast<std::size_t>(t.rank())];
      std::fill(s.held.begin(), s.held.end(), 0.0f);
      comm.barrier();
      if (t.rank() == 0) {
        restore_before = g_live.load();
        g_peak.store(restore_before);
      }
      comm.barrier();
      Checkpointer<LoopComm> in(comm, dir, o);
      restored[static_cast<std::size_t>(t.rank())] =
          in.restore_latest(named("opt", s)).value_or(-1);
      levels_used[static_cast<std::size_t>(t.rank())] = in.restored_level();
      comm.barrier();
      if (t.rank() == 0) restore_peak = g_peak.load();
      comm.barrier();
    });
    const long long whole_b = static_cast<long long>(whole_n * sizeof(float));
    const long long extra = peak - before;
    MESSAGE("save allocated at most " << extra << " B over the held parts; whole tensor " << whole_b
                                      << " B");
    // The bounded buffers (the ranks are threads of this process, so their buffers add up): one
    // piece of the stream, a file transfer's chunk at both ends (partner copy), one piece of a
    // verification, and bookkeeping. Assembling would allocate the whole tensor on top.
    const std::size_t bounded = detail::kAssemblePieceBytes +
                                (levels ? 2 * detail::kCkptChunk : 0) +
                                detail::ckpt_h5::read_piece_bytes() + (std::size_t{1} << 20);
    CHECK(extra <= static_cast<long long>(bounded));
    REQUIRE(static_cast<long long>(bounded) < whole_b);

    // The restore: each rank's parts back, exactly, with bounded buffers (the verification's
    // pieces of every rank, rank 0's read pieces and a piece of the broadcasts at each other rank).
    const long long restore_extra = restore_peak - restore_before;
    MESSAGE("restore allocated at most " << restore_extra << " B over the held parts");
    const std::size_t restore_bounded = 2 * detail::kRestorePieceBytes +
                                        p * detail::ckpt_h5::read_piece_bytes() +
                                        (std::size_t{1} << 20);
    CHECK(restore_extra <= static_cast<long long>(restore_bounded));
    REQUIRE(static_cast<long long>(restore_bounded) < whole_b);
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const auto& s = states[static_cast<std::size_t>(r)];
      CHECK(restored[static_cast<std::size_t>(r)] == 5);
      CHECK(levels_used[static_cast<std::size_t>(r)] ==
            (levels ? CheckpointLevel::local : CheckpointLevel::none));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < s.held.size(); ++i)
        wrong += s.held[i] != value(s.parts[0].first + i) ? 1 : 0;
      CHECK(wrong == 0);
    }

    // The file (the shared level's, after the flush) holds the whole tensor.
    const auto m = Hdf5Format::read(dir + "/ckpt-000000000005.h5");
    bool found = false;
    for (const auto& e : m.entries)
      if (e.path == "/opt/m") {
        found = true;
        REQUIRE(e.shape == Shape{static_cast<std::int64_t>(whole_n / 1024), 1024});
        const auto* f = static_cast<const float*>(e.data);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < whole_n; ++i) wrong += f[i] != value(i) ? 1 : 0;
        CHECK(wrong == 0);
      }
    CHECK(found);
  }
  detail::ckpt_h5::read_piece_bytes() = std::size_t{16} << 20;
  fs::remove_all(base);
}

}  // namespace dtrain_test_ckpt_parts_memory
