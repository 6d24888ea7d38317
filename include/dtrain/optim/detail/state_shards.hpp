// SPDX-License-Identifier: BSD-3-Clause
// dtrain: an optimizer's state kept for some parts of the parameter arena only (sharded
// updates): which parts, where each lies in the compact state arenas, and the copies between the
// compact and the whole-sized layout (the arenas themselves: state_arenas.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_state.hpp>
#include <dtrain/exec/exec_traits.hpp>
#include <dtrain/optim/detail/optim_common.hpp>

namespace dtrain {
namespace detail {

/// A zeroed state arena of n elements of `dtype` (the zeroing queued on the compute stream).
template <class Exec>
Tensor zero_state(Exec& exec, std::size_t n, DType dtype) {
  Tensor t(Shape{static_cast<std::int64_t>(n)}, dtype, exec.allocator());
  fill_zero(exec, t);
  return t;
}

/// The parts (first element, count) of an arena of n elements whose optimizer state a rank
/// keeps, in ascending order, and their start in the compact arenas (the parts back to back).
/// Empty: the state is whole-sized. Local value type.
class StateShards {
 public:
  using Parts = StateParts;

  /// Throws InvalidArgument (naming `op`) unless `parts` are ascending, disjoint and inside an
  /// arena of n elements. Parts of no element are dropped.
  void assign(const Parts& parts, std::size_t n, const char* op) {
    Parts kept;
    std::vector<std::size_t> starts;
    std::size_t end = 0, total = 0;
    for (const auto& [first, count] : parts) {
      check_range(first, count, n, op);
      if (count == 0) continue;
      DTRAIN_REQUIRE(first >= end, op,
                     "the parts must be ascending and disjoint: ["
                         << first << ", " << first + count << ") after one ending at " << end);
      kept.emplace_back(first, count);
      starts.push_back(total);
      total += count;
      end = first + count;
    }
    parts_ = std::move(kept);
    starts_ = std::move(starts);
    elements_ = total;
    sharded_ = true;
  }
  void clear() noexcept {
    parts_.clear();
    starts_.clear();
    elements_ = 0;
    sharded_ = false;
  }
  bool sharded() const noexcept { return sharded_; }
  /// True when sharded over `parts` (as given to assign, empty ones included) already; throws
  /// InvalidArgument (naming `op`) when sharded over other parts; false when not sharded.
  bool keeps(const Parts& parts, const char* op) const {
    if (!sharded_) return false;
    std::size_t j = 0;
    bool same = true;
    for (const auto& p : parts) {
      if (p.second == 0) continue;
      if (j == parts_.size() || parts_[j] != p) {
        same = false;
        break;
      }
      ++j;
    }
    DTRAIN_REQUIRE(same && j == parts_.size(), op,
                   "the state is sharded over other parts; make it whole first "
                   "(GradientSync::gather_state)");
    return true;
  }
  /// Elements per state arena in memory while sharded.
  std::size_t elements() const noexcept { return elements_; }
  /// Elements per state arena of an arena of n elements: the parts' total while sharded, else n.
  std::size_t held(std::size_t n) const noexcept { return sharded_ ? elements_ : n; }
  /// The parts kept (empty ones dropped), ascending.
  const Parts& parts() const noexcept { return parts_; }

  /// Where the state of elements [offset, offset + count) starts in the compact arenas; the
  /// range must lie inside one part. Throws InvalidArgument (naming `op`) otherwise.
  std::size_t locate(std::size_t offset, std::size_t count, const char* op) const {
    auto it = std::upper_bound(parts_.begin(), parts_.end(), offset,
                               [](std::size_t o, const auto& part) { return o < part.first; });
    if (it != parts_.begin()) {
      const std::size_t i = static_cast<std::size_t>(it - parts_.begin()) - 1;
      const auto& [first, n] = parts_[i];
      if (offset - first <= n && count <= n - (offset - first)) return starts_[i] + offset - first;
    }
    raise<InvalidArgument>(op, "range [" + std::to_string(offset) + ", " +
                                   std::to_string(offset + count) +
                                   ") is not inside one of this rank's parts of the sharded "
                                   "optimizer state (" +
                                   std::to_string(parts_.size()) + " parts)");
  }

  /// A compact arena with the parts of the whole-sized `whole` (copies queued on the compute
  /// stream, waited for: the caller may release `whole` afterwards).
  template <class Exec>
  Tensor compact(Exec& exec, const Tensor& whole, const char* op) const {
    Tensor out(Shape{static_cast<std::int64_t>(elements_)}, whole.dtype(), exec.allocator());
    const std::size_t es = size_of(whole.dtype());
    const auto* src = static_cast<const unsigned char*>(whole.raw());
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (std::size_t i = 0; i < parts_.size(); ++i)
      exec.copy_d2d(exec.compute_stream(), dst + starts_[i] * es, src + parts_[i].first * es,
                    parts_[i].second * es);
    exec_synchronize(exec, exec.compute_stream(), exec_timeout_s(), op);
    return out;
  }
  /// A whole-sized arena of n elements with the parts of `compact` in place and zeros elsewhere
  /// (waited for, as compact()).
  template <class Exec>
  Tensor expand(Exec& exec, const Tensor& compact, std::size_t n, const char* op) const {
    Tensor out = zero_state(exec, n, compact.dtype());
    const std::size_t es = size_of(compact.dtype());
    const auto* src = static_cast<const unsigned char*>(compact.raw());
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (std::size_t i = 0; i < parts_.size(); ++i)
      exec.copy_d2d(exec.compute_stream(), dst + parts_[i].first * es, src + starts_[i] * es,
                    parts_[i].second * es);
    exec_synchronize(exec, exec.compute_stream(), exec_timeout_s(), op);
    return out;
  }
  /// Tensor `name` of an arena of n elements of `dtype`, read by loading visitor `v` (through
  /// `mirror`, as StateMirror::visit) into a whole-sized temporary of which the compact arena
  /// of the parts is returned: a sharded state stays sharded through a restore, whole for one
  /// tensor at a time while it loads. Blocking.
  template <class Exec, class V>
  Tensor load_compact(Exec& exec, V& v, StateMirror<Exec>& mirror, const std::string& name,
                      DType dtype, std::size_t n, const char* op) const {
    // Zeroed: what a visitor does not write reads as the fresh state.
    Tensor whole = zero_state(exec, n, dtype);
    mirror.visit(exec, v, name, whole, 0, n, Shape{static_cast<std::int64_t>(n)});
    return compact(exec, whole, op);
  }

 private:
  Parts parts_;
  std::vector<std::size_t> starts_;
  std::size_t elements_ = 0;
  bool sharded_ = false;
};

}  // namespace detail
}  // namespace dtrain
