// SPDX-License-Identifier: BSD-3-Clause
// dtrain: umbrella for the model headers (layers, losses, metrics, Sequential).
#pragma once

#include <dtrain/model/layers.hpp>
#include <dtrain/model/loss.hpp>
#include <dtrain/model/metrics.hpp>
#include <dtrain/model/sequential.hpp>
