// dtrain: the checkpoint code's HDF5 session (lock + silenced automatic error printing); the
// handles and checks are the shared ones in <dtrain/detail/hdf5.hpp>.
#pragma once

#include <hdf5.h>

#include <mutex>

#include <dtrain/detail/hdf5.hpp>

namespace dtrain::detail::ckpt_h5 {

using detail::H5Handle;

/// Holds the HDF5 lock and silences HDF5's own error printing while dtrain turns errors into
/// exceptions; restores the previous handler on exit.
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

}  // namespace dtrain::detail::ckpt_h5
