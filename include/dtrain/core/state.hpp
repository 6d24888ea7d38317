// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the state-visiting protocol that checkpoints use.
//
// A stateful type T provides
//     template <class V> void visit_state(V& v);
// and calls, for each piece of its state, in a fixed order:
//     v.tensor("name", BufferView view, Shape shape);  // view is read on save, written on load
//     v.scalar("name", S& value);  // S: std::int64_t, double or std::string
//     v.child("name", U& sub);     // nested stateful object, its names prefixed by "name/"
//     v.loading()                  // true when restoring (so T can rebuild derived data)
// and, optionally, where the visitor has it (visitor_takes_parts; the checkpointer's save side,
// and its restore where visitor_loads_parts(v) says so: `held` is then written):
//     v.tensor_parts("name", BufferView held, Shape whole, const StateParts& parts);
// a tensor of shape `whole` of which this rank holds the elements `parts` (first element, count;
// ascending, disjoint), back to back in `held`; the ranks' parts together cover every element
// once. Sharded optimizer state is saved this way (GradientSync::shard_updates).
// Names are '/'-separated paths relative to the object. The same T must visit the same names with
// the same shapes on every rank that holds it. Checkpointers, comparers and hashers are visitors.
// Types that cannot be changed specialise dtrain::serializer<T> instead (see <dtrain/ckpt/...>).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain {

/// Parts of a tensor's elements held by one rank: (first element, count), ascending, disjoint.
using StateParts = std::vector<std::pair<std::size_t, std::size_t>>;

namespace detail {
struct ProbeVisitor {
  void tensor(const std::string&, BufferView, Shape) {}
  template <class S>
  void scalar(const std::string&, S&) {}
  template <class U>
  void child(const std::string&, U&) {}
  bool loading() const { return false; }
};

// The arenas a model holds now, shared (shared_ptr) between the model and the optimizers made
// from it: when the model replaces its arenas (fully sharded training frees the whole ones and
// keeps this rank's parts) it updates this and bumps `version`, and the optimizers follow
// before their next use instead of writing memory that is gone.
struct ArenaBinding {
  BufferView params, grads;  // the arenas in use
  std::size_t whole = 0;     // elements of the whole arenas
  StateParts parts;          // the elements of the whole arenas held, when they are parts
  std::uint64_t version = 0;
};
}  // namespace detail

/// True when T has a member template visit_state(V&).
template <class T, class = void>
struct has_visit_state : std::false_type {};
template <class T>
struct has_visit_state<
    T, std::void_t<decltype(std::declval<T&>().visit_state(std::declval<detail::ProbeVisitor&>()))>>
    : std::true_type {};
template <class T>
inline constexpr bool has_visit_state_v = has_visit_state<T>::value;

/// True when visitor V takes tensors held in parts: tensor_parts(name, BufferView, Shape,
/// const StateParts&).
template <class V, class = void>
struct visitor_takes_parts : std::false_type {};
template <class V>
struct visitor_takes_parts<V, std::void_t<decltype(std::declval<V&>().tensor_parts(
                                  std::declval<const std::string&>(), std::declval<BufferView>(),
                                  std::declval<Shape>(), std::declval<const StateParts&>()))>>
    : std::true_type {};

/// True when visitor V, while loading, fills tensors held in parts from the file as they are
/// (`bool loads_parts() const` returns true: the checkpointer's restore), so that an object
/// sharded over the ranks loads only its own parts instead of each tensor whole.
template <class V, class = void>
struct visitor_has_loads_parts : std::false_type {};
template <class V>
struct visitor_has_loads_parts<V,
                               std::void_t<decltype(bool(std::declval<const V&>().loads_parts()))>>
    : std::true_type {};
template <class V>
bool visitor_loads_parts([[maybe_unused]] const V& v) {
  if constexpr (visitor_takes_parts<V>::value && visitor_has_loads_parts<V>::value)
    return v.loads_parts();
  else
    return false;
}

}  // namespace dtrain
