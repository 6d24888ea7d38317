// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the training-loop helpers of train/ in one include: agreed errors, the run-directory
// lock, progress line, metrics and timing logs, step timing, data checks, distributed accuracy,
// the replica check and the JSON summary. Core only: no MPI, GPU runtime or HDF5.
#pragma once

#include <dtrain/train/agreed.hpp>
#include <dtrain/train/check_samples.hpp>
#include <dtrain/train/csv_log.hpp>
#include <dtrain/train/evaluate.hpp>
#include <dtrain/train/json_summary.hpp>
#include <dtrain/train/progress_line.hpp>
#include <dtrain/train/replica_check.hpp>
#include <dtrain/train/run_lock.hpp>
#include <dtrain/train/step_meter.hpp>
#include <dtrain/train/straggler_monitor.hpp>
#include <dtrain/train/training_log.hpp>
