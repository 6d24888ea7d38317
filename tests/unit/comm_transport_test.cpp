// The transport seam: capabilities are detected and consulted (registration, device memory),
// forwarded through AnyTransport, and plans bind persistent channels once and only start them.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <dtrain/comm/any_transport.hpp>
#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_transport_test {

using namespace dtrain;

namespace {

// A loopback rank that declares capabilities and checks that the communicator honours them:
// with Registration every message must lie inside a live registered region (else it counts a
// violation), and every registration must be released again.
template <bool Registration, bool Device>
class CheckingTransport {
 public:
  using Request = LoopbackTransport::Request;
  static constexpr bool requires_registration = Registration;
  static constexpr bool supports_device_memory = Device;

  explicit CheckingTransport(LoopbackTransport& t) : t_(&t) {}
  int rank() const { return t_->rank(); }
  int size() const { return t_->size(); }
  void isend(Request& r, int peer, int tag, const void* d, std::size_t b) {
    check(d, b);
    ++direct_posts;
    t_->isend(r, peer, tag, d, b);
  }
  void irecv(Request& r, int peer, int tag, void* d, std::size_t b) {
    check(d, b);
    ++direct_posts;
    t_->irecv(r, peer, tag, d, b);
  }
  bool test(Request& r) { return t_->test(r); }
  bool wait_until(Request& r, const Deadline& d) { return t_->wait_until(r, d); }
  void cancel(Request& r) noexcept { t_->cancel(r); }
  MemoryRegion register_memory(void* p, std::size_t b, Space s) {
    ++registrations;
    spaces.push_back(s);
    live.push_back({static_cast<unsigned char*>(p), b});
    return MemoryRegion{p, b, s, ++next_key_, nullptr};
  }
  void deregister_memory(MemoryRegion& m) noexcept {
    auto it = std::find(live.begin(), live.end(),
                        std::make_pair(static_cast<unsigned char*>(m.data), m.bytes));
    if (it != live.end()) live.erase(it);
  }

  void check(const void* d, std::size_t b) {
    if (!Registration) return;
    const auto* p = static_cast<const unsigned char*>(d);
    for (auto& [base, bytes] : live)
      if (p >= base && p + b <= base + bytes) return;
    ++violations;
  }

  long registrations = 0, violations = 0, direct_posts = 0;
  std::vector<Space> spaces;
  std::vector<std::pair<unsigned char*, std::size_t>> live;

 protected:
  LoopbackTransport* t_;
  std::uint64_t next_key_ = 0;
};

// The same with persistent channels, recording every bind and start.
class ChannelTransport : public CheckingTransport<true, false> {
 public:
  struct Channel {
    LoopbackTransport::Channel c;
    std::uint64_t key = 0;
  };
  using CheckingTransport::CheckingTransport;
  Channel bind_send(int peer, int id, const MemoryRegion& m, std::size_t off, std::size_t b) {
    return bind(true, peer, id, m, off, b);
  }
  Channel bind_recv(int peer, int id, const MemoryRegion& m, std::size_t off, std::size_t b) {
    return bind(false, peer, id, m, off, b);
  }
  void start(Request& r, Channel& c) {
    ++starts;
    t_->start(r, c.c);
  }
  void unbind(Channel& c) noexcept {
    ++unbinds;
    t_->unbind(c.c);
  }

  long binds = 0, starts = 0, unbinds = 0, bad_regions = 0;
  std::set<std::tuple<bool, int, int>> ids;  // (send, peer, id) of the plan being built
  long duplicate_ids = 0;

 private:
  Channel bind(bool send, int peer, int id, const MemoryRegion& m, std::size_t off, std::size_t b) {
    ++binds;
    if (m.key == 0 || off + b > m.bytes) ++bad_regions;  // not a region from register_memory
    check(static_cast<unsigned char*>(m.data) + off, b);
    if (!ids.insert({send, peer, id}).second) ++duplicate_ids;
    Channel c;
    c.key = m.key;
    c.c = send ? t_->bind_send(peer, id, m, off, b) : t_->bind_recv(peer, id, m, off, b);
    return c;
  }
};

static_assert(transport_capabilities<CheckingTransport<true, false>>::requires_registration, "");
static_assert(!transport_capabilities<CheckingTransport<false, true>>::requires_registration, "");
static_assert(transport_capabilities<CheckingTransport<false, true>>::supports_device_memory, "");
static_assert(!detail::has_channels<CheckingTransport<true, false>>::value, "");
static_assert(detail::has_channels<ChannelTransport>::value, "");
static_assert(detail::has_channels<LoopbackTransport>::value, "");

CommConfig quick(bool persistent = true) {
  CommConfig c;
  c.timeout_s = 30;
  c.segment_bytes = 256;
  c.persistent_channels = persistent;
  return c;
}

// Every collective once on `comm`, checked against the obvious answers; returns failures.
template <class T>
int run_all(Communicator<T>& comm) {
  const int p = comm.size(), r = comm.rank();
  int bad = 0;
  for (auto algo : {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
                    AllreduceAlgorithm::rd}) {
    std::vector<float> x(1000, static_cast<float>(r + 1));
    comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, algo);
    for (float v : x) bad += v != static_cast<float>(p * (p + 1) / 2);
    std::vector<half> h(301, half(static_cast<float>(r + 1)));
    comm.allreduce(BufferView(h.data(), h.size(), DType::f16), ReduceOp::avg, algo);
    for (half v : h) bad += static_cast<float>(v) != static_cast<float>(p + 1) / 2;
  }
  std::vector<double> in(777, r), part(partition_count(777, p, r));
  comm.reduce_scatter(BufferView(span<double>(in)), BufferView(span<double>(part)), ReduceOp::max);
  for (double v : part) bad += v != p - 1;
  std::vector<double> all(777);
  comm.allgather(BufferView(span<double>(part)), BufferView(span<double>(all)));
  for (double v : all) bad += v != p - 1;
  std::vector<std::int64_t> b(500, r == 1 ? 42 : 0);
  comm.broadcast(BufferView(span<std::int64_t>(b)), 1);
  for (auto v : b) bad += v != 42;
  return bad;
}

}  // namespace

TEST_CASE("a transport that requires registration only ever sees registered memory") {
  std::mutex m;
  long violations = 0, registrations = 0, left = 0, failures = 0;
  run_loopback(3, [&](LoopbackTransport& lt) {
    CheckingTransport<true, false> t(lt);
    {
      Communicator<CheckingTransport<true, false>> comm(t, quick());
      const int bad = run_all(comm);
      comm.cost_model();  // the calibration registers its buffers too
      std::lock_guard<std::mutex> lock(m);
      failures += bad;
    }
    std::lock_guard<std::mutex> lock(m);
    violations += t.violations;
    registrations += t.registrations;
    left += static_cast<long>(t.live.size());
  });
  CHECK(failures == 0);
  CHECK(violations == 0);
  CHECK(registrations > 0);
  CHECK(left == 0);  // every plan deregistered what it registered
}

TEST_CASE("without requires_registration a plan registers nothing") {
  std::atomic<long> registrations{0};
  std::atomic<int> failures{0};
  run_loopback(2, [&](LoopbackTransport& lt) {
    CheckingTransport<false, false> t(lt);
    Communicator<CheckingTransport<false, false>> comm(t, quick());
    failures += run_all(comm);
    registrations += t.registrations;
  });
  CHECK(failures == 0);
  CHECK(registrations == 0);
}

TEST_CASE("plans bind persistent channels at construction and only start them afterwards") {
  std::mutex m;
  std::vector<std::string> problems;
  run_loopback(3, [&](LoopbackTransport& lt) {
    ChannelTransport t(lt);
    auto note = [&](const std::string& s) {
      std::lock_guard<std::mutex> lock(m);
      problems.push_back("rank " + std::to_string(t.rank()) + ": " + s);
    };
    {
      Communicator<ChannelTransport> comm(t, quick());
      std::vector<float> x(3000, 1.0f);
      for (auto algo : {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
                        AllreduceAlgorithm::rd}) {
        t.ids.clear();
        const long b0 = t.binds, s0 = t.starts;
        auto plan = comm.plan_allreduce(BufferView(span<float>(x)), BufferView(span<float>(x)),
                                        ReduceOp::sum, algo);
        const long bound = t.binds - b0;
        if (bound <= 0) note(std::string(name_of(algo)) + ": nothing bound");
        if (t.starts != s0) note(std::string(name_of(algo)) + ": started while planning");
        if (t.duplicate_ids) note(std::string(name_of(algo)) + ": a (peer, id) bound twice");
        std::fill(x.begin(), x.end(), 1.0f);
        plan.execute();
        const long per = t.starts - s0;
        for (int i = 0; i < 2; ++i) {
          std::fill(x.begin(), x.end(), 1.0f);
          plan.execute();
        }
        for (float v : x)
          if (v != 3.0f) {
            note(std::string(name_of(algo)) + ": wrong sum");
            break;
          }
        if (t.binds - b0 != bound) note(std::string(name_of(algo)) + ": bound again on execution");
        if (per <= 0 || t.starts - s0 != 3 * per)
          note(std::string(name_of(algo)) + ": executions started different channel sets");
      }
      if (t.direct_posts != 0) note("isend/irecv used although channels are bound");
      if (t.bad_regions || t.violations) note("a channel bound outside its registered region");
    }
    if (t.unbinds != t.binds) note("channels not all unbound with their plans");
  });
  for (auto& p : problems) MESSAGE(p);
  CHECK(problems.empty());
}

TEST_CASE("CommConfig::persistent_channels off: the two-sided fallback, same results") {
  std::atomic<long> binds{0}, posts{0};
  std::atomic<int> failures{0};
  run_loopback(3, [&](LoopbackTransport& lt) {
    ChannelTransport t(lt);
    Communicator<ChannelTransport> comm(t, quick(false));
    failures += run_all(comm);
    binds += t.binds;
    posts += t.direct_posts;
  });
  CHECK(failures == 0);
  CHECK(binds == 0);
  CHECK(posts > 0);
}

TEST_CASE("AnyTransport forwards capabilities and channels") {
  std::atomic<int> failures{0};
  std::atomic<long> binds{0}, violations{0};
  run_loopback(2, [&](LoopbackTransport& lt) {
    ChannelTransport t(lt);
    AnyTransport any(t);
    CHECK(any.capabilities().requires_registration);
    CHECK(!any.capabilities().supports_device_memory);
    CHECK(channels_available(any));
    AnyTransport plain(lt);
    CHECK(!plain.capabilities().requires_registration);
    CHECK(channels_available(plain));
    Communicator<AnyTransport> comm(any, quick());
    failures += run_all(comm);
    binds += t.binds;
    violations += t.violations + t.bad_regions;
  });
  CHECK(failures == 0);
  CHECK(binds > 0);
  CHECK(violations == 0);
}

TEST_CASE("device buffers: refused without supports_device_memory, broadcast only with it") {
  std::atomic<int> refused_plain{0}, named_capability{0}, broadcast_ok{0}, refused_reduce{0};
  std::atomic<int> device_registrations{0};
  run_loopback(2, [&](LoopbackTransport& lt) {
    std::vector<float> x(64, static_cast<float>(lt.rank()));
    // Host memory labelled as device memory: the checks run before anything is touched.
    BufferView dev(x.data(), x.size(), DType::f32, Space::cuda);
    {
      Communicator<LoopbackTransport> comm(lt, quick());
      try {
        comm.broadcast(dev, 0);
      } catch (const InvalidArgument& e) {
        ++refused_plain;
        if (std::string(e.what()).find("supports_device_memory") != std::string::npos)
          ++named_capability;
      }
    }
    CheckingTransport<true, true> t(lt);
    Communicator<CheckingTransport<true, true>> comm(t, quick());
    comm.broadcast(dev, 0);
    if (std::all_of(x.begin(), x.end(), [](float v) { return v == 0.0f; })) ++broadcast_ok;
    if (std::count(t.spaces.begin(), t.spaces.end(), Space::cuda) > 0) ++device_registrations;
    try {
      comm.allreduce(dev, ReduceOp::sum);
    } catch (const InvalidArgument&) {
      ++refused_reduce;
    }
  });
  CHECK(refused_plain == 2);
  CHECK(named_capability == 2);
  CHECK(broadcast_ok == 2);
  CHECK(device_registrations == 2);
  CHECK(refused_reduce == 2);
}

}  // namespace dtrain_test_comm_transport_test
