// SPDX-License-Identifier: BSD-3-Clause
// dtrain: reduction operators, shared by the collectives (comm/) and the reduction kernels
// (kernels/).
#pragma once

#include <string>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// Element-wise reduction applied by allreduce and reduce_scatter. `avg` is the sum divided by
/// the number of ranks (integers: truncated toward zero after the wrapped sum).
enum class ReduceOp : unsigned char { sum, avg, min, max, prod };

constexpr const char* name_of(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

/// Parses "sum", "avg", "min", "max" or "prod"; throws InvalidArgument otherwise.
inline ReduceOp reduce_op_from_name(const std::string& s) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod})
    if (s == name_of(op)) return op;
  raise<InvalidArgument>("reduce_op_from_name",
                         "unknown reduction '" + s + "' (sum avg min max prod)");
}

}  // namespace dtrain
