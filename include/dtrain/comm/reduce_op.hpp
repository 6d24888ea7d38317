// SPDX-License-Identifier: BSD-3-Clause
// dtrain: ReduceOp lives in <dtrain/core/reduce_op.hpp>; this header keeps the comm/ spelling.
#pragma once

#include <dtrain/core/reduce_op.hpp>
