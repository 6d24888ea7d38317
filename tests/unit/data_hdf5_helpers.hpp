// Test helpers: write small HDF5 files with plain serial calls (independent of Hdf5Dataset).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <hdf5.h>

#include <dtrain/core/tensor.hpp>

namespace dtrain::test {

struct H5Spec {
  std::string name;  // path inside the file, groups created as needed
  hid_t file_type;   // e.g. H5T_STD_U8LE
  hid_t mem_type;    // type of `data` in memory
  Shape shape;
  const void* data = nullptr;
  hsize_t chunk_rows = 0;  // 0: contiguous
  int gzip = 0;
  long long num_classes = -1;  // >= 0: write an integer attribute "num_classes"
};

inline void h5_check(long long r, const std::string& what) {
  if (r < 0) throw std::runtime_error("test HDF5 writer failed: " + what);
}

/// Writes the datasets into a new file (serial, default driver).
inline void write_h5(const std::string& path, const std::vector<H5Spec>& specs) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  h5_check(f, path);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  for (const auto& s : specs) {
    std::vector<hsize_t> dims(s.shape.begin(), s.shape.end());
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (s.chunk_rows > 0) {
      std::vector<hsize_t> chunk = dims;
      chunk[0] = s.chunk_rows;
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
      if (s.gzip > 0) H5Pset_deflate(dcpl, static_cast<unsigned>(s.gzip));
    }
    const hid_t d = H5Dcreate2(f, s.name.c_str(), s.file_type, space, lcpl, dcpl, H5P_DEFAULT);
    h5_check(d, s.name);
    if (s.data) h5_check(H5Dwrite(d, s.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data), s.name);
    if (s.num_classes >= 0) {
      const hid_t as = H5Screate(H5S_SCALAR);
      const hid_t a = H5Acreate2(d, "num_classes", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
      h5_check(H5Awrite(a, H5T_NATIVE_LLONG, &s.num_classes), "attribute");
      H5Aclose(a);
      H5Sclose(as);
    }
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  H5Pclose(lcpl);
  h5_check(H5Fclose(f), path);
}

}  // namespace dtrain::test
