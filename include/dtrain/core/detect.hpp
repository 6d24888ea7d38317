// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the one way dtrain detects what a type provides (C++17, no concepts).
//
// A requirement is an alias template that names the expression or type it needs, for example
//
//   template <class T>
//   using rank_call = decltype(std::declval<const T&>().rank());
//
// and is asked with is_detected<rank_call, T> (the expression is well-formed),
// is_detected_exact<int, rank_call, T> (and has exactly that type) or
// detected_or_t<Fallback, Op, T> (its type where well-formed, else Fallback). A compile-time flag
// is detected the same way, through an alias that reads it as a std::bool_constant.
#pragma once

#include <type_traits>

namespace dtrain::detail {

/// Stands for "not detected" in detected_t; never constructed.
struct nonesuch {
  nonesuch() = delete;
  ~nonesuch() = delete;
  nonesuch(const nonesuch&) = delete;
  void operator=(const nonesuch&) = delete;
};

// The primary template answers "not detected"; the specialisation is chosen exactly when
// Op<Args...> names a type (std::void_t turns any such type into void).
template <class Fallback, class AlwaysVoid, template <class...> class Op, class... Args>
struct detector {
  using value_t = std::false_type;
  using type = Fallback;
};
template <class Fallback, template <class...> class Op, class... Args>
struct detector<Fallback, std::void_t<Op<Args...>>, Op, Args...> {
  using value_t = std::true_type;
  using type = Op<Args...>;
};

/// std::true_type when Op<Args...> is well-formed, else std::false_type.
template <template <class...> class Op, class... Args>
using is_detected = typename detector<nonesuch, void, Op, Args...>::value_t;

/// Op<Args...> where well-formed, else nonesuch.
template <template <class...> class Op, class... Args>
using detected_t = typename detector<nonesuch, void, Op, Args...>::type;

/// Op<Args...> where well-formed, else Fallback.
template <class Fallback, template <class...> class Op, class... Args>
using detected_or_t = typename detector<Fallback, void, Op, Args...>::type;

/// std::true_type when Op<Args...> is well-formed and exactly Expected.
template <class Expected, template <class...> class Op, class... Args>
using is_detected_exact = std::is_same<Expected, detected_t<Op, Args...>>;

}  // namespace dtrain::detail
