// The node-shared heap (SharedSegmentConfig::heap_bytes, Communicator::shared_allocator) and the
// shm all-reduce reading buffers there in place (algo/shm.hpp):
// - the allocator: blocks inside the heap, aligned, zeroed, disjoint, reused after freeing (freed
//   neighbours merge), the fallback when full or without a heap, and concurrent use;
// - the all-reduce (shm, and ordered_shm with the rank-order bits of ordered): exact sums and
//   bit-identical averages against buffers in private memory, with
//   every rank's buffers in the heap (each call then runs whole from the heaps, no slot copies)
//   or only some ranks' (the slot path, each rank lending what lies in its heap), in place and
//   out of place, over more chunks than slots; each rank counts the chunks it lent and the calls
//   run whole;
// - a rank that lent its buffers returns only when the others have read them: every rank
//   overwrites its buffer as soon as its call returns, and no rank may see those values;
// - the same for hier and hier_leader inside each node of several (even and uneven nodes, a
//   node of one rank), with shared_allocator() the node's heap there.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/shared_heap.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_shared_heap_test {

using namespace dtrain;

namespace {

// Counts what it hands out, so a test can see which requests reached the fallback.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    ++allocations;
    return host.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    ++deallocations;
    host.deallocate(p, bytes);
  }
  Space space() const noexcept override { return Space::host; }
  HostAllocator host;
  int allocations = 0, deallocations = 0;
};

SharedSegmentConfig heap_config(std::size_t heap_bytes) {
  SharedSegmentConfig c;
  c.slot_bytes = 64 * 1024;  // chunks placed by offset (the heap path needs the descriptor line)
  c.slots = 2;
  c.heap_bytes = heap_bytes;
  return c;
}

// Small integers, so that every order of summation gives the exact value.
float small_value(std::size_t i, int rank, int call) {
  return static_cast<float>(
      (i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(call)) % 101);
}

// Elements of y that are not the sum over p ranks of small_value(i, rank, call).
std::size_t wrong_sums(const float* y, std::size_t n, int p, int call) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int q = 0; q < p; ++q) want += small_value(i, q, call);
    bad += y[i] != want;
  }
  return bad;
}

// A communicator that waits long enough for ranks that share 2 cores with others.
CommConfig patient() {
  CommConfig c;
  c.timeout_s = 60;
  return c;
}

// Three sums of small_value on n floats from `a` (in place or out of place) with `algo`, each
// checked (wrong sums are added to `failures` under `m`); returns the chunks this rank lent for
// the others to read in place meanwhile.
template <class Comm>
std::uint64_t three_exact_sums(Comm& comm, LoopbackTransport& t, Allocator& a, std::size_t n,
                               bool inplace, AllreduceAlgorithm algo, std::mutex& m,
                               std::vector<std::string>& failures) {
  const int r = t.rank(), p = t.size();
  auto* x = static_cast<float*>(a.allocate(n * sizeof(float), 64));
  auto* y = inplace ? x : static_cast<float*>(a.allocate(n * sizeof(float), 64));
  SharedSegments* seg = node_segments_of(t);
  const std::uint64_t lent_before = seg ? seg->direct_chunks : 0;
  for (int call = 0; call < 3; ++call) {
    for (std::size_t i = 0; i < n; ++i) x[i] = small_value(i, r, call);
    comm.allreduce(BufferView(x, n, DType::f32), BufferView(y, n, DType::f32), ReduceOp::sum, algo);
    if (const std::size_t bad = wrong_sums(y, n, p, call)) {
      std::lock_guard<std::mutex> lock(m);
      failures.push_back("rank " + std::to_string(r) + " call " + std::to_string(call) + ": " +
                         std::to_string(bad) + " wrong sums");
    }
  }
  if (!inplace) a.deallocate(y, n * sizeof(float));
  a.deallocate(x, n * sizeof(float));
  return (seg ? seg->direct_chunks : 0) - lent_before;
}

}  // namespace

TEST_CASE("shared heap allocator: blocks inside, aligned, zeroed, disjoint, reused, fallback") {
  std::vector<unsigned char> mem(1 << 20, 0xAB);
  CountingAllocator fallback;
  SharedHeapAllocator heap(mem.data(), mem.size(), fallback);
  CHECK(heap.capacity() == mem.size());
  CHECK(heap.space() == Space::host);

  struct B {
    void* p;
    std::size_t bytes;
  };
  std::vector<B> blocks;
  for (std::size_t bytes : {std::size_t{100}, std::size_t{70000}, std::size_t{4096},
                            std::size_t{200000}, std::size_t{1}}) {
    for (std::size_t align : {std::size_t{1}, std::size_t{64}, std::size_t{4096}}) {
      void* p = heap.allocate(bytes, align);
      REQUIRE(p != nullptr);
      CHECK(heap.owns(p));
      CHECK(reinterpret_cast<std::uintptr_t>(p) % std::max<std::size_t>(align, 64) == 0);
      const auto* c = static_cast<const unsigned char*>(p);
      CHECK(std::all_of(c, c + bytes, [](unsigned char v) { return v == 0; }));
      CHECK(c >= mem.data());
      CHECK(c + bytes <= mem.data() + mem.size());
      std::memset(p, 0x5C, bytes);
      blocks.push_back({p, bytes});
    }
    if (blocks.size() >= 6) break;  // 6 blocks incl. two of 70000 B; the rest fits later
  }
  // Disjoint.
  std::vector<B> sorted = blocks;
  std::sort(sorted.begin(), sorted.end(), [](const B& a, const B& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    CHECK(static_cast<unsigned char*>(sorted[i - 1].p) + sorted[i - 1].bytes <=
          static_cast<unsigned char*>(sorted[i].p));
  // Large blocks are staggered within a page, each one other than the one before.
  CHECK(reinterpret_cast<std::uintptr_t>(blocks[3].p) % 4096 !=
        reinterpret_cast<std::uintptr_t>(blocks[4].p) % 4096);
  CHECK(fallback.allocations == 0);
  CHECK(heap.used() > 0);

  // Too large for what is left: the fallback serves it, and takes it back.
  void* big = heap.allocate(mem.size(), 64);
  CHECK_FALSE(heap.owns(big));
  CHECK(fallback.allocations == 1);
  heap.deallocate(big, mem.size());
  CHECK(fallback.deallocations == 1);

  // Freed in an order that leaves holes first, then merges them: at the end one block of
  // almost the whole heap fits again.
  for (std::size_t i = 0; i < blocks.size(); i += 2) heap.deallocate(blocks[i].p, blocks[i].bytes);
  for (std::size_t i = 1; i < blocks.size(); i += 2) heap.deallocate(blocks[i].p, blocks[i].bytes);
  CHECK(heap.used() == 0);
  void* whole = heap.allocate(mem.size() - 8192, 4096);
  CHECK(heap.owns(whole));
  CHECK(fallback.allocations == 1);
  heap.deallocate(whole, mem.size() - 8192);
  CHECK(heap.allocate(0, 64) == nullptr);
}

namespace {
// This process's resident pages of shared memory (RssShmem), in bytes; -1 where not reported.
long long resident_shared_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "RssShmem: %lld kB", &kib) == 1) break;
  std::fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}
}  // namespace

TEST_CASE(
    "shared heap allocator: a freed large block's pages leave shared memory, not its neighbours") {
  const std::size_t MiB = 1 << 20, size = 8 * MiB;
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* mem = static_cast<unsigned char*>(map);
  {
    CountingAllocator fallback;
    SharedHeapAllocator heap(mem, size, fallback);
    auto* a = static_cast<unsigned char*>(heap.allocate(100, 64));
    auto* b = static_cast<unsigned char*>(heap.allocate(3 * MiB, 64));
    auto* c = static_cast<unsigned char*>(heap.allocate(100, 64));
    auto* small = static_cast<unsigned char*>(heap.allocate(MiB / 2, 64));
    REQUIRE((a && b && c && small));
    std::memset(a, 0x11, 100);
    std::memset(b, 0x22, 3 * MiB);
    std::memset(c, 0x33, 100);
    std::memset(small, 0x44, MiB / 2);
    const long long resident = resident_shared_bytes();
    // A block below kReleaseMinBytes keeps its pages.
    heap.deallocate(small, MiB / 2);
    CHECK(heap.released() == 0);
    heap.deallocate(b, 3 * MiB);
    // The whole pages inside b's range (its first and last page may hold a and c).
    CHECK(heap.released() >= 3 * MiB - 2 * 4096);
    CHECK(heap.released() <= 3 * MiB + 4096);
    if (resident >= 0) CHECK(resident - resident_shared_bytes() >= static_cast<long long>(2 * MiB));
    CHECK(std::all_of(a, a + 100, [](unsigned char v) { return v == 0x11; }));
    CHECK(std::all_of(c, c + 100, [](unsigned char v) { return v == 0x33; }));
    // The range is handed out again, zeroed.
    auto* again = static_cast<unsigned char*>(heap.allocate(3 * MiB, 64));
    REQUIRE(again != nullptr);
    CHECK(heap.owns(again));
    CHECK(std::all_of(again, again + 3 * MiB, [](unsigned char v) { return v == 0; }));
    heap.deallocate(again, 3 * MiB);
    heap.deallocate(a, 100);
    heap.deallocate(c, 100);
  }
  ::munmap(map, size);

  // Private memory (a heap in a vector, as the ranks-as-threads tests have) keeps its pages:
  // nothing released, nothing changed.
  std::vector<unsigned char> priv(8 * MiB);
  CountingAllocator fallback;
  SharedHeapAllocator heap(priv.data(), priv.size(), fallback);
  auto* x = static_cast<unsigned char*>(heap.allocate(100, 64));
  auto* y = static_cast<unsigned char*>(heap.allocate(3 * MiB, 64));
  std::memset(x, 0x55, 100);
  std::memset(y, 0x66, 3 * MiB);
  heap.deallocate(y, 3 * MiB);
  CHECK(heap.released() == 0);
  CHECK(std::all_of(x, x + 100, [](unsigned char v) { return v == 0x55; }));
  heap.deallocate(x, 100);
}

TEST_CASE("shared heap allocator without a heap hands every block to the fallback") {
  CountingAllocator fallback;
  SharedHeapAllocator none(nullptr, 1 << 20, fallback);
  CHECK(none.capacity() == 0);
  void* p = none.allocate(1000, 64);
  CHECK_FALSE(none.owns(p));
  CHECK(fallback.allocations == 1);
  none.deallocate(p, 1000);
  CHECK(fallback.deallocations == 1);
}

TEST_CASE("shared heap allocator: concurrent allocate and free keep blocks disjoint") {
  std::vector<unsigned char> mem(4 << 20);
  CountingAllocator fallback;
  SharedHeapAllocator heap(mem.data(), mem.size(), fallback);
  std::mutex m;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        const std::size_t bytes =
            1000 + static_cast<std::size_t>((t * 7919 + round * 104729) % 60000);
        auto* p = static_cast<unsigned char*>(heap.allocate(bytes, 64));
        std::memset(p, t + 1, bytes);
        std::this_thread::yield();
        const bool intact = std::all_of(p, p + bytes, [&](unsigned char v) { return v == t + 1; });
        if (!intact) {
          std::lock_guard<std::mutex> lock(m);
          failures.push_back("thread " + std::to_string(t) + " round " + std::to_string(round) +
                             ": its block was overwritten by another");
        }
        heap.deallocate(p, bytes);
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(heap.used() == 0);
}

TEST_CASE("shared_allocator is the heap where the ranks share one, else host memory") {
  {
    LoopbackWorld world(2, heap_config(1 << 20));
    run_loopback(world, [&](LoopbackTransport& t) {
      Communicator comm(t);
      auto* h = dynamic_cast<SharedHeapAllocator*>(&comm.shared_allocator());
      REQUIRE(h != nullptr);
      CHECK(h->capacity() == (1u << 20));
      void* p = h->allocate(1000, 64);
      CHECK(h->owns(p));
      // The block lies in this rank's own part of the node's memory.
      CHECK(shared_segments_of(t)->in_own_heap(p, 1000));
      h->deallocate(p, 1000);
    });
  }
  {
    LoopbackWorld world(2, heap_config(0));  // no heap configured
    run_loopback(world, [&](LoopbackTransport& t) {
      Communicator comm(t);
      CHECK(&comm.shared_allocator() == &default_allocator());
    });
  }
  {
    LoopbackWorld world(std::vector<int>{0, 1}, heap_config(1 << 20));  // two nodes of one
    run_loopback(world, [&](LoopbackTransport& t) {
      Communicator comm(t);
      CHECK(&comm.shared_allocator() == &default_allocator());
    });
  }
  {
    // Several nodes: the node's heap for a rank that shares its node, host memory for one alone.
    LoopbackWorld world(std::vector<int>{0, 0, 1}, heap_config(1 << 20));
    run_loopback(world, [&](LoopbackTransport& t) {
      Communicator comm(t);
      auto* h = dynamic_cast<SharedHeapAllocator*>(&comm.shared_allocator());
      if (t.rank() < 2) {
        REQUIRE(h != nullptr);
        void* p = h->allocate(1000, 64);
        CHECK(node_segments_of(t)->in_own_heap(p, 1000));
        h->deallocate(p, 1000);
      } else {
        CHECK(h == nullptr);
      }
    });
  }
}

TEST_CASE(
    "shm and ordered_shm on heap buffers: exact sums, in and out of place, every or some ranks") {
  // which[r]: whether rank r's buffers come from its heap.
  const std::vector<std::vector<bool>> layouts = {{true, true},         {true, false},
                                                  {false, true},        {true, true, true},
                                                  {false, true, false}, {true, false, true, true}};
  for (const auto& which : layouts)
    for (AllreduceAlgorithm algo : {AllreduceAlgorithm::shm, AllreduceAlgorithm::ordered_shm})
      for (bool inplace : {false, true}) {
        const int p = static_cast<int>(which.size());
        CAPTURE(name_of(algo));
        CAPTURE(p);
        CAPTURE(inplace);
        CAPTURE(which[0]);
        CAPTURE(which[1]);
        // 7 chunks of a 64 KiB slot, 2 slots: every slot reused; and 4000 bytes, one hand-off
        // (small_call) unless every rank is in its heap.
        for (const std::size_t n : {std::size_t{100003}, std::size_t{1000}}) {
          CAPTURE(n);
          const std::uint64_t chunks = n > 1000 ? 7 : 1;
          LoopbackWorld world(p, heap_config(4 << 20));
          std::mutex m;
          std::vector<std::string> failures;
          run_loopback(world, [&](LoopbackTransport& t) {
            Communicator comm(t, patient());
            const int r = t.rank();
            Allocator& a =
                which[static_cast<std::size_t>(r)] ? comm.shared_allocator() : default_allocator();
            const SharedSegments& seg = *node_segments_of(t);
            const std::uint64_t whole_before = seg.whole_calls, one_before = seg.one_shot_calls;
            const std::uint64_t lent = three_exact_sums(comm, t, a, n, inplace, algo, m, failures);
            const std::uint64_t whole = seg.whole_calls - whole_before;
            const std::uint64_t one_shot = seg.one_shot_calls - one_before;
            {
              std::lock_guard<std::mutex> lock(m);
              // Every rank in its heap: each call runs whole from the heaps (one chunk each);
              // otherwise the heap ranks lend every chunk of the slot path, or their input to a
              // small call, which runs in one hand-off.
              const bool all = std::count(which.begin(), which.end(), true) == p;
              const bool small = chunks == 1;
              const std::uint64_t want = all                                  ? 3
                                         : which[static_cast<std::size_t>(r)] ? 3 * chunks
                                                                              : 0;
              if (lent != want)
                failures.push_back("rank " + std::to_string(r) + " lent " + std::to_string(lent) +
                                   " chunks in place, expected " + std::to_string(want));
              if (whole != (all ? 3u : 0u))
                failures.push_back("rank " + std::to_string(r) + " ran " + std::to_string(whole) +
                                   " calls whole from the heaps, expected " +
                                   std::to_string(all ? 3 : 0));
              if (one_shot != (small && !all ? 3u : 0u))
                failures.push_back("rank " + std::to_string(r) + " ran " +
                                   std::to_string(one_shot) + " calls in one hand-off, expected " +
                                   std::to_string(small && !all ? 3 : 0));
            }
          });
          for (const auto& f : failures) FAIL_CHECK(f);
        }
      }
}

namespace {

// Ranks of node_of[r]'s node.
int node_size(const std::vector<int>& node_of, int r) {
  return static_cast<int>(
      std::count(node_of.begin(), node_of.end(), node_of[static_cast<std::size_t>(r)]));
}

// `algo` on node_of's nodes, each rank averaging the same values once from its heap, and `ref`
// (by default `algo`) once from private memory: every rank's two results are bit for bit rank 0's
// private one.
void check_averages_bit_identical(const std::vector<int>& node_of, AllreduceAlgorithm algo,
                                  std::size_t n,
                                  AllreduceAlgorithm ref = AllreduceAlgorithm::automatic) {
  if (ref == AllreduceAlgorithm::automatic) ref = algo;
  const int p = static_cast<int>(node_of.size());
  LoopbackWorld world(node_of, heap_config(4 << 20));
  std::vector<std::vector<float>> via_heap(p), via_host(p);
  run_loopback(world, [&](LoopbackTransport& t) {
    Communicator comm(t, patient());
    const int r = t.rank();
    // Values whose sums round: any other order of the reduction would change bits.
    std::vector<float> data(n);
    std::uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r + 1);
    for (auto& v : data) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      v = static_cast<float>(static_cast<double>(s % 1000003) / 977.0 - 500.0);
    }
    Allocator& h = comm.shared_allocator();
    auto* x = static_cast<float*>(h.allocate(n * sizeof(float), 64));
    std::copy(data.begin(), data.end(), x);
    std::vector<float> y = data;
    comm.allreduce(BufferView(x, n, DType::f32), ReduceOp::avg, algo);
    comm.allreduce(BufferView(y.data(), n, DType::f32), ReduceOp::avg, ref);
    via_heap[static_cast<std::size_t>(r)].assign(x, x + n);
    via_host[static_cast<std::size_t>(r)] = y;
    h.deallocate(x, n * sizeof(float));
  });
  for (int r = 0; r < p; ++r) {
    CAPTURE(r);
    CHECK(std::memcmp(via_heap[static_cast<std::size_t>(r)].data(), via_host[0].data(),
                      n * sizeof(float)) == 0);
    CHECK(std::memcmp(via_host[static_cast<std::size_t>(r)].data(), via_host[0].data(),
                      n * sizeof(float)) == 0);
  }
}

// `algo` on node_of's nodes, `calls` times on heap buffers, every rank overwriting its buffer
// with -1 the moment its call returns (as a training loop's next backward pass would). A rank
// that returned while another was still reading its part would hand that rank -1s. Unequal work
// per rank between calls makes the ranks drift apart.
void check_overwrite_on_return(const std::vector<int>& node_of, AllreduceAlgorithm algo,
                               std::size_t n, int calls) {
  const int p = static_cast<int>(node_of.size());
  LoopbackWorld world(node_of, heap_config(2 << 20));
  std::mutex m;
  std::vector<std::string> failures;
  run_loopback(world, [&](LoopbackTransport& t) {
    Communicator comm(t, patient());
    const int r = t.rank();
    Allocator& h = comm.shared_allocator();
    auto* x = static_cast<float*>(h.allocate(n * sizeof(float), 64));
    for (int call = 0; call < calls; ++call) {
      for (std::size_t i = 0; i < n; ++i) x[i] = small_value(i, r, call);
      comm.allreduce(BufferView(x, n, DType::f32), ReduceOp::sum, algo);
      const std::size_t bad = wrong_sums(x, n, p, call);
      std::fill(x, x + n, -1.0f);
      if (bad) {
        std::lock_guard<std::mutex> lock(m);
        failures.push_back("rank " + std::to_string(r) + " call " + std::to_string(call) + ": " +
                           std::to_string(bad) + " wrong elements");
      }
      if ((call + r) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    h.deallocate(x, n * sizeof(float));
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

}  // namespace

TEST_CASE("hier and hier_leader on heap buffers: exact sums on even and uneven nodes") {
  struct Layout {
    std::vector<int> node_of;
    std::vector<bool> which;  // whether rank r's buffers come from its heap
  };
  const std::vector<Layout> layouts = {{{0, 0, 1, 1}, {true, true, true, true}},
                                       {{0, 0, 1, 1}, {true, false, false, true}},
                                       {{0, 0, 0, 1}, {true, false, true, true}},
                                       {{0, 1, 1, 1}, {true, true, true, false}}};
  const std::size_t n = 100003;  // 7 chunks of a 64 KiB slot, 2 slots: every slot reused
  const std::uint64_t chunks = 7;
  for (const auto& lay : layouts)
    for (AllreduceAlgorithm algo : {AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader})
      for (bool inplace : {false, true}) {
        CAPTURE(name_of(algo));
        CAPTURE(inplace);
        CAPTURE(lay.node_of[1]);
        CAPTURE(lay.node_of[2]);
        CAPTURE(lay.which[1]);
        LoopbackWorld world(lay.node_of, heap_config(4 << 20));
        std::mutex m;
        std::vector<std::string> failures;
        run_loopback(world, [&](LoopbackTransport& t) {
          Communicator comm(t, patient());
          const int r = t.rank();
          const bool heap = lay.which[static_cast<std::size_t>(r)];
          Allocator& a = heap ? comm.shared_allocator() : default_allocator();
          const std::uint64_t lent = three_exact_sums(comm, t, a, n, inplace, algo, m, failures);
          // hier lends its input (reduce-scatter, out of place only) and its output (all-gather)
          // chunk by chunk; hier_leader the non-leaders' inputs (reduce, out of place only) and
          // the leader's output (broadcast).
          const bool leader = std::find(lay.node_of.begin(), lay.node_of.end(),
                                        lay.node_of[static_cast<std::size_t>(r)]) -
                                  lay.node_of.begin() ==
                              r;
          const std::uint64_t per_call = algo == AllreduceAlgorithm::hier
                                             ? (inplace ? chunks : 2 * chunks)
                                             : (inplace && !leader ? 0 : chunks);
          const std::uint64_t want = heap && node_size(lay.node_of, r) > 1 ? 3 * per_call : 0;
          if (lent != want) {
            std::lock_guard<std::mutex> lock(m);
            failures.push_back("rank " + std::to_string(r) + " lent " + std::to_string(lent) +
                               " chunks in place, expected " + std::to_string(want));
          }
        });
        for (const auto& f : failures) FAIL_CHECK(f);
      }
}

TEST_CASE("shm on heap buffers: averages bit-identical to buffers in private memory") {
  // Every rank in its heap: the whole-call path (2 ranks: one fused pass; more: in pieces). In
  // private memory: the slot path, and below 4 KiB the one-hand-off path (small_call), whose
  // whole-vector sums must keep each part's order.
  for (int p : {2, 3, 4})
    for (std::size_t n : {std::size_t{70001}, std::size_t{1024}, std::size_t{7}}) {
      CAPTURE(p);
      CAPTURE(n);
      check_averages_bit_identical(std::vector<int>(static_cast<std::size_t>(p), 0),
                                   AllreduceAlgorithm::shm, n);
    }
}

TEST_CASE("ordered_shm on heap buffers: the rank-order bits of ordered on private memory") {
  // Summed in place in each owner's heap, the result is still x_0 + x_1 + ... in rank order:
  // the bits of the message-based ordered algorithm. The second call swaps the two: ordered on
  // the heap buffers, ordered_shm on private memory (below 4 KiB its one-hand-off path).
  for (int p : {2, 3, 4})
    for (std::size_t n : {std::size_t{70001}, std::size_t{1024}, std::size_t{7}}) {
      CAPTURE(p);
      CAPTURE(n);
      const std::vector<int> one_node(static_cast<std::size_t>(p), 0);
      check_averages_bit_identical(one_node, AllreduceAlgorithm::ordered_shm, n,
                                   AllreduceAlgorithm::ordered);
      check_averages_bit_identical(one_node, AllreduceAlgorithm::ordered, n,
                                   AllreduceAlgorithm::ordered_shm);
    }
}

TEST_CASE("shm and ordered_shm on heap buffers: a rank returns only once the others read them") {
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::shm, AllreduceAlgorithm::ordered_shm})
    for (int p : {2, 3}) {
      CAPTURE(name_of(algo));
      CAPTURE(p);
      for (std::size_t n : {std::size_t{40000}, std::size_t{1000}})
        check_overwrite_on_return(std::vector<int>(static_cast<std::size_t>(p), 0), algo, n, 60);
    }
}

TEST_CASE("hier and hier_leader on heap buffers: averages bit-identical to private memory") {
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader}) {
    CAPTURE(name_of(algo));
    check_averages_bit_identical({0, 0, 0, 1, 1}, algo, 70001);
  }
}

TEST_CASE("hier and hier_leader on heap buffers: a rank returns only once its node has read them") {
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader}) {
    CAPTURE(name_of(algo));
    check_overwrite_on_return({0, 0, 0, 1}, algo, 40000, 40);
  }
}

}  // namespace dtrain_test_comm_shared_heap_test
