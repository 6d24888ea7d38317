// SPDX-License-Identifier: BSD-3-Clause
// dtrain: umbrella for the optimizers, schedules and gradient clipping.
#pragma once

#include <dtrain/optim/adamw.hpp>
#include <dtrain/optim/clip.hpp>
#include <dtrain/optim/schedule.hpp>
#include <dtrain/optim/sgd.hpp>
