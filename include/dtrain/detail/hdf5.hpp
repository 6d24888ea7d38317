// SPDX-License-Identifier: BSD-3-Clause
// dtrain: private HDF5 support shared by the data loader and the checkpoint code: the process
// lock and HDF5 session, error capture, handle ownership and the DTRAIN_CHECK_H5 check.
#pragma once

#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include <hdf5.h>

#include <dtrain/core/error.hpp>

namespace dtrain::detail {

/// Debian's parallel HDF5 (and most cluster builds) is compiled without thread safety, so no two
/// threads of a process may be inside the library at once; the Loader's background thread and the
/// asynchronous checkpoint writer are such threads. Every dtrain call into HDF5 holds this
/// process-wide recursive lock (recursive because helpers nest); other code calling HDF5 next to
/// a Loader or a Checkpointer must hold it as well.
inline std::recursive_mutex& h5_mutex() {
  static std::recursive_mutex m;
  return m;
}

/// The scope of dtrain's calls into HDF5: holds the process-wide HDF5 lock and turns off HDF5's
/// automatic printing of its error stack (dtrain puts the stack into the exception message
/// instead); the destructor restores the handler that was installed before, so an application's
/// own HDF5 error printing is left as it was. Nests (the lock is recursive; an inner session
/// restores the silenced state of the outer one). Local; one per thread at a time.
class H5Session {
 public:
  H5Session() : lock_(h5_mutex()) {
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

/// The current HDF5 error stack as one line ("HDF5: msg [minor] (function); ..."), innermost
/// first, then clears it. Call with h5_mutex held.
inline std::string h5_error_stack() {
  std::string out;
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    auto& s = *static_cast<std::string*>(data);
    if (n >= 6) return 0;  // the innermost entries are the informative ones; keep it short
    if (!s.empty()) s += "; ";
    char minor[128] = {0};
    if (H5Eget_msg(e->min_num, nullptr, minor, sizeof minor) < 0) minor[0] = 0;
    // Some drivers' descriptions hold a newline (sec2's write error ends its time stamp with
    // one); the message stays one line.
    for (const char* c = e->desc && *e->desc ? e->desc : minor; *c; ++c)
      s += *c == '\n' || *c == '\r' ? ' ' : *c;
    if (minor[0] && e->desc && *e->desc) s += std::string(" [") + minor + "]";
    if (e->func_name) s += std::string(" (") + e->func_name + ")";
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "no HDF5 error stack" : "HDF5: " + out;
}

/// Owns an hid_t and closes it with the matching H5?close. Move-only; converts to hid_t.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer c) noexcept : id_(id), close_(c) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const noexcept { return id_; }
  operator hid_t() const noexcept { return id_; }  // NOLINT: handles stand in for ids in calls
  explicit operator bool() const noexcept { return id_ >= 0; }

  /// Closes now and returns the close's status (a file close flushes, so its error matters).
  herr_t close() noexcept {
    herr_t rc = 0;
    if (id_ >= 0 && close_) {
      // Parallel HDF5 shuts itself down in MPI_Finalize; an object destroyed after that holds an
      // identifier that no longer exists, which is not an error worth printing.
      H5Session session;
      if (H5Iis_valid(id_) > 0) rc = close_(id_);
    }
    id_ = -1;
    return rc;
  }
  void reset() noexcept { (void)close(); }
  /// Gives up ownership without closing (the identifier leaks until the process ends). For
  /// destructors on the unwind path, where the close would be collective (see UnwindGuard).
  hid_t release() noexcept { return std::exchange(id_, -1); }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

/// Returns `rc` (an hid_t, herr_t or htri_t) when it is not negative; otherwise throws
/// dtrain::IoError naming `operation`, the context (`context()`, built only then), the call's
/// text and HDF5's error stack. Call with h5_mutex held. DTRAIN_CHECK_H5 is its front door.
template <class R, class Context>
R h5_check(R rc, const char* operation, const Context& context, const char* call_text) {
  if (rc < 0)
    raise<IoError>(operation, context() + ": " + call_text + " failed: " + h5_error_stack());
  return rc;
}

}  // namespace dtrain::detail

/// dtrain's one HDF5 check. Evaluates `call` once and yields its result (herr_t, hid_t or htri_t),
/// so it checks a statement and a call whose result is used alike; a negative result throws
/// dtrain::IoError whose message names the operation, `context` (stream syntax, evaluated only on
/// failure: say which file and dataset), the call and the HDF5 error stack. Call with
/// detail::h5_mutex() held.
/// Usage: DTRAIN_CHECK_H5(H5Dread(...), "Hdf5Dataset::read", "'" << file << "' dataset " << name);
///        H5Handle d(DTRAIN_CHECK_H5(H5Dopen2(file, path, H5P_DEFAULT), op, path), H5Dclose);
#define DTRAIN_CHECK_H5(call, operation, context)                \
  ::dtrain::detail::h5_check((call), (operation),                \
                             [&]() -> std::string {              \
                               std::ostringstream dtrain_h5_os_; \
                               dtrain_h5_os_ << context;         \
                               return dtrain_h5_os_.str();       \
                             },                                  \
                             #call)
