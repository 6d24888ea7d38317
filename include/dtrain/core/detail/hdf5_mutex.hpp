// dtrain: the one lock around calls into the HDF5 library.
//
// Debian's parallel HDF5 (and most cluster builds) is compiled without thread safety, so no two
// threads of a process may be inside the library at once. The data loader's background thread
// and an asynchronous checkpoint writer are such threads; every dtrain component that calls HDF5
// takes this lock (recursive, because helpers nest). No HDF5 dependency here.
#pragma once

#include <mutex>

namespace dtrain::detail {

/// Process-wide recursive mutex serialising dtrain's calls into HDF5. Thread-safe.
inline std::recursive_mutex& hdf5_library_mutex() {
  static std::recursive_mutex m;
  return m;
}

}  // namespace dtrain::detail
