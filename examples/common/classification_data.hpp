// SPDX-License-Identifier: BSD-3-Clause
// A training and a test set of an HDF5 file in example 01's layout, opened and checked before a
// classifier trains on them (examples only, not part of the library).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include <dtrain/core/error.hpp>
#include <dtrain/data/hdf5.hpp>
#include <dtrain/train/agreed.hpp>
#include <dtrain/train/check_samples.hpp>

namespace dtrain_cli {

/// The sets of one file and the normalisation of their features.
struct ClassificationData {
  std::unique_ptr<dtrain::Hdf5Dataset> train, test;
  dtrain::Normalize norm;
};

namespace detail {
// Local: throws IoError unless the training and the test set fit a `classes`-class model and
// each other.
inline void check_sets(const dtrain::Hdf5Dataset& train, const dtrain::Hdf5Dataset& test,
                       std::int64_t classes, const std::string& op) {
  const std::string f = "'" + train.file() + "': ";
  auto storage = [](const dtrain::Hdf5Dataset& d) {
    return d.stored_as_bytes() ? "unsigned bytes" : "another type";
  };
  if (train.size() == 0) dtrain::raise<dtrain::IoError>(op, f + "the training set is empty");
  if (test.size() == 0) dtrain::raise<dtrain::IoError>(op, f + "the test set is empty");
  for (const auto* d : {&train, &test})
    if (d->num_classes() != 0 && d->num_classes() != classes)
      dtrain::raise<dtrain::IoError>(
          op, f + "the labels declare " + std::to_string(d->num_classes()) +
                  " classes (attribute num_classes) but the model has " + std::to_string(classes));
  if (train.sample_shape() != test.sample_shape())
    dtrain::raise<dtrain::IoError>(
        op, f + "train images have shape " + dtrain::to_string(train.sample_shape()) +
                " but test images " + dtrain::to_string(test.sample_shape()));
  if (train.stored_as_bytes() != test.stored_as_bytes())
    dtrain::raise<dtrain::IoError>(op, f + "train images are stored as " + storage(train) +
                                           " but test images as " + storage(test) +
                                           "; convert both the same way");
}

// Local: every label and feature of this rank's share of GROUP (errors name the file row).
inline void check_rows(dtrain::Hdf5Dataset& d, const std::string& group, std::int64_t classes,
                       const std::string& op, int rank, int world, dtrain::FeatureStats* stats) {
  dtrain::SampleCheck check;
  check.num_classes = classes;
  check.operation = op;
  check.labels_name = "'" + d.file() + "' dataset '" + group + "/labels'";
  check.features_name = "'" + d.file() + "' dataset '" + group + "/images'";
  dtrain::check_samples(d, rank, world, check, stats);
}
}  // namespace detail

/// Collective over `comm` (parallel HDF5 opens, agreed checks, one all-reduce). Opens
/// train/{images,labels} and test/{images,labels} of `file` on every rank, then checks that the
/// sets fit a `classes`-class model and each other (not empty, the num_classes attribute, the
/// same sample shape and storage type) and, each rank its share, every label and every feature
/// (NaN, Inf). A problem throws dtrain::AgreedError on every rank, naming "<program>: checking
/// the data", the file, the dataset and the row. Features stored as bytes are normalised by
/// `bytes_norm`; other types by the training set's own mean and standard deviation.
template <class Comm>
ClassificationData open_classification_data(Comm& comm, const std::string& file,
                                            std::int64_t classes, const std::string& program,
                                            const dtrain::Normalize& bytes_norm) {
  ClassificationData data;
  // One agreed step per open: an open is collective, so no rank may go on to the next alone.
  for (auto* set : {&data.train, &data.test})
    dtrain::agreed(comm, [&] {
      const std::string g = set == &data.train ? "train" : "test";
      *set = std::make_unique<dtrain::Hdf5Dataset>(file, g + "/images", g + "/labels",
                                                   comm.transport().mpi_comm());
    });
  dtrain::FeatureStats stats;
  const std::string op = program + ": checking the data";
  dtrain::agreed(comm, [&] {
    detail::check_sets(*data.train, *data.test, classes, op);
    detail::check_rows(*data.train, "train", classes, op, comm.rank(), comm.size(), &stats);
    detail::check_rows(*data.test, "test", classes, op, comm.rank(), comm.size(), nullptr);
  });
  data.norm = bytes_norm;
  if (!data.train->stored_as_bytes()) {
    double s[3] = {stats.sum, stats.sum_squares, stats.count};
    comm.allreduce(dtrain::BufferView(s, 3, dtrain::DType::f64), dtrain::ReduceOp::sum);
    const double mean = s[0] / s[2], var = std::max(0.0, s[1] / s[2] - mean * mean);
    data.norm = dtrain::Normalize{1.0f, static_cast<float>(mean),
                                  static_cast<float>(var > 0 ? std::sqrt(var) : 1.0)};
  }
  return data;
}

}  // namespace dtrain_cli
