// Fuzz target: Hdf5Dataset's open and read path (validation of the features and labels
// datasets, label range and num_classes attribute, chunk cache and direct-read setup, row
// reads). The input does not go to HDF5's own file parser: it chooses what a well-formed HDF5
// file holds (types, byte order, ranks, extents, layout, attribute, label values, which objects
// exist), the file is written with the HDF5 API, then opened on the POSIX driver and read. Any
// outcome other than a dtrain::Error or rows read correctly is a bug in dtrain.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/data/hdf5.hpp>

#include "fuzz_support.hpp"

namespace {

hid_t pick_type(std::uint8_t b) {
  static const hid_t* types[] = {&H5T_STD_U8LE,   &H5T_STD_I8LE,   &H5T_STD_U16BE,  &H5T_STD_I16LE,
                                 &H5T_STD_I32LE,  &H5T_STD_U32BE,  &H5T_STD_I64LE,  &H5T_STD_U64LE,
                                 &H5T_IEEE_F32LE, &H5T_IEEE_F64BE, &H5T_IEEE_F64LE, &H5T_C_S1};
  return *types[b % (sizeof types / sizeof types[0])];
}

/// Writes one dataset of `type` with `dims`, filled from the input (HDF5 converts from bytes or
/// doubles as the type needs); chunked when asked. Returns false when HDF5 refuses the layout.
bool write_dataset(hid_t file, const char* name, hid_t type, const std::vector<hsize_t>& dims,
                   bool chunked, dtrain::fuzz::Bytes& in) {
  hid_t space = dims.empty()
                    ? H5Screate(H5S_SCALAR)
                    : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  if (chunked && !dims.empty() && n > 0) {
    std::vector<hsize_t> chunk(dims);
    chunk[0] = 1 + in.u8() % dims[0];
    H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  }
  hid_t t = H5Tcopy(type);
  if (H5Tget_class(t) == H5T_STRING) H5Tset_size(t, 4);
  hid_t d = H5Dcreate2(file, name, t, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  bool ok = d >= 0;
  if (ok && n > 0 && H5Tget_class(t) != H5T_STRING) {
    std::vector<double> v(n);
    for (auto& x : v) {
      const std::uint8_t b = in.u8();
      x = b == 255 ? -1.0 : b == 254 ? 1e300 : static_cast<double>(b % 16);
    }
    ok = H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0;
  }
  if (d >= 0) H5Dclose(d);
  H5Tclose(t);
  H5Pclose(dcpl);
  H5Sclose(space);
  return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dtrain::fuzz::Bytes in(data, size);
  const std::string& path = dtrain::fuzz::scratch_file(nullptr, 0, ".h5");
  {
    dtrain::detail::H5Session session;
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) return 0;
    const std::uint8_t flags = in.u8();
    // Features: rank 0..4, extents 0..5 (rows 0..8).
    std::vector<hsize_t> fdims(in.u8() % 5);
    for (std::size_t i = 0; i < fdims.size(); ++i) fdims[i] = in.u8() % (i == 0 ? 9 : 6);
    std::vector<hsize_t> ldims(in.u8() % 3);
    for (std::size_t i = 0; i < ldims.size(); ++i) ldims[i] = in.u8() % 9;
    const hid_t ftype = pick_type(in.u8()), ltype = pick_type(in.u8());
    if (flags & 1) H5Gclose(H5Gcreate2(file, "g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    const char* fname = flags & 1 ? "g/x" : "x";
    if (!(flags & 2)) write_dataset(file, fname, ftype, fdims, flags & 4, in);
    if (!(flags & 8)) {
      write_dataset(file, "y", ltype, ldims, flags & 16, in);
      if (flags & 32) {  // a num_classes attribute of some type and value
        hid_t d = H5Dopen2(file, "y", H5P_DEFAULT);
        if (d >= 0) {
          hid_t sp = H5Screate(H5S_SCALAR);
          hid_t at = pick_type(in.u8());
          hid_t t = H5Tcopy(at);
          if (H5Tget_class(t) == H5T_STRING) H5Tset_size(t, 4);
          hid_t a = H5Acreate2(d, "num_classes", t, sp, H5P_DEFAULT, H5P_DEFAULT);
          const double v = static_cast<double>(static_cast<std::int8_t>(in.u8()));
          if (a >= 0) {
            if (H5Tget_class(t) != H5T_STRING) H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
            H5Aclose(a);
          }
          H5Tclose(t);
          H5Sclose(sp);
          H5Dclose(d);
        }
      }
    }
    H5Fclose(file);
  }
  dtrain::Hdf5Options opt;
  opt.driver = dtrain::Hdf5Driver::posix;
  opt.num_classes = in.u8() % 4 == 0 ? 10 : 0;
  opt.label_cache_bytes = in.u8() % 2 ? 0 : opt.label_cache_bytes;
  opt.direct_reads = in.u8() % 2;
  opt.chunk_cache_bytes = 1 + in.u8();
  try {
    dtrain::Hdf5Dataset ds(path, (in.u8() & 1) ? "g/x" : "x", "y", opt);
    const std::size_t n = ds.size(), elems = dtrain::element_count(ds.sample_shape());
    std::vector<std::int64_t> idx(in.u8() % 5);
    for (auto& i : idx) i = n ? static_cast<std::int64_t>(in.u8() % n) : 0;
    std::vector<float> x(idx.size() * elems);
    std::vector<std::int32_t> y(idx.size());
    ds.read(idx, x, y, dtrain::Normalize{});
    for (auto label : y)
      if (label < 0 || (ds.num_classes() > 0 && label >= ds.num_classes())) __builtin_trap();
  } catch (const dtrain::Error&) {
  }
  return 0;
}
