// SPDX-License-Identifier: BSD-3-Clause
// dtrain: units of a fully sharded model. A unit is a run of consecutive layers and the range of
// the arenas their parameters fill; a rank holds its part of each unit's parameters and
// gradients only, and asks a UnitProvider (FullyShardedSync, in comm/) for a unit's whole
// parameters before the unit's forward and backward, and hands it the unit's gradients once they
// are final. The model never sees how the provider gathers or reduces them.
#pragma once

#include <cstddef>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// One unit of a fully sharded model: layers [first_layer, end_layer) and their parameters,
/// elements [offset, offset + count) of the whole arenas.
struct ParameterUnit {
  std::size_t first_layer = 0;
  std::size_t end_layer = 0;
  std::size_t offset = 0;
  std::size_t count = 0;
};

/// Tag of the model constructors that leave the arenas out (`Sequential model(layers, exec,
/// dtrain::deferred_arenas)`): FullyShardedSync then allocates this rank's parts only, so the
/// whole parameters and gradients never exist on one rank; init(seed) comes after it.
struct DeferredArenas {
  explicit DeferredArenas() = default;
};
/// The DeferredArenas tag.
inline constexpr DeferredArenas deferred_arenas{};

/// What a fully sharded model asks of whoever gathers its units (FullyShardedSync implements
/// it). Called on the model's thread, in pass order: for each unit of a forward, acquire then
/// forward_done; for each unit of a backward (last unit first), acquire, gradient_buffer, then
/// backward_done. Every rank makes the same calls in the same order (the provider starts
/// collectives from them).
class UnitProvider {
 public:
  virtual ~UnitProvider() = default;
  /// Unit `unit`'s whole parameters (exec memory, its count elements), in place for the work
  /// queued on the compute stream from now on; valid until the unit's forward_done or
  /// backward_done. Null for a unit without parameters.
  virtual void* acquire(std::size_t unit, bool backward) = 0;
  /// The forward kernels of the unit are queued.
  virtual void forward_done(std::size_t unit) = 0;
  /// Where the unit's backward accumulates its gradients (exec memory, its count elements,
  /// zeroed in stream order); valid until backward_done.
  virtual void* gradient_buffer(std::size_t unit) = 0;
  /// The backward kernels of the unit are queued: its gradients are final in stream order.
  virtual void backward_done(std::size_t unit) = 0;
  /// This rank's parts of the gradients were zeroed (zero_grad): the next backward starts the
  /// accumulation afresh.
  virtual void gradients_zeroed() = 0;
  /// This rank's parts of the parameters were written outside a step (init, restore): any
  /// whole unit held from before is stale.
  virtual void parameters_changed() = 0;
};

/// Groups layers into units. `param_counts[i]` is layer i's parameter count (layers in arena
/// order). With `starts` (ascending first layers, the first 0) those are the units; otherwise
/// with `unit_elements` > 0 consecutive layers are joined while the unit stays within that many
/// elements (a larger layer is a unit of its own); with neither, each layer with parameters
/// starts a unit (layers without parameters join the unit before them; those before the first
/// such layer join it). Throws InvalidArgument on starts that do not fit. Local.
inline std::vector<ParameterUnit> plan_parameter_units(const std::vector<std::size_t>& param_counts,
                                                       const std::vector<std::size_t>& starts,
                                                       std::size_t unit_elements) {
  const std::size_t n = param_counts.size();
  std::vector<std::size_t> first;
  if (!starts.empty()) {
    DTRAIN_REQUIRE(starts.front() == 0, "FullyShardedSync", "the first unit must start at layer 0");
    for (std::size_t i = 0; i < starts.size(); ++i) {
      DTRAIN_REQUIRE(starts[i] < n && (i == 0 || starts[i] > starts[i - 1]), "FullyShardedSync",
                     "unit starts must ascend within the " << n << " layers; got " << starts[i]);
    }
    first = starts;
  } else {
    std::size_t size = 0;
    bool seen = false;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t c = param_counts[i];
      if (c == 0) continue;
      const bool join = seen && (unit_elements > 0 ? size + c <= unit_elements : false);
      if (!seen) {
        first.push_back(0);
        size = c;
      } else if (join) {
        size += c;
      } else {
        first.push_back(i);
        size = c;
      }
      seen = true;
    }
    if (first.empty()) first.push_back(0);
  }
  std::vector<ParameterUnit> units;
  std::size_t offset = 0;
  for (std::size_t k = 0; k < first.size(); ++k) {
    ParameterUnit u;
    u.first_layer = first[k];
    u.end_layer = k + 1 < first.size() ? first[k + 1] : n;
    u.offset = offset;
    for (std::size_t i = u.first_layer; i < u.end_layer; ++i) u.count += param_counts[i];
    offset += u.count;
    units.push_back(u);
  }
  return units;
}

}  // namespace dtrain
