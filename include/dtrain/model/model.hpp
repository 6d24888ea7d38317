// SPDX-License-Identifier: BSD-3-Clause
// dtrain: umbrella for the model headers (layers, losses, metrics, Sequential, ParameterSet,
// check_gradients).
#pragma once

#include <dtrain/model/gradient_check.hpp>
#include <dtrain/model/layers.hpp>
#include <dtrain/model/loss.hpp>
#include <dtrain/model/metrics.hpp>
#include <dtrain/model/parameter_set.hpp>
#include <dtrain/model/sequential.hpp>
