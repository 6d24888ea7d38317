// SPDX-License-Identifier: BSD-3-Clause
// dtrain: umbrella for the single-source device kernels (compile with nvcc or hipcc).
#pragma once

#include <dtrain/kernels/activation.cuh>
#include <dtrain/kernels/convert.cuh>
#include <dtrain/kernels/dropout.cuh>
#include <dtrain/kernels/gemm.cuh>
#include <dtrain/kernels/gpu.hpp>
#include <dtrain/kernels/layernorm.cuh>
#include <dtrain/kernels/loss.cuh>
#include <dtrain/kernels/memory.cuh>
#include <dtrain/kernels/optim.cuh>
#include <dtrain/kernels/reduce.cuh>
