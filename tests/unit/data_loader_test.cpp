// Loader: batches equal direct dataset reads in sampler order for every prefetch depth; exact
// resume through a checkpointed sampler; read-ahead discarded on set_epoch; background errors
// rethrown; timeouts; clean shutdown mid-epoch; ranks as threads get disjoint shards.
// InMemoryDataset: capacity, eviction policies, state round trip, concurrent append and read;
// regression pairs (input and target read as a batch without labels) likewise.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <dtrain/core/timer.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/in_memory_dataset.hpp>
#include <dtrain/data/loader.hpp>

#include "unit/data_helpers.hpp"

using namespace dtrain;
using dtrain::test::TempDir;

namespace {

struct Flat {
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  std::vector<std::int64_t> indices;
  bool operator==(const Flat& o) const {
    return features.size() == o.features.size() &&
           std::memcmp(features.data(), o.features.data(), features.size() * 4) == 0 &&
           labels == o.labels && indices == o.indices;
  }
};

Flat flatten(const Batch& b) {
  Flat f;
  auto fs = b.features.as<float>();
  auto ls = b.labels.as<std::int32_t>();
  f.features.assign(fs.begin(), fs.end());
  f.labels.assign(ls.begin(), ls.end());
  f.indices = b.indices;
  return f;
}

template <class D>
std::vector<Flat> run_epoch(D& ds, DistributedSampler& s, std::size_t B, LoaderOptions opt,
                            std::size_t limit = SIZE_MAX) {
  Loader<D> loader(ds, s, B, opt);
  std::vector<Flat> out;
  Batch b;
  while (out.size() < limit && loader.next(b)) out.push_back(flatten(b));
  return out;
}

// Wraps a dataset: counts reads, can sleep or fail at a chosen batch.
template <class D>
struct Instrumented {
  D& inner;
  std::atomic<int> reads{0};
  int fail_at = -1;
  double sleep_s = 0.0;
  std::size_t size() const { return inner.size(); }
  Shape sample_shape() const { return inner.sample_shape(); }
  void read(span<const std::int64_t> idx, span<float> f, span<std::int32_t> l, const Normalize& t) {
    const int k = reads++;
    if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
    if (k == fail_at)
      raise<IoError>("Instrumented::read", "injected failure at read " + std::to_string(k));
    inner.read(idx, f, l, t);
  }
};

}  // namespace

TEST_CASE("loader: batches equal direct reads in sampler order, for every prefetch depth") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 203, 6, 5, false);
  IdxDataset ds(files.images, files.labels);
  const Normalize t = Normalize::from_unit_range(0.3f, 0.4f);
  const std::size_t B = 16;
  // Reference: the sampler's indices read one sample at a time, transformed by hand.
  DistributedSampler ref(ds.size(), 1, 3, 11);
  ref.set_epoch(2);
  std::vector<Flat> expect;
  for (auto idx = ref.next_indices(B); !idx.empty(); ref.advance(B), idx = ref.next_indices(B)) {
    Flat f;
    f.indices = idx;
    // out = raw * a + b with a = scale/stddev, b = -mean/stddev rounded once (Normalize's
    // contract).
    const float a =
        static_cast<float>(static_cast<double>(1.0f / 255.0f) / static_cast<double>(0.4f));
    const float c = static_cast<float>(-static_cast<double>(0.3f) / static_cast<double>(0.4f));
    for (auto i : idx) {
      f.labels.push_back(ds.label(static_cast<std::size_t>(i)));
      for (std::size_t k = 0; k < 30; ++k)
        f.features.push_back(static_cast<float>(ds.image(static_cast<std::size_t>(i))[k]) * a + c);
    }
    expect.push_back(f);
  }
  REQUIRE(expect.size() == 5);  // ceil(ceil(203/3)/16)
  for (std::size_t depth : {0u, 1u, 2u, 5u}) {
    CAPTURE(depth);
    DistributedSampler s(ds.size(), 1, 3, 11);
    s.set_epoch(2);
    LoaderOptions opt;
    opt.prefetch_depth = depth;
    opt.transform = t;
    auto got = run_epoch(ds, s, B, opt);
    CHECK(got == expect);
    CHECK(s.remaining_batches(B) == 0);
    CHECK(run_epoch(ds, s, B, opt).empty());  // nothing left until the epoch changes
  }
}

TEST_CASE("loader: shapes, flattening and the range-for form") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 10, 4, 2, true);
  IdxDataset ds(files.images, files.labels);
  DistributedSampler s(ds.size(), 0, 1, 0);
  LoaderOptions opt;
  opt.flatten = true;
  Loader loader(ds, s, 4, opt);
  std::vector<std::size_t> sizes;
  for (Batch& b : loader) {
    CHECK(b.features.shape() == Shape{static_cast<std::int64_t>(b.size), 8});
    CHECK(b.labels.shape() == Shape{static_cast<std::int64_t>(b.size)});
    CHECK(b.labels.dtype() == DType::i32);
    CHECK(b.number == sizes.size());
    sizes.push_back(b.size);
  }
  CHECK(sizes == std::vector<std::size_t>{4, 4, 2});
  s.set_epoch(1);
  LoaderOptions nested;
  Loader l2(ds, s, 4, nested);
  Batch b;
  REQUIRE(l2.next(b));
  CHECK(b.features.shape() == Shape{4, 4, 2});
  CHECK(b.epoch == 1);
}

TEST_CASE("loader: a checkpoint taken mid-epoch resumes the remaining batches bit for bit") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 500, 7, 3, false);
  IdxDataset ds(files.images, files.labels);
  const std::size_t B = 10;
  for (int w : {1, 2, 3}) {
    for (int r = 0; r < w; ++r) {
      DistributedSampler s(ds.size(), r, w, 5);
      s.set_epoch(1);
      LoaderOptions opt;
      opt.prefetch_depth = 3;
      Loader loader(ds, s, B, opt);
      Batch b;
      for (int k = 0; k < 4; ++k) REQUIRE(loader.next(b));
      // The loader has read ahead, but the sampler records only what was handed over.
      CHECK(s.position() == static_cast<std::uint64_t>(4 * B * w));
      auto state = dtrain::test::save_state(s);
      std::vector<Flat> rest;
      while (loader.next(b)) rest.push_back(flatten(b));

      DistributedSampler s2(ds.size(), r, w, 0);
      dtrain::test::load_state(state, s2);
      s2.set_epoch(1);
      auto resumed = run_epoch(ds, s2, B, opt);
      CHECK(resumed == rest);
    }
  }
}

TEST_CASE("loader: changing the sampler mid-pass discards the read-ahead") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 120, 2, 2, false);
  IdxDataset ds(files.images, files.labels);
  DistributedSampler s(ds.size(), 0, 2, 3);
  LoaderOptions opt;
  opt.prefetch_depth = 4;
  Loader loader(ds, s, 8, opt);
  Batch b;
  REQUIRE(loader.next(b));
  REQUIRE(loader.next(b));
  s.set_epoch(7);  // jump: the next batch must be epoch 7's first
  REQUIRE(loader.next(b));
  DistributedSampler ref(ds.size(), 0, 2, 3);
  ref.set_epoch(7);
  CHECK(b.indices == ref.next_indices(8));
  CHECK(b.epoch == 7);
  CHECK(b.number == 0);
}

TEST_CASE("loader: an error in the background read is rethrown by next()") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 64, 2, 2, false);
  IdxDataset ds(files.images, files.labels);
  for (std::size_t depth : {0u, 2u}) {
    Instrumented<IdxDataset> faulty{ds};
    faulty.fail_at = 2;
    DistributedSampler s(ds.size(), 0, 1, 3);
    LoaderOptions opt;
    opt.prefetch_depth = depth;
    Loader loader(faulty, s, 8, opt);
    Batch b;
    CHECK(loader.next(b));
    CHECK(loader.next(b));
    CHECK_THROWS_WITH_AS(loader.next(b), doctest::Contains("injected failure at read 2"), IoError);
    CHECK(s.position() == 16);  // the failed batch was not consumed
    // The next call retries the same batch (the failure was transient).
    REQUIRE(loader.next(b));
    DistributedSampler ref(ds.size(), 0, 1, 3);
    ref.advance(8);
    ref.advance(8);
    CHECK(b.indices == ref.next_indices(8));
  }
}

TEST_CASE("loader: a batch that does not arrive in time is a TimeoutError; shutdown is clean") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 64, 2, 2, false);
  IdxDataset ds(files.images, files.labels);
  Instrumented<IdxDataset> slow{ds};
  slow.sleep_s = 0.5;
  DistributedSampler s(ds.size(), 2, 4, 3);
  LoaderOptions opt;
  opt.timeout_s = 0.05;
  {
    Loader loader(slow, s, 4, opt);
    Batch b;
    CHECK_THROWS_WITH_AS(loader.next(b), doctest::Contains("not ready after"), TimeoutError);
    const Timer t;
    // Leaves while the background thread is mid-read: waits for that read only.
  }
  CHECK(slow.reads.load() <= 2);
  // Shutdown mid-epoch with batches prefetched and more to come.
  slow.sleep_s = 0.0;
  {
    LoaderOptions fast;
    fast.prefetch_depth = 3;
    Loader loader(ds, s, 2, fast);
    Batch b;
    REQUIRE(loader.next(b));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(s.position() == 8);  // one batch of 2 on each of 4 ranks
}

TEST_CASE("loader: a dataset with collective reads is read in the caller's thread") {
  struct Collective {
    std::thread::id reader;
    std::size_t size() const { return 10; }
    Shape sample_shape() const { return Shape{1}; }
    bool collective_reads() const { return true; }
    void read(span<const std::int64_t> idx, span<float> f, span<std::int32_t> l, const Normalize&) {
      reader = std::this_thread::get_id();
      for (std::size_t i = 0; i < idx.size(); ++i) {
        f[i] = static_cast<float>(idx[i]);
        l[i] = 0;
      }
    }
  } ds;
  DistributedSampler s(10, 0, 1, 1);
  Loader loader(ds, s, 3);  // default prefetch depth 2
  Batch b;
  REQUIRE(loader.next(b));
  CHECK(ds.reader == std::this_thread::get_id());
  CHECK(b.features.as<float>()[0] == static_cast<float>(b.indices[0]));
}

TEST_CASE("loader: ranks as threads sharing one dataset get disjoint shards covering the epoch") {
  TempDir dir;
  auto files = dtrain::test::write_synthetic_idx(dir, "d", 301, 3, 3, false);
  IdxDataset ds(files.images, files.labels);
  const int w = 4;
  std::vector<std::vector<std::int64_t>> got(w);
  std::vector<std::size_t> batches(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] {
      DistributedSampler s(ds.size(), r, w, 8, SamplerOptions{true, SamplerTail::drop, false});
      s.set_epoch(3);
      Loader loader(ds, s, 8);
      Batch b;
      while (loader.next(b)) {
        got[static_cast<std::size_t>(r)].insert(got[static_cast<std::size_t>(r)].end(),
                                                b.indices.begin(), b.indices.end());
        ++batches[static_cast<std::size_t>(r)];
      }
    });
  for (auto& t : threads) t.join();
  std::set<std::int64_t> all;
  std::size_t total = 0;
  for (int r = 0; r < w; ++r) {
    CHECK(batches[static_cast<std::size_t>(r)] == batches[0]);
    all.insert(got[static_cast<std::size_t>(r)].begin(), got[static_cast<std::size_t>(r)].end());
    total += got[static_cast<std::size_t>(r)].size();
  }
  CHECK(total == 300);       // drop: 301 -> 300
  CHECK(all.size() == 300);  // disjoint
}

TEST_CASE("in-memory: capacity, oldest-first eviction and reads") {
  InMemoryDataset store(Shape{2}, 3);
  CHECK(store.size() == 0);
  for (int k = 0; k < 5; ++k) {
    const float f[2] = {static_cast<float>(k), static_cast<float>(10 * k)};
    CHECK(store.append(span<const float>(f, 2), k) == k % 3);
  }
  CHECK(store.size() == 3);
  CHECK(store.appended() == 5);
  std::vector<std::int64_t> idx{0, 1, 2};
  std::vector<float> f(6);
  std::vector<std::int32_t> l(3);
  store.read(span<const std::int64_t>(idx), span<float>(f), span<std::int32_t>(l),
             Normalize{1.0f, 1.0f, 2.0f});
  CHECK(l == std::vector<std::int32_t>{3, 4, 2});  // samples 3 and 4 replaced 0 and 1
  CHECK(f == std::vector<float>{1.0f, 14.5f, 1.5f, 19.5f, 0.5f, 9.5f});
  const float bad[3] = {0, 0, 0};
  CHECK_THROWS_AS(store.append(span<const float>(bad, 3), 0), InvalidArgument);
  CHECK_THROWS_AS(store.append(span<const float>(bad, 2), -1), InvalidArgument);
  idx = {3};
  CHECK_THROWS_AS(store.read(span<const std::int64_t>(idx), span<float>(f.data(), 2),
                             span<std::int32_t>(l.data(), 1), Normalize{}),
                  InvalidArgument);
}

TEST_CASE("in-memory: the reservoir keeps a uniform sample of everything appended") {
  InMemoryOptions opt;
  opt.eviction = Eviction::reservoir;
  opt.seed = 17;
  InMemoryDataset store(Shape{1}, 200, opt);
  const int total = 20000;
  for (int k = 0; k < total; ++k) {
    const float v = static_cast<float>(k);
    store.append(span<const float>(&v, 1), 0);
  }
  std::vector<std::int64_t> idx(200);
  for (int i = 0; i < 200; ++i) idx[static_cast<std::size_t>(i)] = i;
  std::vector<float> f(200);
  std::vector<std::int32_t> l(200);
  store.read(span<const std::int64_t>(idx), span<float>(f), span<std::int32_t>(l), Normalize{});
  // Uniform over [0, 20000): mean 9999.5, s.d. of the mean of 200 draws ~ 408. Each quarter of the
  // stream holds ~50 of the 200 (s.d. ~6). Deterministic for this seed.
  double mean = 0;
  int quarters[4] = {0, 0, 0, 0};
  for (float v : f) {
    mean += v / 200.0;
    ++quarters[static_cast<int>(v) / 5000];
  }
  CHECK(mean == doctest::Approx(9999.5).epsilon(0.15));
  for (int q : quarters) CHECK((q > 25 && q < 75));
  // The state round-trips, including the reservoir's random stream.
  auto st = dtrain::test::save_state(store);
  InMemoryDataset copy(Shape{1}, 200, opt);
  dtrain::test::load_state(st, copy);
  const float v = 1e6f;
  for (int k = 0; k < 50; ++k)
    CHECK(copy.append(span<const float>(&v, 1), 1) == store.append(span<const float>(&v, 1), 1));
}

TEST_CASE("in-memory: a simulation appends while a loader reads") {
  InMemoryDataset store(Shape{16}, 256);
  std::vector<float> sample(16);
  for (int k = 0; k < 256; ++k) {
    for (auto& x : sample) x = static_cast<float>(k);
    store.append(span<const float>(sample), k % 10);
  }
  std::atomic<bool> done{false};
  std::thread sim([&] {
    std::vector<float> s(16);
    for (int k = 256; !done.load(); ++k) {
      for (auto& x : s) x = static_cast<float>(k);
      store.append(span<const float>(s), k % 10);
    }
  });
  DistributedSampler sampler(store.size(), 0, 1, 4);
  std::size_t rows = 0;
  for (int e = 0; e < 3; ++e) {
    sampler.set_epoch(e);
    Loader loader(store, sampler, 32);
    Batch b;
    while (loader.next(b)) {
      auto f = b.features.as<float>();
      for (std::size_t i = 0; i < b.size; ++i) {
        // A row is one sample: all 16 values equal (never half old, half new).
        for (std::size_t k = 1; k < 16; ++k) CHECK(f[i * 16 + k] == f[i * 16]);
        CHECK(b.labels.as<std::int32_t>()[i] == static_cast<std::int32_t>(f[i * 16]) % 10);
      }
      rows += b.size;
    }
  }
  done = true;
  sim.join();
  CHECK(rows == 3 * 256);
}

TEST_CASE("in-memory: regression pairs go in and come out as inputs and targets") {
  InMemoryDataset store(Shape{2}, Shape{3}, 3);
  CHECK(store.holds_pairs());
  CHECK(store.sample_shape() == Shape{2});
  CHECK(store.target_shape() == Shape{3});
  CHECK(store.target_elements() == 3);
  // Pair k: input {k, 10k}, target {-k, k/2, 100k}; five pairs into three slots, oldest first.
  auto input = [](int k) { return std::vector<float>{float(k), 10.0f * k}; };
  auto target = [](int k) { return std::vector<float>{-float(k), 0.5f * k, 100.0f * k}; };
  for (int k = 0; k < 5; ++k) {
    const std::vector<float> in = input(k), out = target(k);
    CHECK(store.append_pair(span<const float>(in), span<const float>(out)) == k % 3);
  }
  CHECK(store.size() == 3);
  CHECK(store.appended() == 5);
  // A batch in any order, with a repeat; the transform applies to the inputs only.
  const std::vector<std::int64_t> idx{2, 0, 1, 0};
  std::vector<float> x(4 * 2), y(4 * 3);
  store.read_pairs(span<const std::int64_t>(idx), span<float>(x), span<float>(y),
                   Normalize{1.0f, 1.0f, 2.0f});
  const int in_slot[3] = {3, 4, 2};  // pairs 3 and 4 replaced 0 and 1
  for (std::size_t b = 0; b < idx.size(); ++b) {
    const int k = in_slot[idx[b]];
    CHECK(x[2 * b] == (float(k) - 1.0f) / 2.0f);
    CHECK(x[2 * b + 1] == (10.0f * k - 1.0f) / 2.0f);
    CHECK(std::vector<float>(y.begin() + 3 * b, y.begin() + 3 * b + 3) == target(k));
  }
  // Several pairs at once: rows of inputs and rows of targets.
  InMemoryDataset many(Shape{2}, Shape{1}, 8);
  const std::vector<float> xs{1, 2, 3, 4, 5, 6}, ys{7, 8, 9};
  many.append_pairs(span<const float>(xs), span<const float>(ys));
  CHECK(many.size() == 3);
  const std::vector<std::int64_t> all{0, 1, 2};
  std::vector<float> xr(6), yr(3);
  many.read_pairs(span<const std::int64_t>(all), span<float>(xr), span<float>(yr));
  CHECK(xr == xs);
  CHECK(yr == ys);
}

TEST_CASE("in-memory: a store of pairs refuses labels, and a store of labels refuses pairs") {
  InMemoryDataset pairs(Shape{2}, Shape{1}, 4);
  const float two[2] = {1, 2}, one[1] = {3};
  std::vector<std::int64_t> idx{0};
  std::vector<float> x(2), y(1);
  std::vector<std::int32_t> l(1);
  CHECK_THROWS_AS(pairs.append(span<const float>(two, 2), 0), InvalidArgument);
  CHECK_THROWS_AS(pairs.append_pair(span<const float>(two, 1), span<const float>(one, 1)),
                  InvalidArgument);
  CHECK_THROWS_AS(pairs.append_pair(span<const float>(two, 2), span<const float>(two, 2)),
                  InvalidArgument);
  CHECK_THROWS_AS(pairs.append_pairs(span<const float>(two, 2), span<const float>(two, 2)),
                  InvalidArgument);
  CHECK(pairs.size() == 0);
  pairs.append_pair(span<const float>(two, 2), span<const float>(one, 1));
  CHECK_THROWS_AS(
      pairs.read(span<const std::int64_t>(idx), span<float>(x), span<std::int32_t>(l), Normalize{}),
      InvalidArgument);
  CHECK_THROWS_AS(
      pairs.read_pairs(span<const std::int64_t>(idx), span<float>(x.data(), 1), span<float>(y)),
      InvalidArgument);
  idx = {1};  // one pair stored: slot 1 is empty
  CHECK_THROWS_AS(pairs.read_pairs(span<const std::int64_t>(idx), span<float>(x), span<float>(y)),
                  InvalidArgument);
  CHECK_THROWS_AS(InMemoryDataset(Shape{2}, Shape{0}, 4), InvalidArgument);

  InMemoryDataset labelled(Shape{2}, 4);
  CHECK_FALSE(labelled.holds_pairs());
  CHECK(labelled.target_elements() == 0);
  labelled.append(span<const float>(two, 2), 1);
  idx = {0};
  CHECK_THROWS_AS(labelled.append_pair(span<const float>(two, 2), span<const float>(one, 1)),
                  InvalidArgument);
  CHECK_THROWS_AS(
      labelled.read_pairs(span<const std::int64_t>(idx), span<float>(x), span<float>(y)),
      InvalidArgument);
}

TEST_CASE("in-memory: a store of pairs keeps its pairs and its reservoir across a checkpoint") {
  InMemoryOptions opt;
  opt.eviction = Eviction::reservoir;
  opt.seed = 5;
  InMemoryDataset store(Shape{3}, Shape{2}, 16, opt);
  for (int k = 0; k < 100; ++k) {
    const float in[3] = {float(k), float(k) + 0.25f, float(k) + 0.5f};
    const float out[2] = {float(-k), float(2 * k)};
    store.append_pair(span<const float>(in, 3), span<const float>(out, 2));
  }
  auto st = dtrain::test::save_state(store);
  CHECK(st.shapes.at("targets") == Shape{16, 2});
  CHECK(st.shapes.at("features") == Shape{16, 3});
  CHECK(st.tensors.count("labels") == 0);
  InMemoryDataset copy(Shape{3}, Shape{2}, 16, opt);
  dtrain::test::load_state(st, copy);
  CHECK(copy.size() == 16);
  CHECK(copy.appended() == 100);
  std::vector<std::int64_t> idx(16);
  for (std::size_t i = 0; i < 16; ++i) idx[i] = static_cast<std::int64_t>(i);
  std::vector<float> xa(48), ya(32), xb(48), yb(32);
  store.read_pairs(span<const std::int64_t>(idx), span<float>(xa), span<float>(ya));
  copy.read_pairs(span<const std::int64_t>(idx), span<float>(xb), span<float>(yb));
  CHECK(xa == xb);
  CHECK(ya == yb);
  for (std::size_t i = 0; i < 16; ++i) {  // every slot holds one whole pair
    CHECK(ya[2 * i] == -xa[3 * i]);
    CHECK(ya[2 * i + 1] == 2 * xa[3 * i]);
  }
  // The reservoir's random stream continues where it stopped.
  const float in[3] = {0, 0, 0}, out[2] = {0, 0};
  for (int k = 0; k < 50; ++k)
    CHECK(copy.append_pair(span<const float>(in, 3), span<const float>(out, 2)) ==
          store.append_pair(span<const float>(in, 3), span<const float>(out, 2)));
  // A store of labelled samples cannot load it.
  InMemoryDataset labelled(Shape{3}, 16, opt);
  CHECK_THROWS(dtrain::test::load_state(st, labelled));
}

TEST_CASE("in-memory: pairs appended while batches are read stay whole") {
  InMemoryDataset store(Shape{8}, Shape{2}, 64);
  auto fill = [](int k, std::vector<float>& in, std::vector<float>& out) {
    for (auto& v : in) v = static_cast<float>(k);
    out = {static_cast<float>(k), static_cast<float>(-k)};
  };
  std::vector<float> in(8), out(2);
  for (int k = 0; k < 64; ++k) {
    fill(k, in, out);
    store.append_pair(span<const float>(in), span<const float>(out));
  }
  std::atomic<bool> done{false};
  std::thread sim([&] {
    std::vector<float> i2(8), o2(2);
    for (int k = 64; !done.load(); ++k) {
      fill(k, i2, o2);
      store.append_pair(span<const float>(i2), span<const float>(o2));
    }
  });
  DistributedSampler sampler(store.size(), 0, 1, 3);
  std::vector<float> x(16 * 8), y(16 * 2);
  for (int e = 0; e < 20; ++e) {
    sampler.set_epoch(e);
    for (std::size_t b = 0; b < 4; ++b) {
      const auto idx = sampler.next_indices(16);
      sampler.advance(16);
      store.read_pairs(span<const std::int64_t>(idx), span<float>(x), span<float>(y));
      for (std::size_t r = 0; r < 16; ++r) {
        for (std::size_t k = 1; k < 8; ++k) CHECK(x[r * 8 + k] == x[r * 8]);
        CHECK(y[2 * r] == x[r * 8]);
        CHECK(y[2 * r + 1] == -x[r * 8]);
      }
    }
  }
  done = true;
  sim.join();
}
