// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the HDF5 checkpoint format (schema in docs/checkpoint-format.md). Opt-in: needs the
// dtrain::hdf5 component (parallel HDF5). Including this header also brings dtrain::Checkpointer,
// whose default format this is.
#pragma once

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/ckpt/checkpointer.hpp>
#include <dtrain/ckpt/crc32c.hpp>
#include <dtrain/ckpt/detail/flat_blocks.hpp>
#include <dtrain/ckpt/detail/fs.hpp>
#include <dtrain/ckpt/detail/hdf5_check.hpp>
#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {

namespace detail::ckpt_h5 {

#ifdef H5_HAVE_PARALLEL
template <class Comm, class = void>
struct comm_has_mpi_comm : std::false_type {};
template <class Comm>
struct comm_has_mpi_comm<Comm, std::void_t<decltype(static_cast<MPI_Comm>(
                                   std::declval<Comm&>().transport().mpi_comm()))>>
    : std::true_type {};
#else
template <class Comm>
struct comm_has_mpi_comm : std::false_type {};
#endif

inline H5Handle h5_type_for(DType t, bool file) {
  const char* op = "checkpoint HDF5 type";
  auto copy = [&](hid_t base) {
    return H5Handle(DTRAIN_CHECK_H5(H5Tcopy(base), op, name_of(t)), H5Tclose);
  };
  switch (t) {
    case DType::f32: return copy(file ? H5T_IEEE_F32LE : H5T_NATIVE_FLOAT);
    case DType::f64: return copy(file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE);
    case DType::i32: return copy(file ? H5T_STD_I32LE : H5T_NATIVE_INT32);
    case DType::i64: return copy(file ? H5T_STD_I64LE : H5T_NATIVE_INT64);
    case DType::f16:
    case DType::bf16: {
      // IEEE binary16 (1-5-10, bias 15) or bfloat16 (1-8-7, bias 127), described to HDF5 as
      // 16-bit floats so generic readers (h5py, h5dump) see floating-point values.
      H5Handle h = copy(file ? H5T_IEEE_F32LE : H5T_NATIVE_FLOAT);
      const bool half = t == DType::f16;
      DTRAIN_CHECK_H5(H5Tset_fields(h, 15, half ? 10 : 7, half ? 5 : 8, 0, half ? 10 : 7), op,
                      name_of(t));
      DTRAIN_CHECK_H5(H5Tset_precision(h, 16), op, name_of(t));
      DTRAIN_CHECK_H5(H5Tset_size(h, 2), op, name_of(t));
      DTRAIN_CHECK_H5(H5Tset_ebias(h, half ? 15 : 127), op, name_of(t));
      return h;
    }
  }
  raise<InvalidArgument>(op, "unknown dtype");
}

inline H5Handle h5_string_type(std::size_t len) {
  const char* op = "checkpoint HDF5 type";
  H5Handle h(DTRAIN_CHECK_H5(H5Tcopy(H5T_C_S1), op, "string"), H5Tclose);
  DTRAIN_CHECK_H5(H5Tset_size(h, std::max<std::size_t>(len, 1)), op, "string");
  DTRAIN_CHECK_H5(H5Tset_strpad(h, H5T_STR_NULLPAD), op, "string");
  DTRAIN_CHECK_H5(H5Tset_cset(h, H5T_CSET_UTF8), op, "string");
  return h;
}

inline H5Handle h5_dataspace(const Shape& shape) {
  const char* op = "checkpoint HDF5 dataspace";
  if (shape.empty())
    return H5Handle(DTRAIN_CHECK_H5(H5Screate(H5S_SCALAR), op, "scalar"), H5Sclose);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return H5Handle(
      DTRAIN_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), op,
                      to_string(shape)),
      H5Sclose);
}

// Attribute writers. In a parallel file every rank calls them with identical values.
// One scalar attribute of file type `file_type`, written from `value` in memory type `mem_type`.
inline void h5_put_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                        const void* value, const std::string& where) {
  const char* op = "checkpoint write";
  H5Handle sp = h5_dataspace({});
  H5Handle a(DTRAIN_CHECK_H5(H5Acreate2(obj, name, file_type, sp, H5P_DEFAULT, H5P_DEFAULT), op,
                             where + "@" + name),
             H5Aclose);
  DTRAIN_CHECK_H5(H5Awrite(a, mem_type, value), op, where + "@" + name);
}
inline void h5_put_attr_i64(hid_t obj, const char* name, std::int64_t v, const std::string& where) {
  h5_put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, where);
}
inline void h5_put_attr_u32(hid_t obj, const char* name, std::uint32_t v,
                            const std::string& where) {
  h5_put_attr(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &v, where);
}
inline void h5_put_attr_f64(hid_t obj, const char* name, double v, const std::string& where) {
  h5_put_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, where);
}
inline void h5_put_attr_str(hid_t obj, const char* name, const std::string& v,
                            const std::string& where) {
  H5Handle ty = h5_string_type(v.size());
  std::string padded = v;
  if (padded.empty()) padded.push_back('\0');
  h5_put_attr(obj, name, ty, ty, padded.data(), where);
}

/// Reads a scalar attribute of any integer, float or fixed-length string type.
struct H5AttrValue {
  EntryKind kind = EntryKind::i64;
  std::int64_t i64 = 0;
  double f64 = 0;
  std::string str;
};

inline H5AttrValue h5_get_attr(hid_t obj, const char* name, const std::string& where) {
  const char* op = "checkpoint read";
  const std::string ctx = where + "@" + name;
  H5Handle a(DTRAIN_CHECK_H5(H5Aopen(obj, name, H5P_DEFAULT), op, ctx), H5Aclose);
  H5Handle sp(DTRAIN_CHECK_H5(H5Aget_space(a), op, ctx), H5Sclose);
  if (H5Sget_simple_extent_npoints(sp) != 1)
    raise<IoError>(op, ctx + ": attribute is not a single value");
  H5Handle ty(DTRAIN_CHECK_H5(H5Aget_type(a), op, ctx), H5Tclose);
  H5AttrValue v;
  switch (H5Tget_class(ty)) {
    case H5T_INTEGER:
      v.kind = EntryKind::i64;
      DTRAIN_CHECK_H5(H5Aread(a, H5T_NATIVE_INT64, &v.i64), op, ctx);
      break;
    case H5T_FLOAT:
      v.kind = EntryKind::f64;
      DTRAIN_CHECK_H5(H5Aread(a, H5T_NATIVE_DOUBLE, &v.f64), op, ctx);
      break;
    case H5T_STRING: {
      v.kind = EntryKind::str;
      if (H5Tis_variable_str(ty) > 0) raise<IoError>(op, ctx + ": variable-length string");
      const std::size_t n = H5Tget_size(ty);
      std::string buf(n, '\0');
      DTRAIN_CHECK_H5(H5Aread(a, ty, buf.data()), op, ctx);
      while (!buf.empty() && buf.back() == '\0') buf.pop_back();
      v.str = std::move(buf);
      break;
    }
    default: raise<IoError>(op, ctx + ": unsupported attribute type");
  }
  return v;
}

inline std::int64_t h5_get_i64(hid_t obj, const char* name, const std::string& where) {
  auto v = h5_get_attr(obj, name, where);
  if (v.kind != EntryKind::i64)
    raise<IoError>("checkpoint read", where + "@" + name + ": expected an integer attribute");
  return v.i64;
}
inline std::string h5_get_str(hid_t obj, const char* name, const std::string& where) {
  auto v = h5_get_attr(obj, name, where);
  if (v.kind != EntryKind::str)
    raise<IoError>("checkpoint read", where + "@" + name + ": expected a string attribute");
  return v.str;
}

/// Creates every missing group along `path` ("/a/b/c").
inline void h5_ensure_group(hid_t file, const std::string& path) {
  const char* op = "checkpoint write";
  std::size_t pos = 1;
  while (pos <= path.size()) {
    auto end = path.find('/', pos);
    if (end == std::string::npos) end = path.size();
    const std::string sub = path.substr(0, end);
    if (DTRAIN_CHECK_H5(H5Lexists(file, sub.c_str(), H5P_DEFAULT), op, sub) == 0)
      H5Handle(DTRAIN_CHECK_H5(H5Gcreate2(file, sub.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                               op, sub),
               H5Gclose);
    pos = end + 1;
  }
}

/// How this process takes part in writing a file.
struct H5WriteRole {
  bool parallel = false;  // opened through MPI-IO by every rank
  bool slices = false;    // replicated tensors split along axis 0 over the ranks
  int rank = 0;
  int size = 1;
};

/// Adds to selection `sel` (of an array of shape `dims`, at least one axis) the elements
/// [first, first + n) in row-major order, as the blocks that make up that run; `fresh` says
/// whether `sel` holds nothing of these runs yet (it is then replaced), and is cleared.
inline void h5_select_run(hid_t sel, const std::vector<std::uint64_t>& dims, std::uint64_t first,
                          std::uint64_t n, bool& fresh, const char* op, const std::string& ctx) {
  for (const FlatBlock& b : flat_range_blocks(dims, first, n)) {
    const std::vector<hsize_t> start(b.start.begin(), b.start.end());
    const std::vector<hsize_t> cnt(b.count.begin(), b.count.end());
    DTRAIN_CHECK_H5(H5Sselect_hyperslab(sel, fresh ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(),
                                        nullptr, cnt.data(), nullptr),
                    op, ctx);
    fresh = false;
  }
}

/// Collective over the file's ranks (a parallel write): this rank's parts of a tensor held in
/// parts, from its back-to-back data into the whole tensor's dataset `d` (file space `fspace`):
/// each part is a run of elements in row-major order, selected as the blocks that make it up.
/// A rank without parts takes part with an empty selection.
inline void h5_write_parts(hid_t d, hid_t mtype, hid_t fspace, const CkptEntry& e, hid_t xfer) {
  const char* op = "checkpoint write";
  std::size_t held = 0;
  for (const auto& part : e.parts) held += part.second;
  H5Handle fsel(DTRAIN_CHECK_H5(H5Scopy(fspace), op, e.path), H5Sclose);
  const hsize_t mdim = held ? static_cast<hsize_t>(held) : 1;
  H5Handle msel(DTRAIN_CHECK_H5(H5Screate_simple(1, &mdim, nullptr), op, e.path), H5Sclose);
  if (held == 0) {
    DTRAIN_CHECK_H5(H5Sselect_none(fsel), op, e.path);
    DTRAIN_CHECK_H5(H5Sselect_none(msel), op, e.path);
  } else if (!e.whole.empty()) {  // a 0-d tensor's one element is selected whole already
    const std::vector<std::uint64_t> dims(e.whole.begin(), e.whole.end());
    bool fresh = true;
    for (const auto& [first, n] : e.parts) h5_select_run(fsel, dims, first, n, fresh, op, e.path);
  }
  static const unsigned char nothing = 0;  // HDF5 wants a buffer even for an empty selection
  DTRAIN_CHECK_H5(H5Dwrite(d, mtype, msel, fsel, xfer, held ? e.data : &nothing), op, e.path);
}

/// Local (rank 0's serial write of a tensor held in parts): the runs that m.write_parts hands
/// over, each into its place in the whole tensor's dataset `d` (file space `fspace`).
inline void h5_write_streamed(hid_t d, hid_t mtype, hid_t fspace, const CkptEntry& e,
                              const CkptManifest& m, hid_t xfer) {
  const char* op = "checkpoint write";
  const std::vector<std::uint64_t> dims(e.whole.begin(), e.whole.end());
  m.write_parts(e, [&](std::size_t first, std::size_t count, const void* data) {
    if (count == 0) return;
    H5Handle fsel(DTRAIN_CHECK_H5(H5Scopy(fspace), op, e.path), H5Sclose);
    bool fresh = true;
    if (!dims.empty()) h5_select_run(fsel, dims, first, count, fresh, op, e.path);
    const hsize_t mdim = static_cast<hsize_t>(count);
    H5Handle msel(DTRAIN_CHECK_H5(H5Screate_simple(1, &mdim, nullptr), op, e.path), H5Sclose);
    DTRAIN_CHECK_H5(H5Dwrite(d, mtype, msel, fsel, xfer, data), op, e.path);
  });
}

inline void h5_write_manifest(hid_t file, const CkptManifest& m, const H5WriteRole& role) {
  const char* op = "checkpoint write";
  h5_put_attr_str(file, "format", checkpoint_format_name, "/");
  h5_put_attr_i64(file, "format_version", m.format_version, "/");
  h5_put_attr_str(file, "library_version", m.library_version, "/");
  h5_put_attr_i64(file, "step", m.step, "/");
  h5_put_attr_i64(file, "world_size", m.world_size, "/");
  h5_put_attr_f64(file, "created_unix", m.created_unix, "/");
  h5_put_attr_str(file, "write_strategy", m.strategy, "/");
  h5_put_attr_str(file, "run_id", m.run_id, "/");
  h5_put_attr_i64(file, "shared_step", m.shared_step, "/");
  h5_put_attr_i64(file, "entry_count", static_cast<std::int64_t>(m.entries.size()), "/");

  H5Handle indep(DTRAIN_CHECK_H5(H5Pcreate(H5P_DATASET_XFER), op, "transfer list"), H5Pclose);
  H5Handle coll(DTRAIN_CHECK_H5(H5Pcreate(H5P_DATASET_XFER), op, "transfer list"), H5Pclose);
#ifdef H5_HAVE_PARALLEL
  if (role.parallel) {
    DTRAIN_CHECK_H5(H5Pset_dxpl_mpio(indep, H5FD_MPIO_INDEPENDENT), op, "transfer list");
    DTRAIN_CHECK_H5(H5Pset_dxpl_mpio(coll, H5FD_MPIO_COLLECTIVE), op, "transfer list");
  }
#endif

  {  // The configuration string: a dataset, so that any length fits and it carries a checksum.
    H5Handle sp = h5_dataspace({});
    H5Handle ty = h5_string_type(m.config.size());
    H5Handle d(
        DTRAIN_CHECK_H5(H5Dcreate2(file, "/config", ty, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                        op, "/config"),
        H5Dclose);
    std::string padded = m.config;
    if (padded.empty()) padded.push_back('\0');
    if (!role.parallel || role.rank == 0)
      DTRAIN_CHECK_H5(H5Dwrite(d, ty, H5S_ALL, H5S_ALL, indep, padded.data()), op, "/config");
    h5_put_attr_u32(d, "crc32c", crc32c(m.config.data(), m.config.size()), "/config");
    if (!role.parallel) DTRAIN_CHECK_H5(d.close(), op, "/config");
  }

  std::vector<std::pair<const CkptEntry*, H5Handle>> datasets;
  for (const CkptEntry& e : m.entries) {
    const std::string parent = parent_path(e.path);
    h5_ensure_group(file, parent);
    if (e.kind != EntryKind::tensor) {
      H5Handle g(DTRAIN_CHECK_H5(H5Gopen2(file, parent.c_str(), H5P_DEFAULT), op, parent),
                 H5Gclose);
      const std::string leaf = leaf_name(e.path);
      if (e.kind == EntryKind::i64) h5_put_attr_i64(g, leaf.c_str(), e.i64, parent);
      if (e.kind == EntryKind::f64) h5_put_attr_f64(g, leaf.c_str(), e.f64, parent);
      if (e.kind == EntryKind::str) h5_put_attr_str(g, leaf.c_str(), e.str, parent);
      continue;
    }
    H5Handle ftype = h5_type_for(e.dtype, true);
    H5Handle mtype = h5_type_for(e.dtype, false);
    // A tensor held in parts has the whole tensor's dataset (assembled for rank 0's write, the
    // entry's shape is already the whole one; in a parallel write each rank holds its parts).
    const Shape& dims = e.sharded ? e.whole : e.shape;
    H5Handle fspace = h5_dataspace(dims);
    H5Handle d(DTRAIN_CHECK_H5(H5Dcreate2(file, e.path.c_str(), ftype, fspace, H5P_DEFAULT,
                                          H5P_DEFAULT, H5P_DEFAULT),
                               op, e.path),
               H5Dclose);
    const std::size_t count = element_count(dims);
    if (count > 0) {
      if (!role.parallel && e.sharded && m.write_parts) {
        h5_write_streamed(d, mtype, fspace, e, m, indep);
      } else if (!role.parallel) {
        DTRAIN_CHECK_H5(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, indep, e.data), op, e.path);
      } else if (e.sharded) {
        h5_write_parts(d, mtype, fspace, e, coll);
      } else if (e.owner >= 0 || !role.slices || e.shape.empty()) {
        // One writer: the owner of per-rank state, or rank 0 for replicated state.
        const int writer = e.owner >= 0 ? e.owner : 0;
        if (role.rank == writer)
          DTRAIN_CHECK_H5(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, indep, e.data), op, e.path);
      } else {
        // Disjoint slices along axis 0, every rank in one collective write.
        const hsize_t rows = static_cast<hsize_t>(e.shape[0]);
        const hsize_t lo = rows * static_cast<hsize_t>(role.rank) / static_cast<hsize_t>(role.size);
        const hsize_t hi =
            rows * static_cast<hsize_t>(role.rank + 1) / static_cast<hsize_t>(role.size);
        std::vector<hsize_t> start(e.shape.size(), 0), cnt(e.shape.begin(), e.shape.end());
        start[0] = lo;
        cnt[0] = hi - lo;
        H5Handle fsel(DTRAIN_CHECK_H5(H5Scopy(fspace), op, e.path), H5Sclose);
        std::vector<hsize_t> mdims(cnt);
        if (mdims[0] == 0) mdims[0] = 1;
        H5Handle msel(
            DTRAIN_CHECK_H5(H5Screate_simple(static_cast<int>(mdims.size()), mdims.data(), nullptr),
                            op, e.path),
            H5Sclose);
        const char* src = static_cast<const char*>(e.data);
        if (hi > lo) {
          DTRAIN_CHECK_H5(
              H5Sselect_hyperslab(fsel, H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr),
              op, e.path);
          src += (e.bytes() / rows) * lo;
        } else {
          DTRAIN_CHECK_H5(H5Sselect_none(fsel), op, e.path);
          DTRAIN_CHECK_H5(H5Sselect_none(msel), op, e.path);
        }
        DTRAIN_CHECK_H5(H5Dwrite(d, mtype, msel, fsel, coll, src), op, e.path);
      }
    }
    datasets.emplace_back(&e, std::move(d));
  }
  // Checksums go last, so that they can be computed while the data is being written.
  if (m.before_checksums) m.before_checksums();
  for (auto& [e, d] : datasets) {
    h5_put_attr_str(d, "dtype", name_of(e->dtype), e->path);
    h5_put_attr_u32(d, "crc32c", e->crc, e->path);
  }
  // A serial write's small datasets sit in HDF5's sieve buffer until their close writes them: a
  // close that fails there (a full file system) has lost the data, and must fail the save rather
  // than let the file be published with a hole where a tensor was. (MPI-IO writes have no sieve
  // buffer, and their closes are collective: they close as the handles go.)
  if (!role.parallel)
    for (auto& entry : datasets) DTRAIN_CHECK_H5(entry.second.close(), op, entry.first->path);
}

inline H5Handle h5_file_access(bool for_write) {
  const char* op = "checkpoint open";
  H5Handle fapl(DTRAIN_CHECK_H5(H5Pcreate(H5P_FILE_ACCESS), op, "file access list"), H5Pclose);
  DTRAIN_CHECK_H5(H5Pset_fapl_sec2(fapl), op, "file access list");
  // Object headers version 2 and the version 2 superblock carry checksums, so a damaged byte
  // in the metadata (shapes, attributes) is detected by HDF5 itself.
  // A damaged file may fail half-way through a read; closing it must still release everything.
  DTRAIN_CHECK_H5(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), op, "file access list");
  if (for_write)
    DTRAIN_CHECK_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST), op,
                    "file access list");
  return fapl;
}

/// What a read of a whole file does with each dataset's elements.
enum class H5ReadMode {
  data,      // keeps them in the entry, checks the crc32c (Hdf5Format::read)
  checksum,  // checks the crc32c reading them in pieces, keeps none (Hdf5Format::verify)
  metadata,  // reads none: dtype, shape and stored crc32c only (Hdf5Format::describe)
};

struct H5ReadState {
  hid_t file;
  CkptManifest* m;
  std::string file_name;
  H5ReadMode mode = H5ReadMode::data;
  std::vector<unsigned char> scratch;  // checksum: the piece being checked
};

/// Bytes read at a time when a dataset is checked without being kept (Hdf5Format::verify):
/// 16 MiB. Test knob: tests set it small, so that every dataset is read in many pieces; set it
/// before the reads and reset it after.
inline std::size_t& read_piece_bytes() {
  static std::size_t bytes = std::size_t{16} << 20;
  return bytes;
}

/// The selections that read the elements [first, first + count) in row-major order of a dataset
/// of shape `shape` (file space `fspace`; a 0-d dataset's one element whole): the file's, a copy
/// of `fspace` selecting their blocks, and the memory's, `count` elements back to back.
inline std::pair<H5Handle, H5Handle> h5_run_selection(hid_t fspace, const Shape& shape,
                                                      std::uint64_t first, std::uint64_t count,
                                                      const char* op, const std::string& ctx) {
  H5Handle fsel(DTRAIN_CHECK_H5(H5Scopy(fspace), op, ctx), H5Sclose);
  if (!shape.empty()) {
    const std::vector<std::uint64_t> dims(shape.begin(), shape.end());
    bool fresh = true;
    h5_select_run(fsel, dims, first, count, fresh, op, ctx);
  }
  const hsize_t m = static_cast<hsize_t>(count);
  H5Handle msel(DTRAIN_CHECK_H5(H5Screate_simple(1, &m, nullptr), op, ctx), H5Sclose);
  return {std::move(fsel), std::move(msel)};
}

/// Reads the elements [first, first + count) of dataset `d` (file space `fspace`, entry `e` for
/// its dtype and shape) in row-major order into `dst`.
inline void h5_read_run(hid_t d, hid_t fspace, hid_t mtype, const CkptEntry& e, std::uint64_t first,
                        std::uint64_t count, void* dst, const std::string& ctx) {
  const char* op = "checkpoint read";
  if (count == 0) return;
  auto [fsel, msel] = h5_run_selection(fspace, e.shape, first, count, op, ctx);
  DTRAIN_CHECK_H5(H5Dread(d, mtype, msel, fsel, H5P_DEFAULT, dst), op, ctx);
}

/// The crc32c of the elements [first, first + count) of dataset `d` (as h5_read_run), read in
/// pieces of at most read_piece_bytes() through `scratch`.
inline std::uint32_t h5_run_crc(hid_t d, hid_t fspace, hid_t mtype, const CkptEntry& e,
                                std::uint64_t first, std::uint64_t count,
                                std::vector<unsigned char>& scratch, const std::string& ctx) {
  const std::size_t es = size_of(e.dtype);
  const std::uint64_t piece = std::max<std::size_t>(1, read_piece_bytes() / es);
  scratch.resize(static_cast<std::size_t>(std::min(count, piece)) * es);
  std::uint32_t crc = 0;
  for (std::uint64_t at = first; at < first + count; at += piece) {
    const std::uint64_t n = std::min(piece, first + count - at);
    h5_read_run(d, fspace, mtype, e, at, n, scratch.data(), ctx);
    crc = crc32c(scratch.data(), static_cast<std::size_t>(n) * es, crc);
  }
  return crc;
}

/// The crc32c of dataset `d`'s every element (as h5_run_crc).
inline std::uint32_t h5_dataset_crc(hid_t d, hid_t fspace, hid_t mtype, const CkptEntry& e,
                                    std::vector<unsigned char>& scratch, const std::string& ctx) {
  return h5_run_crc(d, fspace, mtype, e, 0, element_count(e.shape), scratch, ctx);
}

/// The extent of dataspace `sp` as a Shape (empty for a scalar dataspace).
inline Shape h5_shape_of(hid_t sp, const char* op, const std::string& ctx) {
  const int nd = DTRAIN_CHECK_H5(H5Sget_simple_extent_ndims(sp), op, ctx);
  std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
  if (nd > 0) DTRAIN_CHECK_H5(H5Sget_simple_extent_dims(sp, dims.data(), nullptr), op, ctx);
  return Shape(dims.begin(), dims.end());
}

inline int owner_of_path(const std::string& path) {
  static const std::string head = "/ranks/";
  if (path.compare(0, head.size(), head) != 0) return -1;
  const auto end = path.find('/', head.size());
  const std::string digits = path.substr(head.size(), end - head.size());
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoi(digits);
}

inline void h5_read_dataset(H5ReadState& st, const std::string& path) {
  const char* op = "checkpoint read";
  const std::string ctx = st.file_name + ":" + path;
  H5Handle d(DTRAIN_CHECK_H5(H5Dopen2(st.file, path.c_str(), H5P_DEFAULT), op, ctx), H5Dclose);
  CkptEntry e;
  e.path = path;
  e.kind = EntryKind::tensor;
  e.owner = owner_of_path(path);
  const std::string dname = h5_get_str(d, "dtype", ctx);
  try {
    e.dtype = dtype_from_name(dname);
  } catch (const InvalidArgument&) {
    raise<IoError>(op, ctx + ": unknown dtype attribute '" + dname + "'");
  }
  const auto crc = h5_get_attr(d, "crc32c", ctx);
  if (crc.kind != EntryKind::i64) raise<IoError>(op, ctx + ": crc32c attribute is not an integer");
  H5Handle sp(DTRAIN_CHECK_H5(H5Dget_space(d), op, ctx), H5Sclose);
  e.shape = h5_shape_of(sp, op, ctx);
  H5Handle ftype(DTRAIN_CHECK_H5(H5Dget_type(d), op, ctx), H5Tclose);
  if (H5Tget_size(ftype) != size_of(e.dtype))
    raise<IoError>(op, ctx + ": stored element size does not match dtype " + dname);
  H5Handle mtype = h5_type_for(e.dtype, false);
  e.crc = static_cast<std::uint32_t>(crc.i64);
  if (st.mode == H5ReadMode::metadata) {  // e.data stays null, the crc unchecked
    st.m->entries.push_back(std::move(e));
    return;
  }
  std::uint32_t actual = 0;
  if (st.mode == H5ReadMode::data) {
    e.storage.resize(e.bytes());
    if (!e.storage.empty())
      DTRAIN_CHECK_H5(H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, e.storage.data()), op, ctx);
    e.data = e.storage.data();
    actual = crc32c(e.storage.data(), e.storage.size());
  } else {
    actual = h5_dataset_crc(d, sp, mtype, e, st.scratch, ctx);  // e.data stays null
  }
  if (actual != e.crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ": checksum mismatch (stored crc32c %08x, data gives %08x)",
                  e.crc, actual);
    raise<IoError>(op, ctx + buf);
  }
  st.m->entries.push_back(std::move(e));
}

inline void h5_read_group(H5ReadState& st, const std::string& path) {
  const char* op = "checkpoint read";
  const std::string ctx = st.file_name + ":" + path;
  H5Handle g(DTRAIN_CHECK_H5(H5Gopen2(st.file, path.c_str(), H5P_DEFAULT), op, ctx), H5Gclose);
  if (path != "/") {
    std::vector<std::string> names;
    auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
      static_cast<std::vector<std::string>*>(data)->push_back(name);
      return 0;
    };
    DTRAIN_CHECK_H5(H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names), op, ctx);
    for (const auto& n : names) {
      auto v = h5_get_attr(g, n.c_str(), ctx);
      CkptEntry e;
      e.path = path + "/" + n;
      e.kind = v.kind;
      e.i64 = v.i64;
      e.f64 = v.f64;
      e.str = std::move(v.str);
      e.owner = owner_of_path(e.path);
      st.m->entries.push_back(std::move(e));
    }
  }
  H5G_info_t info;
  DTRAIN_CHECK_H5(H5Gget_info(g, &info), op, ctx);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = DTRAIN_CHECK_H5(
        H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT), op,
        ctx);
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    DTRAIN_CHECK_H5(H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                       name.size(), H5P_DEFAULT),
                    op, ctx);
    name.resize(static_cast<std::size_t>(len));
    const std::string child = path == "/" ? "/" + name : path + "/" + name;
    if (child == "/config") continue;
    H5Handle obj(DTRAIN_CHECK_H5(H5Oopen(g, name.c_str(), H5P_DEFAULT), op, child), H5Oclose);
    const H5I_type_t type = H5Iget_type(obj);
    obj.reset();
    if (type == H5I_GROUP)
      h5_read_group(st, child);
    else if (type == H5I_DATASET)
      h5_read_dataset(st, child);
    else
      raise<IoError>(op, st.file_name + ":" + child + ": unexpected object type");
  }
}

}  // namespace detail::ckpt_h5

/// The HDF5 checkpoint format: one file per checkpoint, a group per object and layer, a dataset
/// per tensor (true shape and dtype, crc32c attribute), attributes for scalars. Stateless; its
/// functions take the process-wide HDF5 lock, so they are thread-safe among themselves.
struct Hdf5Format {
  static constexpr const char* extension = ".h5";

  /// Writes the whole manifest from this process (all entries' bytes must be present), then
  /// makes the file durable (flush, close, fsync). Local, blocking.
  static void write(const std::string& path, const detail::CkptManifest& m) {
    detail::ckpt_h5::H5Session session;
    const char* op = "checkpoint write";
    detail::ckpt_h5::H5Handle fapl = detail::ckpt_h5::h5_file_access(true);
    detail::ckpt_h5::H5Handle file(
        DTRAIN_CHECK_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), op, path),
        H5Fclose);
    detail::ckpt_h5::h5_write_manifest(file, m, detail::ckpt_h5::H5WriteRole{});
    DTRAIN_CHECK_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), op, path);
    DTRAIN_CHECK_H5(file.close(), op, path);
    detail::fsync_path(path, false, op);
  }

  /// True when `comm` exposes an MPI communicator and HDF5 was built for MPI-IO.
  template <class Comm>
  static constexpr bool supports_parallel() {
    return detail::ckpt_h5::comm_has_mpi_comm<Comm>::value;
  }

  /// Collective over `comm`: every rank calls it with the same manifest metadata. Rank r's
  /// per-rank entries, its parts of tensors held in parts, and (with `slices`) its share of axis
  /// 0 of each other replicated tensor, are written by rank r; otherwise rank 0 writes replicated
  /// tensors. Blocking. Rank 0 fsyncs.
  template <class Comm>
  static void write_parallel(const std::string& path, const detail::CkptManifest& m, Comm& comm,
                             bool slices) {
#ifdef H5_HAVE_PARALLEL
    if constexpr (detail::ckpt_h5::comm_has_mpi_comm<Comm>::value) {
      detail::ckpt_h5::H5Session session;
      const char* op = "checkpoint write";
      MPI_Comm mc = comm.transport().mpi_comm();
      detail::ckpt_h5::H5Handle fapl(DTRAIN_CHECK_H5(H5Pcreate(H5P_FILE_ACCESS), op, path),
                                     H5Pclose);
      DTRAIN_CHECK_H5(H5Pset_fapl_mpio(fapl, mc, MPI_INFO_NULL), op, path);
      DTRAIN_CHECK_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST), op, path);
      DTRAIN_CHECK_H5(H5Pset_coll_metadata_write(fapl, true), op, path);
      detail::ckpt_h5::H5Handle file(
          DTRAIN_CHECK_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), op, path),
          H5Fclose);
      detail::ckpt_h5::H5WriteRole role;
      role.parallel = true;
      role.slices = slices;
      role.rank = comm.rank();
      role.size = comm.size();
      detail::ckpt_h5::h5_write_manifest(file, m, role);
      DTRAIN_CHECK_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), op, path);
      DTRAIN_CHECK_H5(file.close(), op, path);
      if (role.rank == 0) detail::fsync_path(path, false, op);
      return;
    }
#endif
    (void)path, (void)m, (void)comm, (void)slices;
    raise<InvalidArgument>("checkpoint write",
                           "parallel HDF5 writing needs an MPI communicator and parallel HDF5");
  }

  /// Reads and verifies a whole checkpoint: every dataset's crc32c is checked. Local, blocking.
  /// Throws IoError for a damaged, truncated or foreign file and InvalidArgument for a
  /// dtrain checkpoint of an unknown format version.
  static detail::CkptManifest read(const std::string& path) {
    return read_file(path, detail::ckpt_h5::H5ReadMode::data);
  }

  /// Verifies a whole checkpoint as read() does (every dataset's crc32c checked, the same
  /// errors) but keeps no tensor bytes: each dataset is read in pieces of at most 16 MiB and
  /// dropped, and its entry carries dtype, shape and checksum only (data null), for a Reader to
  /// fetch later. Memory: one piece, whatever the file's size. Local, blocking.
  static detail::CkptManifest verify(const std::string& path) {
    return read_file(path, detail::ckpt_h5::H5ReadMode::checksum);
  }

  /// Reads a checkpoint's metadata as verify() does (header, scalars, each tensor's dtype, shape
  /// and stored checksum, the same errors for a damaged header or structure) but no tensor
  /// elements: their checksums are left for Readers to check (a distributed restore has every
  /// rank check its share). Local, blocking.
  static detail::CkptManifest describe(const std::string& path) {
    return read_file(path, detail::ckpt_h5::H5ReadMode::metadata);
  }

  /// A checkpoint file open for reading tensors on demand, as verify() or describe() described
  /// them: whole, or a run of elements in row-major order. Local.
  class Reader {
   public:
    /// Opens `path` read-only; IoError when it cannot.
    explicit Reader(std::string path) : path_(std::move(path)) {
      detail::ckpt_h5::H5Session session;
      detail::ckpt_h5::H5Handle fapl = detail::ckpt_h5::h5_file_access(false);
      file_ = detail::ckpt_h5::H5Handle(
          DTRAIN_CHECK_H5(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl), "checkpoint read", path_),
          H5Fclose);
    }
    /// Reads tensor entry `e` into `dst` (host memory, e.bytes()) and checks its crc32c again:
    /// IoError naming the file and dataset when the dataset no longer has the verified shape,
    /// dtype size or checksum (the file changed since it was verified).
    void read(const detail::CkptEntry& e, void* dst) const {
      check_since_verified(e, read_run(e, 0, element_count(e.shape), dst), e.crc);
    }
    /// Reads the elements [first, first + count) of tensor entry `e` in row-major order into
    /// `dst` (host memory, count elements) and returns their crc32c. IoError as read() when the
    /// dataset's shape or element size changed.
    std::uint32_t read_run(const detail::CkptEntry& e, std::uint64_t first, std::uint64_t count,
                           void* dst) const {
      detail::ckpt_h5::H5Session session;
      Open d = open(e);
      detail::ckpt_h5::h5_read_run(d.dataset, d.space, d.mtype, e, first, count, dst, d.ctx);
      return crc32c(dst, static_cast<std::size_t>(count) * size_of(e.dtype));
    }
    /// The crc32c of the elements [first, first + count) of tensor entry `e`, read in pieces
    /// of at most 16 MiB (the memory it takes). IoError as read_run().
    std::uint32_t run_crc(const detail::CkptEntry& e, std::uint64_t first,
                          std::uint64_t count) const {
      detail::ckpt_h5::H5Session session;
      Open d = open(e);
      std::vector<unsigned char> scratch;
      return detail::ckpt_h5::h5_run_crc(d.dataset, d.space, d.mtype, e, first, count, scratch,
                                         d.ctx);
    }
    /// IoError naming the file and `e`'s dataset when `actual` (the crc32c of what was read)
    /// is not `expected` (what the verification found).
    void check_since_verified(const detail::CkptEntry& e, std::uint32_t actual,
                              std::uint32_t expected) const {
      if (actual == expected) return;
      char buf[128];
      std::snprintf(buf, sizeof buf,
                    ": checksum mismatch (stored crc32c %08x, data gives %08x) since the file "
                    "was verified",
                    expected, actual);
      raise<IoError>("checkpoint read", path_ + ":" + e.path + buf);
    }

   private:
    struct Open {
      std::string ctx;
      detail::ckpt_h5::H5Handle dataset, space, mtype;
    };
    // Entry `e`'s dataset, checked to still have the described shape and element size.
    Open open(const detail::CkptEntry& e) const {
      using detail::ckpt_h5::H5Handle;
      const char* op = "checkpoint read";
      Open o;
      o.ctx = path_ + ":" + e.path;
      o.dataset = H5Handle(DTRAIN_CHECK_H5(H5Dopen2(file_, e.path.c_str(), H5P_DEFAULT), op, o.ctx),
                           H5Dclose);
      o.space = H5Handle(DTRAIN_CHECK_H5(H5Dget_space(o.dataset), op, o.ctx), H5Sclose);
      H5Handle ftype(DTRAIN_CHECK_H5(H5Dget_type(o.dataset), op, o.ctx), H5Tclose);
      if (detail::ckpt_h5::h5_shape_of(o.space, op, o.ctx) != e.shape ||
          H5Tget_size(ftype) != size_of(e.dtype))
        raise<IoError>(op, o.ctx +
                               ": the dataset's shape or element size changed since the file "
                               "was verified");
      o.mtype = detail::ckpt_h5::h5_type_for(e.dtype, false);
      return o;
    }

    std::string path_;
    detail::ckpt_h5::H5Handle file_;
  };

 private:
  static detail::CkptManifest read_file(const std::string& path, detail::ckpt_h5::H5ReadMode mode) {
    detail::ckpt_h5::H5Session session;
    const char* op = "checkpoint read";
    detail::ckpt_h5::H5Handle fapl = detail::ckpt_h5::h5_file_access(false);
    detail::ckpt_h5::H5Handle file(
        DTRAIN_CHECK_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), op, path), H5Fclose);
    detail::CkptManifest m;
    const std::string where = path + ":/";
    if (detail::ckpt_h5::h5_get_str(file, "format", where) != detail::checkpoint_format_name)
      raise<IoError>(op, path + ": not a dtrain checkpoint (attribute 'format')");
    m.format_version = detail::ckpt_h5::h5_get_i64(file, "format_version", where);
    if (m.format_version != detail::checkpoint_format_version)
      raise<InvalidArgument>(op, path + ": unknown checkpoint format version " +
                                     std::to_string(m.format_version) +
                                     " (this library reads version " +
                                     std::to_string(detail::checkpoint_format_version) + ")");
    m.library_version = detail::ckpt_h5::h5_get_str(file, "library_version", where);
    m.step = detail::ckpt_h5::h5_get_i64(file, "step", where);
    m.world_size = detail::ckpt_h5::h5_get_i64(file, "world_size", where);
    m.strategy = detail::ckpt_h5::h5_get_str(file, "write_strategy", where);
    {
      auto v = detail::ckpt_h5::h5_get_attr(file, "created_unix", where);
      m.created_unix = v.kind == detail::EntryKind::f64 ? v.f64 : 0.0;
    }
    // The run's identity: absent in files written before identities (read as "" and -1).
    if (DTRAIN_CHECK_H5(H5Aexists(file, "run_id"), op, where + "@run_id") > 0)
      m.run_id = detail::ckpt_h5::h5_get_str(file, "run_id", where);
    if (DTRAIN_CHECK_H5(H5Aexists(file, "shared_step"), op, where + "@shared_step") > 0)
      m.shared_step = detail::ckpt_h5::h5_get_i64(file, "shared_step", where);
    const std::int64_t expected = detail::ckpt_h5::h5_get_i64(file, "entry_count", where);
    {
      detail::ckpt_h5::H5Handle d(
          DTRAIN_CHECK_H5(H5Dopen2(file, "/config", H5P_DEFAULT), op, path + ":/config"), H5Dclose);
      detail::ckpt_h5::H5Handle ty(DTRAIN_CHECK_H5(H5Dget_type(d), op, path + ":/config"),
                                   H5Tclose);
      std::string buf(H5Tget_size(ty), '\0');
      DTRAIN_CHECK_H5(H5Dread(d, ty, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), op,
                      path + ":/config");
      while (!buf.empty() && buf.back() == '\0') buf.pop_back();
      const auto crc = detail::ckpt_h5::h5_get_i64(d, "crc32c", path + ":/config");
      if (static_cast<std::uint32_t>(crc) != crc32c(buf.data(), buf.size()))
        raise<IoError>(op, path + ":/config: checksum mismatch");
      m.config = std::move(buf);
    }
    detail::ckpt_h5::H5ReadState st{file, &m, path, mode, {}};
    detail::ckpt_h5::h5_read_group(st, "/");
    if (static_cast<std::int64_t>(m.entries.size()) != expected)
      raise<IoError>(op, path + ": holds " + std::to_string(m.entries.size()) +
                             " entries, its header says " + std::to_string(expected));
    DTRAIN_CHECK_H5(file.close(), op, path);
    return m;
  }
};

}  // namespace dtrain
