// SPDX-License-Identifier: BSD-3-Clause
// dtrain: a C++17 span and a dtype-tagged untyped view.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/space.hpp>

namespace dtrain {

/// Non-owning view of `size()` contiguous elements of T. Local; as thread-safe as the memory it
/// points at. The caller owns the memory and keeps it alive while the span is used.
template <class T>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using size_type = std::size_t;
  using iterator = T*;

  constexpr span() noexcept = default;
  constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  template <std::size_t N>
  constexpr span(T (&arr)[N]) noexcept : data_(arr), size_(N) {}
  template <class U, class = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr span(const span<U>& other) noexcept : data_(other.data()), size_(other.size()) {}
  template <class C,
            class = std::enable_if_t<std::is_convertible_v<
                std::remove_pointer_t<decltype(std::declval<C&>().data())> (*)[], T (*)[]>>>
  constexpr span(C& container) noexcept : data_(container.data()), size_(container.size()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T* begin() const noexcept { return data_; }
  constexpr T* end() const noexcept { return data_ + size_; }
  constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }

  /// Elements [offset, offset+count). Throws InvalidArgument when the range is out of bounds.
  span subspan(std::size_t offset, std::size_t count) const {
    DTRAIN_REQUIRE(offset <= size_ && count <= size_ - offset, "span::subspan",
                   "range [" << offset << ", " << offset + count << ") outside span of " << size_);
    return span(data_ + offset, count);
  }
  span first(std::size_t count) const { return subspan(0, count); }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
span(T*, std::size_t) -> span<T>;
template <class T, class A>
span(std::vector<T, A>&) -> span<T>;
template <class T, class A>
span(const std::vector<T, A>&) -> span<const T>;

/// Untyped view of `count` elements of `dtype` in memory space `space`. The view does not own the
/// memory. Converting back to a typed span checks the dtype and the space.
struct BufferView {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Space space = Space::host;

  BufferView() = default;
  BufferView(void* d, std::size_t n, DType t, Space s = Space::host) noexcept
      : data(d), count(n), dtype(t), space(s) {}
  template <class T, class = std::enable_if_t<has_dtype_v<T>>>
  BufferView(span<T> s, Space sp = Space::host) noexcept
      : data(const_cast<std::remove_cv_t<T>*>(s.data())),
        count(s.size()),
        dtype(dtype_of_v<T>),
        space(sp) {}

  std::size_t bytes() const noexcept { return count * size_of(dtype); }

  /// Typed host view. Throws InvalidArgument naming `operation` when T does not match the dtype
  /// or when the memory is not host memory: device memory is never dereferenced on the host
  /// (copy it with the execution policy's copy_d2h first).
  template <class T>
  span<T> as(const char* operation = "BufferView::as") const {
    DTRAIN_REQUIRE(space == Space::host, operation,
                   "buffer of " << count << " " << name_of(dtype) << " lives in " << name_of(space)
                                << " memory, which the host must not dereference; copy it to "
                                   "host memory through the execution policy first");
    DTRAIN_REQUIRE(
        dtype == dtype_of_v<T>, operation,
        "buffer holds " << name_of(dtype) << " but " << name_of(dtype_of_v<T>) << " was requested");
    return span<T>(static_cast<T*>(data), count);
  }
  /// Typed view of memory in any space (for kernels that accept device pointers).
  template <class T>
  span<T> as_any_space(const char* operation = "BufferView::as_any_space") const {
    DTRAIN_REQUIRE(
        dtype == dtype_of_v<T>, operation,
        "buffer holds " << name_of(dtype) << " but " << name_of(dtype_of_v<T>) << " was requested");
    return span<T>(static_cast<T*>(data), count);
  }
  BufferView slice(std::size_t offset, std::size_t n) const {
    DTRAIN_REQUIRE(offset <= count && n <= count - offset, "BufferView::slice",
                   "range [" << offset << ", " << offset + n << ") outside view of " << count);
    return BufferView(static_cast<char*>(data) + offset * size_of(dtype), n, dtype, space);
  }
};

}  // namespace dtrain
