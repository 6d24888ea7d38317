// Checkpoint tests: a replicated tensor that each rank holds only parts of (the state protocol's
// tensor_parts, as a sharded optimizer state is saved), in several layouts over the ranks, and
// the check of a written file against the whole tensor's values.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain::test {

/// The value of element i of the whole tensor.
inline float parts_value(std::size_t i) { return static_cast<float>(i % 251) * 0.5f - 3.0f; }

/// How the ranks divide n elements.
enum class PartsLayout {
  blocks,       // rank r: [r n / p, (r + 1) n / p)
  round_robin,  // pieces of 7 elements dealt to the ranks in turn (uneven; several per rank)
  last_empty,   // blocks over the first p - 1 ranks, nothing on the last (p > 1)
  overlap,      // blocks, rank 0's block one element longer (covers one element twice; p > 1)
  gap           // blocks, the last rank's block one element shorter (one element uncovered)
};

inline StateParts parts_of(PartsLayout layout, std::size_t n, int rank, int p) {
  const auto r = static_cast<std::size_t>(rank), up = static_cast<std::size_t>(p);
  StateParts parts;
  auto block = [&](std::size_t k, std::size_t of) {
    return std::make_pair(n * k / of, n * (k + 1) / of - n * k / of);
  };
  switch (layout) {
    case PartsLayout::blocks: parts.push_back(block(r, up)); break;
    case PartsLayout::round_robin:
      for (std::size_t first = 7 * r; first < n; first += 7 * up)
        parts.emplace_back(first, std::min<std::size_t>(7, n - first));
      break;
    case PartsLayout::last_empty:
      if (r + 1 < up) parts.push_back(block(r, up - 1));
      break;
    case PartsLayout::overlap:
      parts.push_back(block(r, up));
      if (r == 0) ++parts[0].second;
      break;
    case PartsLayout::gap:
      parts.push_back(block(r, up));
      if (r + 1 == up) --parts[0].second;
      break;
  }
  return parts;
}

/// A tensor "w" of n f32 elements (shape {n}, or `shape` when given: n elements in row-major
/// order) and a scalar. Visitors that take parts and are not loading (the checkpointer's save
/// and its restore's check pass) get this rank's parts only; others, and loading ones, the whole
/// tensor, which this object then holds.
struct PartsState {
  std::size_t n = 0;
  Shape shape;
  StateParts parts;
  Tensor held, whole;
  std::int64_t tag = 0;

  PartsState(std::size_t elements, PartsLayout layout, int rank, int p, Shape of = {})
      : n(elements), shape(of.empty() ? Shape{static_cast<std::int64_t>(elements)} : of) {
    parts = parts_of(layout, n, rank, p);
    std::size_t total = 0;
    for (const auto& pr : parts) total += pr.second;
    held = Tensor({static_cast<std::int64_t>(total)}, DType::f32);
    auto* h = static_cast<float*>(held.raw());
    for (const auto& [first, count] : parts)
      for (std::size_t i = 0; i < count; ++i) *h++ = parts_value(first + i);
    whole = Tensor(shape, DType::f32);
    std::memset(whole.raw(), 0, n * sizeof(float));
    tag = 40;  // replicated: the same on every rank
  }
  template <class V>
  void visit_state(V& v) {
    bool in_parts = false;
    if constexpr (visitor_takes_parts<V>::value) {
      in_parts = !v.loading();
      if (in_parts) v.tensor_parts("w", held.view(), shape, parts);
    }
    if (!in_parts) v.tensor("w", whole.view(), whole.shape());
    v.scalar("tag", tag);
  }
};

/// First element of a file's dataset `path` that differs from parts_value (or a description of
/// what is missing); empty when every one matches. The dataset must have shape {n}, or `shape`
/// when given.
inline std::string parts_file_difference(const detail::CkptManifest& m, const std::string& path,
                                         std::size_t n, Shape shape = {}) {
  if (shape.empty()) shape = Shape{static_cast<std::int64_t>(n)};
  for (const auto& e : m.entries) {
    if (e.path != path) continue;
    if (e.dtype != DType::f32 || e.shape != shape) return path + ": dtype or shape differ";
    const auto* f = static_cast<const float*>(e.data);
    for (std::size_t i = 0; i < n; ++i)
      if (f[i] != parts_value(i)) return path + ": element " + std::to_string(i) + " differs";
    return {};
  }
  return path + ": not in the file";
}

/// What goes wrong when `ckpt` saves `ps`, whose layout leaves a gap or an overlap, as step 1:
/// empty when the refusal names the tensor and the problem; otherwise what the save did.
template <class Checkpointer>
std::string parts_refusal_problem(Checkpointer& ckpt, PartsState& ps, PartsLayout layout) {
  std::string what;
  try {
    ckpt.save(1, named("parts", ps));
    return "the save succeeded";
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  const char* problem = layout == PartsLayout::gap ? "held by no rank" : "and rank";
  if (what.find("/parts/w") == std::string::npos || what.find(problem) == std::string::npos)
    return "the error does not name /parts/w and '" + std::string(problem) + "': " + what;
  if (ckpt.last_step().has_value()) return "the refused save counts as saved";
  return {};
}

}  // namespace dtrain::test
