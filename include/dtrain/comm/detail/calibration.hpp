// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the calibration behind `automatic` all-reduce (Communicator::cost_model). Collective.
//
// Three steps; the files named are under calibration/ unless said otherwise:
// 1. MEASURE the cost model (measure.hpp): alpha, beta, gamma, the shm and inter-node terms, the
//    fixed cost of a call and the cache switch, in interleaved rounds, a median per quantity,
//    agreed over ranks and fitted, so every rank holds the same model.
// 2. DECIDE (decide.hpp): the table the model gives, then checked against probes (probes.hpp:
//    every algorithm timed at 4 KiB to 4 MiB with the model in place): where a probe measured the
//    model's pick beaten beyond the noise, its winner runs over that probe's band of sizes.
// 3. STORE (tuning.hpp, beside this file): with a tuning file, the model and table of the first
//    job are read by every later job of the same shape instead of measuring again.
// The instruments both measurements share (the test hook, the agreement over ranks, registered
// buffers, medians) are in timing.hpp.
// Why so much care: on a loaded machine a single timing can be off by 10x, and a model fitted at
// one moment can be wrong by more than the gap between its first and second choice
// (benchmarks/RESULTS.md, "Automatic all-reduce under noise" and the sections after it).
// Estimated 0.1 s at 2 ranks on an idle 2-core machine; seconds when the machine is heavily
// loaded (allreduce_bench prints the time).
#pragma once

#include <utility>
#include <vector>

#include <dtrain/comm/allreduce_decision.hpp>
#include <dtrain/comm/cost_model.hpp>
#include <dtrain/comm/detail/calibration/decide.hpp>
#include <dtrain/comm/detail/calibration/measure.hpp>
#include <dtrain/comm/detail/calibration/probes.hpp>
#include <dtrain/comm/detail/calibration/timing.hpp>
#include <dtrain/comm/detail/collective_plan.hpp>
#include <dtrain/comm/detail/comm_state.hpp>
#include <dtrain/comm/topology.hpp>
#include <dtrain/core/timer.hpp>

namespace dtrain::detail {

/// The outcome of a calibration: the agreed model, the validated decision table, the probes.
struct Calibration {
  CostModel model;
  AllreduceDecisions decisions;
  std::vector<CalibrationProbe> probes;
  /// Bytes per rank from which the table is the model's alone: where the time budget skipped
  /// the remaining probes, the geometric middle between the last probe taken and the first one
  /// skipped; 1e300 when no probe was skipped for time.
  double validated_to = 1e300;
  double seconds = 0;  // wall time the calibration took on this rank
};

/// The last calibration this thread measured (a copy, for reports such as allreduce_bench's
/// probe table; each loopback rank is a thread of its own). Empty before the first.
inline Calibration& last_calibration() {
  thread_local Calibration c;
  return c;
}

/// Measures the model and its validated decision table over `st`'s transport (collective: every
/// rank calls it at the same point of its collective sequence; queued collectives are drained
/// first). Every rank returns the same model and table.
/// `view` says how the model is applied (flat_model_view(p) for p ranks on one node,
/// topology_model_view with the transport's node grouping otherwise).
template <class Transport>
Calibration calibrate(CommState<Transport>& st, const ModelView& view) {
  const double t0 = now_seconds();
  st.engine.drain();
  {  // The calibration is a collective of its own, so its fingerprint keeps ranks in step.
    PlanSpec s;
    s.kind = CollectiveKind::calibrate;  // "calibrate #N" names it in errors
    PlanImpl<Transport> cal(st, s);
    execute_in_order(st, cal);
  }
  Calibration c;
  c.model = ModelMeasurement<Transport>(st).run();
  c.decisions = model_decisions(c.model, view);
  if (st.transport->size() > 1) {
    ProbeResults r = ProbeMeasurement<Transport>(st).run(c.model, c.decisions, view);
    c.probes = std::move(r.probes);
    c.validated_to = r.validated_to;
    // Also without a replaced pick: a size between probes may have another model pick than the
    // probe's own, beaten there.
    if (!c.probes.empty()) c.decisions = apply_probes(c.model, view, c.probes, c.validated_to);
  }
  c.seconds = now_seconds() - t0;
  last_calibration() = c;
  return c;
}

/// The model alone (the collective calibration, decision table discarded).
template <class Transport>
CostModel measure_cost_model(CommState<Transport>& st) {
  Transport& t = *st.transport;
  return calibrate(st, topology_model_view(t.size(), node_map_of(t).shape())).model;
}

}  // namespace dtrain::detail
