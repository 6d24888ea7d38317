// SPDX-License-Identifier: BSD-3-Clause
// dtrain: training losses on host buffers (fused softmax cross-entropy, mean squared error).
#pragma once

#include <cstdint>

#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/kernels/host/loss.hpp>

namespace dtrain {

/// The loss Sequential::forward_backward applies to the model output. With integer labels, `mse`
/// regresses onto one-hot targets; real-valued targets use the overload that takes them.
enum class Loss : unsigned char { softmax_cross_entropy, mse };

constexpr const char* name_of(Loss l) noexcept {
  return l == Loss::softmax_cross_entropy ? "softmax_cross_entropy" : "mse";
}

/// Mean over `batch` rows of the cross-entropy of softmax(logits) against `labels` (int32, each in
/// [0, classes)), numerically stable (log-sum-exp). When `dlogits` is non-empty it receives
/// `scale` times the gradient of the mean loss (it may be the logits buffer itself). Local,
/// blocking; throws InvalidArgument on sizes or labels out of range.
template <class T>
double softmax_cross_entropy(span<const T> logits, span<const std::int32_t> labels,
                             std::int64_t batch, std::int64_t classes, span<T> dlogits = {},
                             double scale = 1.0) {
  DTRAIN_REQUIRE(batch >= 0 && classes > 0 &&
                     logits.size() == static_cast<std::size_t>(batch * classes) &&
                     labels.size() == static_cast<std::size_t>(batch),
                 "softmax_cross_entropy",
                 "logits[" << logits.size() << "] and labels[" << labels.size()
                           << "] do not match batch " << batch << " x " << classes << " classes");
  DTRAIN_REQUIRE(dlogits.empty() || dlogits.size() == logits.size(), "softmax_cross_entropy",
                 "dlogits has " << dlogits.size() << " elements, logits " << logits.size());
  return host::softmax_cross_entropy(logits.data(), labels.data(), batch, classes,
                                     dlogits.empty() ? nullptr : dlogits.data(), scale);
}

/// Mean over all elements of (pred - target)^2; `dpred` (optional, may be pred) receives `scale`
/// times its gradient. Local, blocking; throws InvalidArgument on size mismatch.
template <class T>
double mse(span<const T> pred, span<const T> target, span<T> dpred = {}, double scale = 1.0) {
  DTRAIN_REQUIRE(pred.size() == target.size(), "mse",
                 "pred has " << pred.size() << " elements, target " << target.size());
  DTRAIN_REQUIRE(dpred.empty() || dpred.size() == pred.size(), "mse",
                 "dpred has " << dpred.size() << " elements, pred " << pred.size());
  return host::mse(pred.data(), target.data(), 1, static_cast<std::int64_t>(pred.size()),
                   dpred.empty() ? nullptr : dpred.data(), scale);
}

}  // namespace dtrain
