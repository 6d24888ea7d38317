// Checkpoint tests: stateful stand-ins for a model, an optimizer, a sampler and a schedule, and a
// deterministic "training step" that uses all of them, so bit-exact resume can be checked.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/rng.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain::test {

/// A layer with tensors of several dtypes and shapes.
struct FakeLayer {
  Tensor weight, bias, half_w, bf_w;
  FakeLayer(std::int64_t in, std::int64_t out)
      : weight({out, in}, DType::f32),
        bias({out}, DType::f32),
        half_w({out, 2}, DType::f16),
        bf_w({3, out}, DType::bf16) {}
  template <class V>
  void visit_state(V& v) {
    v.tensor("weight", weight.view(), weight.shape());
    v.tensor("bias", bias.view(), bias.shape());
    v.tensor("half_w", half_w.view(), half_w.shape());
    v.tensor("bf_w", bf_w.view(), bf_w.shape());
  }
};

struct FakeModel {
  FakeLayer fc1, fc2;
  Tensor counts{{2, 2, 2}, DType::i32};
  Tensor ids{{5}, DType::i64};
  Tensor scale{{}, DType::f64};  // a 0-d tensor
  Tensor empty{{0, 4}, DType::f32};
  explicit FakeModel(std::int64_t width = 6) : fc1(4, width), fc2(width, 3) {}
  template <class V>
  void visit_state(V& v) {
    v.child("fc1", fc1);
    v.child("fc2", fc2);
    v.tensor("counts", counts.view(), counts.shape());
    v.tensor("ids", ids.view(), ids.shape());
    v.tensor("scale", scale.view(), scale.shape());
    v.tensor("empty", empty.view(), empty.shape());
  }
  std::vector<Tensor*> float_params() { return {&fc1.weight, &fc1.bias, &fc2.weight, &fc2.bias}; }
};

/// Adam-like optimizer state: moments per float parameter and scalars.
struct FakeOptimizer {
  std::vector<Tensor> m, v;
  std::int64_t steps = 0;
  double lr = 0.01;
  std::string name = "fake-adam \xce\xb2";  // non-ASCII on purpose
  explicit FakeOptimizer(FakeModel& model) {
    for (Tensor* p : model.float_params()) {
      m.emplace_back(p->shape(), DType::f32);
      v.emplace_back(p->shape(), DType::f32);
    }
  }
  template <class V>
  void visit_state(V& vis) {
    vis.scalar("steps", steps);
    vis.scalar("lr", lr);
    vis.scalar("name", name);
    for (std::size_t i = 0; i < m.size(); ++i) {
      vis.tensor("m/" + std::to_string(i), m[i].view(), m[i].shape());
      vis.tensor("v/" + std::to_string(i), v[i].view(), v[i].shape());
    }
  }
};

/// Per-rank cursor over a rank's shard, plus a per-rank RNG.
struct FakeSampler {
  std::int64_t epoch = 0;
  std::int64_t cursor = 0;
  int shard_size = 7;
  RngStream rng;
  explicit FakeSampler(int rank) : rng(1234, static_cast<std::uint64_t>(rank)) {}
  template <class V>
  void visit_state(V& v) {
    v.scalar("epoch", epoch);
    v.scalar("cursor", cursor);
    v.scalar("shard_size", shard_size);  // an int: converted through int64
    v.child("rng", rng);
  }
  void advance() {
    if (++cursor == shard_size) {
      cursor = 0;
      ++epoch;
    }
  }
};

/// A type without visit_state: checkpointed through a serializer specialisation.
struct LegacySchedule {
  long position = 0;
  float warmup_fraction = 0.25f;
};

}  // namespace dtrain::test

template <>
struct dtrain::serializer<dtrain::test::LegacySchedule> {
  template <class V>
  static void visit(V& v, dtrain::test::LegacySchedule& s) {
    v.scalar("position", s.position);
    v.scalar("warmup_fraction", s.warmup_fraction);
  }
};

namespace dtrain::test {

/// Everything a run holds.
struct FakeRun {
  FakeModel model;
  FakeOptimizer opt{model};
  FakeSampler sampler;
  RngStream dropout{99, 7};
  LegacySchedule sched;
  explicit FakeRun(int rank, std::int64_t width = 6) : model(width), sampler(rank) {
    RngStream init(42, 0);  // identical on every rank
    auto fill = [&](Tensor& t) {
      switch (t.dtype()) {
        case DType::f32:
          for (auto& x : t.as<float>()) x = static_cast<float>(init.normal());
          break;
        case DType::f64:
          for (auto& x : t.as<double>()) x = init.normal();
          break;
        case DType::f16:
          for (auto& x : t.as<half>()) x = half(static_cast<float>(init.normal()));
          break;
        case DType::bf16:
          for (auto& x : t.as<bfloat16>()) x = bfloat16(static_cast<float>(init.normal()));
          break;
        case DType::i32:
          for (auto& x : t.as<std::int32_t>()) x = static_cast<std::int32_t>(init.below(1000));
          break;
        case DType::i64:
          for (auto& x : t.as<std::int64_t>()) x = static_cast<std::int64_t>(init.next_u64() >> 1);
          break;
      }
    };
    for (Tensor* t : {&model.fc1.weight, &model.fc1.bias, &model.fc1.half_w, &model.fc1.bf_w,
                      &model.fc2.weight, &model.fc2.bias, &model.fc2.half_w, &model.fc2.bf_w,
                      &model.counts, &model.ids, &model.scale})
      fill(*t);
  }

  /// One data-parallel step: a per-rank "gradient" from the sampler's RNG, averaged over ranks
  /// with allreduce, then an Adam-like update with dropout noise from a replicated stream.
  template <class Comm>
  void step(Comm& comm) {
    auto params = model.float_params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto w = params[i]->as<float>();
      std::vector<double> g(w.size());
      for (std::size_t k = 0; k < w.size(); ++k)
        g[k] = std::sin(static_cast<double>(w[k]) + static_cast<double>(sampler.cursor)) +
               0.1 * sampler.rng.normal();
      comm.allreduce(BufferView(g.data(), g.size(), DType::f64), ReduceOp::sum);
      auto m1 = opt.m[i].as<float>();
      auto m2 = opt.v[i].as<float>();
      for (std::size_t k = 0; k < w.size(); ++k) {
        const float gk = static_cast<float>(g[k] / comm.size());
        m1[k] = 0.9f * m1[k] + 0.1f * gk;
        m2[k] = 0.999f * m2[k] + 0.001f * gk * gk;
        const float keep = dropout.uniform() < 0.9f ? 1.0f : 0.5f;
        w[k] -= static_cast<float>(opt.lr) * keep * m1[k] / (std::sqrt(m2[k]) + 1e-8f);
      }
    }
    for (auto& h : model.fc1.half_w.as<half>()) h = half(static_cast<float>(h) * 0.99f + 0.01f);
    for (auto& b : model.fc2.bf_w.as<bfloat16>()) b = bfloat16(static_cast<float>(b) * 1.01f);
    model.counts.as<std::int32_t>()[0] += 1;
    model.scale.as<double>()[0] *= 1.0000001;
    ++opt.steps;
    opt.lr *= 0.999;
    ++sched.position;
    sampler.advance();
  }
};

/// Bit-for-bit equality of every tensor and scalar of two runs (through the same visitor the
/// checkpoint uses would hide bugs; this compares the members directly).
inline bool tensors_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.bytes() == 0 || std::memcmp(a.raw(), b.raw(), a.bytes()) == 0);
}

inline std::string first_difference(FakeRun& a, FakeRun& b) {
  const Tensor* ta[] = {&a.model.fc1.weight, &a.model.fc1.bias,   &a.model.fc1.half_w,
                        &a.model.fc1.bf_w,   &a.model.fc2.weight, &a.model.fc2.bias,
                        &a.model.fc2.half_w, &a.model.fc2.bf_w,   &a.model.counts,
                        &a.model.ids,        &a.model.scale,      &a.model.empty};
  const Tensor* tb[] = {&b.model.fc1.weight, &b.model.fc1.bias,   &b.model.fc1.half_w,
                        &b.model.fc1.bf_w,   &b.model.fc2.weight, &b.model.fc2.bias,
                        &b.model.fc2.half_w, &b.model.fc2.bf_w,   &b.model.counts,
                        &b.model.ids,        &b.model.scale,      &b.model.empty};
  for (std::size_t i = 0; i < sizeof(ta) / sizeof(ta[0]); ++i)
    if (!tensors_equal(*ta[i], *tb[i])) return "model tensor #" + std::to_string(i);
  for (std::size_t i = 0; i < a.opt.m.size(); ++i) {
    if (!tensors_equal(a.opt.m[i], b.opt.m[i])) return "opt.m #" + std::to_string(i);
    if (!tensors_equal(a.opt.v[i], b.opt.v[i])) return "opt.v #" + std::to_string(i);
  }
  if (a.opt.steps != b.opt.steps) return "opt.steps";
  if (std::memcmp(&a.opt.lr, &b.opt.lr, sizeof(double)) != 0) return "opt.lr";
  if (a.opt.name != b.opt.name) return "opt.name";
  if (a.sampler.epoch != b.sampler.epoch || a.sampler.cursor != b.sampler.cursor)
    return "sampler position";
  // An RngStream's whole state is (seed, stream, position).
  auto same_rng = [](const RngStream& x, const RngStream& y) {
    return x.seed() == y.seed() && x.stream() == y.stream() && x.position() == y.position();
  };
  if (!same_rng(a.sampler.rng, b.sampler.rng)) return "sampler rng";
  if (!same_rng(a.dropout, b.dropout)) return "dropout rng";
  if (a.sched.position != b.sched.position || a.sched.warmup_fraction != b.sched.warmup_fraction)
    return "schedule";
  return "";
}

}  // namespace dtrain::test
