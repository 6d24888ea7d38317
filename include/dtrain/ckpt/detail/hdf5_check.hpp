// dtrain: HDF5 call checking, handle ownership and serialisation for the checkpoint code.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include <dtrain/core/detail/hdf5_mutex.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail::ckpt_h5 {

/// The HDF5 builds we target are not thread-safe: every checkpoint HDF5 call (including the
/// asynchronous writer's) holds the process-wide HDF5 lock that the data loader also takes.
inline std::recursive_mutex& ckpt_h5_mutex() { return hdf5_library_mutex(); }

/// Collects the innermost messages of the current HDF5 error stack ("H5Dwrite: can't ...").
inline std::string h5_error_text() {
  std::string out;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* s = static_cast<std::string*>(data);
    if (n < 3 && err) {
      if (!s->empty()) *s += "; ";
      *s += err->func_name ? err->func_name : "?";
      *s += ": ";
      *s += err->desc ? err->desc : "?";
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? std::string("HDF5 call failed") : out;
}

/// Holds the HDF5 lock and silences HDF5's own error printing while dtrain turns errors into
/// exceptions; restores the previous handler on exit.
class H5Session {
 public:
  H5Session() : lock_(ckpt_h5_mutex()) {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Session() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5Session(const H5Session&) = delete;
  H5Session& operator=(const H5Session&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

/// Owns one hid_t and closes it with the matching H5?close. Move-only.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const noexcept { return id_; }
  operator hid_t() const noexcept { return id_; }
  /// Closes now and reports failure (a file close flushes, so its error matters).
  herr_t close() noexcept {
    herr_t rc = 0;
    if (id_ >= 0 && closer_) rc = closer_(id_);
    id_ = -1;
    return rc;
  }
  void reset() noexcept { (void)close(); }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

/// Throws dtrain::IoError naming `operation`, `context`, the call and HDF5's own error text when
/// `rc` (an hid_t or herr_t) is negative; returns rc otherwise.
template <class R>
R h5_check(R rc, const char* operation, const std::string& context, const char* call_text) {
  if (rc < 0) raise<IoError>(operation, context + ": " + call_text + " failed: " + h5_error_text());
  return rc;
}

}  // namespace dtrain::detail::ckpt_h5

// The checkpoint code's HDF5 check. It is deliberately not named DTRAIN_CHECK_H5 and all of the
// helpers live in detail::ckpt_h5, so this header can be included next to the data subsystem's
// HDF5 support (which defines DTRAIN_CHECK_H5 and its own detail::H5Handle).
#define DTRAIN_CKPT_H5(call, operation, context) \
  ::dtrain::detail::ckpt_h5::h5_check((call), (operation), (context), #call)
