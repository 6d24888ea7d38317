// SPDX-License-Identifier: BSD-3-Clause
// dtrain: IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//
// Needs zlib at link time (-lz, CMake ZLIB::ZLIB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/detail/idx_file.hpp>
#include <dtrain/data/transform.hpp>

namespace dtrain {

/// The whole content of one IDX file. `data` holds the elements in host byte order.
struct IdxArray {
  /// IDX type code: 0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64.
  std::uint8_t type = 0x08;
  Shape shape;
  std::vector<unsigned char> data;
};

/// Reads an IDX file (plain or gzip, recognised by content) after validating its magic, its
/// dimensions and its length. Local, blocking; throws IoError naming the file on any problem.
inline IdxArray read_idx(const std::string& path) {
  detail::IdxFile f = detail::open_idx(path, "read_idx");
  IdxArray a;
  a.type = f.type;
  a.shape = f.shape;
  a.data.assign(f.data, f.data + f.data_bytes);
  const std::size_t es = detail::idx_type_size(f.type);
  if (es > 1)  // IDX stores big-endian
    for (std::size_t i = 0; i + es <= a.data.size(); i += es)
      for (std::size_t k = 0; k < es / 2; ++k) std::swap(a.data[i + k], a.data[i + es - 1 - k]);
  return a;
}

/// Options of IdxDataset.
struct IdxOptions {
  /// Labels must lie in [0, num_classes); 0 turns the range check off. The IDX format does not
  /// record the class count; 10 is that of MNIST and Fashion-MNIST.
  int num_classes = 10;
};

/// An image file and a label file in IDX format as one dataset: unsigned-byte images of any shape
/// [N, ...] and unsigned-byte labels [N]. Plain files are memory-mapped, so a rank pages in only
/// the samples it reads; gzip files are decompressed into memory once at construction. Both files
/// are validated up front (magic, dimensions, length, matching counts, label range).
/// Local; read() is thread-safe (the data is immutable after construction).
class IdxDataset {
 public:
  /// Blocking; throws IoError naming the file and the problem.
  IdxDataset(const std::string& images_path, const std::string& labels_path,
             IdxOptions options = {})
      : opt_(options) {
    const char* op = "IdxDataset";
    DTRAIN_REQUIRE(options.num_classes >= 0, op,
                   "num_classes " << options.num_classes << " is negative");
    images_ = detail::open_idx(images_path, op);
    labels_ = detail::open_idx(labels_path, op);
    if (images_.type != 0x08)
      raise<IoError>(op, "images '" + images_path + "' hold " +
                             detail::idx_type_name(images_.type) + " elements (type code " +
                             detail::hex_byte(images_.type) + "); expected unsigned bytes (0x08)");
    if (images_.shape.size() < 2)
      raise<IoError>(op, "images '" + images_path + "' have shape " + to_string(images_.shape) +
                             "; expected at least 2 dimensions [samples, ...]");
    if (labels_.type != 0x08 || labels_.shape.size() != 1)
      raise<IoError>(op, "labels '" + labels_path + "' hold " +
                             detail::idx_type_name(labels_.type) + " " + to_string(labels_.shape) +
                             "; expected unsigned bytes (type code 0x08) of shape [samples]");
    if (images_.shape[0] != labels_.shape[0])
      raise<IoError>(op, "images '" + images_path + "' hold " + std::to_string(images_.shape[0]) +
                             " samples but labels '" + labels_path + "' hold " +
                             std::to_string(labels_.shape[0]));
    shape_.assign(images_.shape.begin() + 1, images_.shape.end());
    elements_ = element_count(shape_);
    if (opt_.num_classes > 0)
      for (std::size_t i = 0; i < size(); ++i)
        if (labels_.data[i] >= opt_.num_classes)
          raise<IoError>(op, "labels '" + labels_path + "': label " +
                                 std::to_string(labels_.data[i]) + " of sample " +
                                 std::to_string(i) + " is outside [0, " +
                                 std::to_string(opt_.num_classes) + ")");
  }

  /// Number of samples.
  std::size_t size() const noexcept { return static_cast<std::size_t>(images_.shape[0]); }
  /// Shape of one image, e.g. [28, 28].
  Shape sample_shape() const { return shape_; }
  /// The class count labels were checked against (0: unchecked).
  int num_classes() const noexcept { return opt_.num_classes; }
  const std::string& images_path() const noexcept { return images_.path; }
  const std::string& labels_path() const noexcept { return labels_.path; }

  /// Raw bytes of sample i (sample_elements values). No bounds check.
  const std::uint8_t* image(std::size_t i) const noexcept { return images_.data + i * elements_; }
  std::int32_t label(std::size_t i) const noexcept { return labels_.data[i]; }

  /// Dataset requirement (<dtrain/data/dataset.hpp>). Thread-safe.
  void read(span<const std::int64_t> indices, span<float> features, span<std::int32_t> labels,
            const Normalize& transform) const {
    detail::check_read_args("IdxDataset::read", "images '" + images_.path + "'", size(), elements_,
                            indices, features, labels);
    transform.validate("IdxDataset::read");
    const detail::ByteTable table(transform);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::size_t s = static_cast<std::size_t>(indices[i]);
      table.apply(image(s), features.data() + i * elements_, elements_);
      labels[i] = label(s);
    }
  }

 private:
  IdxOptions opt_;
  detail::IdxFile images_, labels_;
  Shape shape_;
  std::size_t elements_ = 0;
};

}  // namespace dtrain
