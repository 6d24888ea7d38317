// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what a checkpoint can hold. The customisation point dtrain::serializer<T>, and the
// named references (dtrain::named, dtrain::per_rank) that checkpoint calls take.
#pragma once

#include <string>
#include <type_traits>

#include <dtrain/core/state.hpp>

namespace dtrain {

/// Customisation point: how the state of a T is visited (see <dtrain/core/state.hpp> for the
/// visitor calls). The primary template forwards to T::visit_state. Specialise it for types you
/// cannot change:
///
///     template <> struct dtrain::serializer<MyOpt> {
///       template <class V> static void visit(V& v, MyOpt& o) { v.scalar("lr", o.lr); ... }
///     };
///
/// visit must call the visitor in the same order with the same names on save and on load.
template <class T>
struct serializer {
  using dtrain_primary_serializer = void;
  template <class V>
  static void visit(V& v, T& obj) {
    static_assert(
        has_visit_state_v<T>,
        "dtrain::serializer<T>: T has no member `template <class V> void visit_state(V&)`;"
        " add one or specialise dtrain::serializer<T>");
    obj.visit_state(v);
  }
};

namespace detail {
// The primary template carries this marker; a user specialisation does not.
template <class T, class = void>
struct is_primary_serializer : std::false_type {};
template <class T>
struct is_primary_serializer<T, std::void_t<typename serializer<T>::dtrain_primary_serializer>>
    : std::true_type {};
}  // namespace detail

/// True when T can be checkpointed: it has visit_state, or serializer<T> is specialised.
template <class T>
inline constexpr bool is_serializable_v =
    has_visit_state_v<T> || !detail::is_primary_serializer<T>::value;

/// Visits `obj` through serializer<T>. Visitors call this for top-level objects and children.
template <class V, class T>
void visit_object(V& v, T& obj) {
  serializer<std::remove_cv_t<T>>::visit(v, obj);
}

/// How a checkpointed object is shared between ranks.
enum class Placement : unsigned char {
  replicated,  ///< identical on every rank (model, optimizer, schedule): stored once
  per_rank     ///< differs per rank (a rank's sampler cursor, a shard): stored once per rank
};

/// A reference to a stateful object with the name of its group in the checkpoint file.
/// Non-owning: the object must outlive the call it is passed to.
template <class T>
struct Named {
  std::string name;
  T* object;
  Placement placement;
};

/// Names a replicated object for Checkpointer::save / restore_latest: `named("model", model)`.
/// The name becomes the top-level HDF5 group; it must be a valid path component.
template <class T>
Named<T> named(std::string name, T& object) {
  return Named<T>{std::move(name), &object, Placement::replicated};
}

/// Names an object whose state differs per rank; each rank's copy is stored under
/// /ranks/<rank>/<name> and restored to the same rank.
template <class T>
Named<T> per_rank(std::string name, T& object) {
  return Named<T>{std::move(name), &object, Placement::per_rank};
}

}  // namespace dtrain
