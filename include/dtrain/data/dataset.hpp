// SPDX-License-Identifier: BSD-3-Clause
// dtrain: what the Loader requires of a dataset.
//
// A dataset D is a random-access collection of (features, label) samples:
//     std::size_t size() const;          // number of samples
//     Shape sample_shape() const;        // shape of one sample's features (no batch axis)
//     void read(span<const std::int64_t> indices, span<float> features,
//               span<std::int32_t> labels, const Normalize& transform);
// read() fills row i of `features` (sample_elements(d) floats) and labels[i] with sample
// indices[i], transformed; indices may repeat and come in any order. It must be safe to call from
// a background thread, also while another read of the same dataset runs (the Loader reads from
// its own thread, and several loaders may share a dataset). Bad indices give InvalidArgument,
// unreadable or inconsistent data IoError, naming the file and dataset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/data/transform.hpp>

namespace dtrain {

namespace detail {
template <class D>
using dataset_size_t = decltype(std::declval<const D&>().size());
template <class D>
using dataset_shape_t = decltype(std::declval<const D&>().sample_shape());
template <class D>
using dataset_read_t = decltype(std::declval<D&>().read(
    std::declval<span<const std::int64_t>>(), std::declval<span<float>>(),
    std::declval<span<std::int32_t>>(), std::declval<const Normalize&>()));
template <class D, template <class> class Op, class = void>
struct detects : std::false_type {};
template <class D, template <class> class Op>
struct detects<D, Op, std::void_t<Op<D>>> : std::true_type {};
}  // namespace detail

/// Detection traits for the dataset requirements above (one per member, so a static_assert can say
/// which one is missing).
template <class D>
inline constexpr bool dataset_has_size_v = detail::detects<D, detail::dataset_size_t>::value;
template <class D>
inline constexpr bool dataset_has_sample_shape_v =
    detail::detects<D, detail::dataset_shape_t>::value;
template <class D>
inline constexpr bool dataset_has_read_v = detail::detects<D, detail::dataset_read_t>::value;
/// True when D meets every dataset requirement.
template <class D>
inline constexpr bool is_dataset_v =
    dataset_has_size_v<D>&& dataset_has_sample_shape_v<D>&& dataset_has_read_v<D>;

namespace detail {
template <class D>
using dataset_collective_t =
    decltype(static_cast<bool>(std::declval<const D&>().collective_reads()));
}  // namespace detail

/// Optional requirement: `bool collective_reads() const`, true when read() is collective over the
/// ranks (every rank must call it equally often, in the same order). A Loader then reads in the
/// caller's thread, so that the number of reads never depends on how far a background thread got.
template <class D>
bool reads_collectively(const D& d) {
  if constexpr (detail::detects<D, detail::dataset_collective_t>::value)
    return static_cast<bool>(d.collective_reads());
  else
    return false;
}

/// Number of feature elements in one sample of `d`. Local, pure.
template <class D>
std::size_t sample_elements(const D& d) {
  return element_count(d.sample_shape(), "sample_elements");
}

namespace detail {

/// Checks the arguments of a dataset read: sizes agree and every index is in [0, n).
inline void check_read_args(const char* operation, const std::string& what, std::size_t n,
                            std::size_t elements, span<const std::int64_t> indices,
                            span<float> features, span<std::int32_t> labels) {
  DTRAIN_REQUIRE(features.size() == indices.size() * elements && labels.size() == indices.size(),
                 operation,
                 what << ": buffers for " << indices.size() << " samples need "
                      << indices.size() * elements << " features and " << indices.size()
                      << " labels, got " << features.size() << " and " << labels.size());
  for (std::size_t i = 0; i < indices.size(); ++i)
    DTRAIN_REQUIRE(indices[i] >= 0 && static_cast<std::uint64_t>(indices[i]) < n, operation,
                   what << ": sample index " << indices[i] << " (batch row " << i
                        << ") is outside [0, " << n << ")");
}

}  // namespace detail
}  // namespace dtrain
