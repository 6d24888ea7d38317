// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the state arenas of an element-wise optimizer (SGD's momentum, AdamW's two moments)
// over a parameter arena: made (zeros) on first use, whole-sized or, while the state is sharded,
// of this rank's parts back to back; sharding and unsharding them; and their checkpoint visit,
// which saves a sharded state from its parts and loads into a sharded state its parts only. One
// holder for every such optimizer, so that each states only its arenas' names and its update.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/state.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/exec/exec_state.hpp>
#include <dtrain/optim/detail/optim_common.hpp>
#include <dtrain/optim/detail/state_shards.hpp>

namespace dtrain::detail {

/// N state arenas named `names` (in visiting order) for a parameter arena of n elements of
/// `dtype`, in exec memory of policy Exec (passed to every call that allocates, copies or
/// visits). With `used` false (SGD without momentum) there are no arenas, and everything else
/// (sharding, partial state, the visit's checks) behaves as with them. Local, not thread-safe.
template <class Exec, std::size_t N>
class StateArenas {
 public:
  using Parts = StateShards::Parts;

  StateArenas(std::array<const char*, N> names, std::size_t n, DType dtype, bool used)
      : names_(names), arena_elements_(n), dtype_(dtype), used_(used) {}

  /// Makes the arenas (zeros; whole-sized, or of the parts while sharded) unless made already.
  void make(Exec& exec) const {
    if (made_) return;
    if (used_)
      for (Tensor& t : arenas_) t = zero_state(exec, shards_.held(arena_elements_), dtype_);
    made_ = true;
  }
  /// Arena i's first element (made if not yet); null when not used.
  void* data(Exec& exec, std::size_t i) const {
    make(exec);
    return arenas_[i].raw();
  }
  /// Arena i (made if not yet).
  BufferView view(Exec& exec, std::size_t i) const {
    make(exec);
    return arenas_[i].view();
  }
  /// Calls f(BufferView) for each arena in order (made if not yet; none when not used).
  template <class F>
  void for_each(Exec& exec, F&& f) const {
    make(exec);
    if (used_)
      for (const Tensor& t : arenas_) f(t.view());
  }

  /// Where the state of elements [offset, offset + count) starts in the arenas: offset, or
  /// while sharded its place in the parts (the range must lie inside one; InvalidArgument naming
  /// `op` otherwise).
  std::size_t locate(std::size_t offset, std::size_t count, const char* op) const {
    return shards_.sharded() ? shards_.locate(offset, count, op) : offset;
  }
  /// Keeps the state of `parts` (ascending, disjoint) only, in arenas of their total size
  /// (before the arenas are made: none are, and they will be made of that size); the state is
  /// partial from then on. Again with the same parts: nothing. Blocking. Throws InvalidArgument
  /// (naming `op`) on parts out of order or outside the arena, and on other parts while sharded.
  void shard(Exec& exec, const Parts& parts, const char* op) {
    if (shards_.keeps(parts, op)) return;
    StateShards s;
    s.assign(parts, arena_elements_, op);
    if (made_ && used_) {
      std::array<Tensor, N> compact;
      for (std::size_t i = 0; i < N; ++i) compact[i] = s.compact(exec, arenas_[i], op);
      arenas_ = std::move(compact);
    }
    shards_ = std::move(s);
    partial_ = true;
  }
  /// Whole-sized arenas again, this rank's parts in place and zeros elsewhere (still partial
  /// until the other ranks' parts are gathered into them). Nothing when not sharded. Blocking.
  void unshard(Exec& exec, const char* op) {
    if (!shards_.sharded()) return;
    if (made_ && used_) {
      std::array<Tensor, N> whole;
      for (std::size_t i = 0; i < N; ++i)
        whole[i] = shards_.expand(exec, arenas_[i], arena_elements_, op);
      arenas_ = std::move(whole);
    }
    shards_.clear();
  }
  bool sharded() const noexcept { return shards_.sharded(); }
  /// Whether the arenas were made (make).
  bool made() const noexcept { return made_; }
  /// Elements of the whole arena the state is for.
  std::size_t arena_elements() const noexcept { return arena_elements_; }
  /// Elements per arena in memory: n, or while sharded the parts' total; 0 when not used.
  std::size_t elements() const noexcept { return used_ ? shards_.held(arena_elements_) : 0; }
  /// Marks the whole-sized state current everywhere (after a gather) or partial.
  void set_partial(bool partial) noexcept { partial_ = partial; }
  /// Whether the state is current only in this rank's parts (sharded, or not yet gathered).
  bool partial() const noexcept { return partial_ || shards_.sharded(); }

  /// Checkpoint protocol, the arenas as tensors of shape {n} named as given. Saving: while
  /// sharded, a visitor that takes parts (the checkpointer's save) gets this rank's parts
  /// (tensor_parts); otherwise the state must be whole (InvalidArgument naming `op`). Loading a
  /// whole state makes it whole; loading into a sharded one keeps this rank's parts of it (each
  /// tensor whole only while it loads). Blocking.
  template <class V>
  void visit(Exec& exec, V& v, const char* op) {
    const Shape shape{static_cast<std::int64_t>(arena_elements_)};
    if (visits_parts(v, shards_.sharded())) {
      if constexpr (visitor_takes_parts<V>::value)
        if (used_) {
          make(exec);
          for (std::size_t i = 0; i < N; ++i)
            mirrors_[i].visit_parts(exec, v, names_[i], arenas_[i], shape, shards_.parts());
        }
    } else if (v.loading() && shards_.sharded()) {
      // Each arena replaced as soon as it is loaded: beyond the parts held, one tensor whole
      // and one new compact arena at a time.
      if (used_)
        for (std::size_t i = 0; i < N; ++i)
          arenas_[i] =
              shards_.load_compact(exec, v, mirrors_[i], names_[i], dtype_, arena_elements_, op);
      made_ = true;
    } else {
      if (v.loading())
        partial_ = false;  // the whole state comes in
      else
        check_state_whole(partial(), op);
      make(exec);
      if (used_)
        for (std::size_t i = 0; i < N; ++i)
          mirrors_[i].visit(exec, v, names_[i], arenas_[i], 0, arenas_[i].size(), shape);
    }
  }

 private:
  std::array<const char*, N> names_;
  std::size_t arena_elements_ = 0;
  DType dtype_ = DType::f32;
  bool used_ = true;
  mutable std::array<Tensor, N> arenas_;  // made on first use (make)
  mutable bool made_ = false;
  std::array<StateMirror<Exec>, N> mirrors_;
  StateShards shards_;
  bool partial_ = false;
};

}  // namespace dtrain::detail
