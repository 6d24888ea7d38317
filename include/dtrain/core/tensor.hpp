// SPDX-License-Identifier: BSD-3-Clause
// dtrain: Tensor, an owning n-dimensional buffer of one dtype in one memory space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/core/allocator.hpp>
#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain {

/// Shape of a tensor: extents, outermost first (row-major).
using Shape = std::vector<std::int64_t>;

inline std::string to_string(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline std::size_t element_count(const Shape& s, const char* operation = "Shape") {
  std::size_t n = 1;
  for (auto e : s) {
    DTRAIN_REQUIRE(e >= 0, operation, "negative extent in shape " << to_string(s));
    n *= static_cast<std::size_t>(e);
  }
  return n;
}

/// Owning, row-major, contiguous buffer. Move-only (use clone() for a deep copy of host data).
/// Local object: not thread-safe for concurrent mutation; the memory comes from the allocator given
/// at construction (default: zeroed host memory), which must outlive the tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype, Allocator& alloc = default_allocator())
      : shape_(std::move(shape)), dtype_(dtype), alloc_(&alloc) {
    count_ = element_count(shape_, "Tensor");
    data_ = alloc_->allocate(count_ * size_of(dtype_), 64);
  }
  ~Tensor() { release(); }
  Tensor(Tensor&& o) noexcept { swap(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  /// Deep copy of a host tensor.
  Tensor clone() const {
    DTRAIN_REQUIRE(space() == Space::host, "Tensor::clone", "only host tensors can be cloned here");
    Tensor t(shape_, dtype_, *alloc_);
    if (bytes()) std::memcpy(t.data_, data_, bytes());
    return t;
  }

  const Shape& shape() const noexcept { return shape_; }
  std::int64_t dim(std::size_t i) const {
    DTRAIN_REQUIRE(i < shape_.size(), "Tensor::dim",
                   "axis " << i << " out of range for shape " << to_string(shape_));
    return shape_[i];
  }
  std::size_t rank() const noexcept { return shape_.size(); }
  DType dtype() const noexcept { return dtype_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * size_of(dtype_); }
  Space space() const noexcept { return alloc_ ? alloc_->space() : Space::host; }
  void* raw() noexcept { return data_; }
  const void* raw() const noexcept { return data_; }

  /// Typed host view; throws InvalidArgument if T is not the tensor's dtype.
  template <class T>
  span<T> as(const char* operation = "Tensor::as") {
    return view().as<T>(operation);
  }
  template <class T>
  span<const T> as(const char* operation = "Tensor::as") const {
    auto s = view().as<T>(operation);
    return span<const T>(s.data(), s.size());
  }
  BufferView view() const noexcept {
    return BufferView(const_cast<void*>(data_), count_, dtype_, space());
  }

  /// Changes the shape without moving data; the element count must stay the same.
  void reshape(Shape s) {
    DTRAIN_REQUIRE(element_count(s) == count_, "Tensor::reshape",
                   "cannot reshape " << to_string(shape_) << " to " << to_string(s));
    shape_ = std::move(s);
  }

 private:
  void release() noexcept {
    if (data_ && alloc_) alloc_->deallocate(data_, bytes());
    data_ = nullptr;
  }
  void swap(Tensor& o) noexcept {
    std::swap(shape_, o.shape_);
    std::swap(dtype_, o.dtype_);
    std::swap(count_, o.count_);
    std::swap(data_, o.data_);
    std::swap(alloc_, o.alloc_);
  }

  Shape shape_;
  DType dtype_ = DType::f32;
  std::size_t count_ = 0;
  void* data_ = nullptr;
  Allocator* alloc_ = &default_allocator();
};

}  // namespace dtrain
