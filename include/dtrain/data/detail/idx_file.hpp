// SPDX-License-Identifier: BSD-3-Clause
// dtrain: private IDX file access (header parsing, gzip through zlib, memory mapping).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <dtrain/core/error.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain {
namespace detail {

/// Bytes per element of an IDX type code, 0 for an unknown code.
inline std::size_t idx_type_size(std::uint8_t code) noexcept {
  switch (code) {
    case 0x08: return 1;  // unsigned byte
    case 0x09: return 1;  // signed byte
    case 0x0B: return 2;  // short
    case 0x0C: return 4;  // int
    case 0x0D: return 4;  // float
    case 0x0E: return 8;  // double
    default: return 0;
  }
}

inline const char* idx_type_name(std::uint8_t code) noexcept {
  switch (code) {
    case 0x08: return "u8";
    case 0x09: return "i8";
    case 0x0B: return "i16";
    case 0x0C: return "i32";
    case 0x0D: return "f32";
    case 0x0E: return "f64";
    default: return "unknown";
  }
}

inline std::string hex_byte(unsigned v) {
  const char* digits = "0123456789abcdef";
  std::string s = "0x";
  s += digits[(v >> 4) & 15u];
  s += digits[v & 15u];
  return s;
}

/// A parsed IDX file: the header and a pointer to the element bytes (big-endian, as stored).
/// `storage` keeps the bytes alive: a read-only mapping for plain files (only the pages of samples
/// actually read are ever loaded), a decompressed buffer for gzip files (gzip cannot be seeked).
struct IdxFile {
  std::string path;
  std::uint8_t type = 0;
  Shape shape;
  const unsigned char* data = nullptr;
  std::size_t data_bytes = 0;
  bool compressed = false;
  std::shared_ptr<const void> storage;
};

// Parses and validates the magic and dimensions; `read_more(buf, n)` returns the bytes it could
// read. Returns the header size.
template <class ReadFn>
std::size_t parse_idx_header(IdxFile& f, const char* op, ReadFn&& read_more) {
  unsigned char magic[4] = {0, 0, 0, 0};
  const std::size_t got = read_more(magic, 4);
  if (got < 4)
    raise<IoError>(op, "'" + f.path + "' is too short to be an IDX file (" + std::to_string(got) +
                           " bytes; the header alone needs at least 8)");
  const std::size_t esize = idx_type_size(magic[2]);
  if (magic[0] != 0 || magic[1] != 0 || esize == 0 || magic[3] == 0)
    raise<IoError>(op, "'" + f.path + "' is not an IDX file: magic bytes " + hex_byte(magic[0]) +
                           " " + hex_byte(magic[1]) + " " + hex_byte(magic[2]) + " " +
                           hex_byte(magic[3]) +
                           " (expected 0x00 0x00, a type code 0x08/0x09/0x0b/0x0c/0x0d/0x0e and a "
                           "non-zero dimension count)");
  f.type = magic[2];
  const unsigned ndim = magic[3];
  std::vector<unsigned char> dims(4u * ndim);
  const std::size_t dgot = read_more(dims.data(), dims.size());
  if (dgot < dims.size())
    raise<IoError>(op, "'" + f.path + "' is truncated inside its header (" + std::to_string(ndim) +
                           " dimensions declared)");
  f.shape.resize(ndim);
  std::size_t count = 1;
  for (unsigned d = 0; d < ndim; ++d) {
    const std::uint32_t v = (std::uint32_t{dims[4 * d]} << 24) |
                            (std::uint32_t{dims[4 * d + 1]} << 16) |
                            (std::uint32_t{dims[4 * d + 2]} << 8) | std::uint32_t{dims[4 * d + 3]};
    f.shape[d] = static_cast<std::int64_t>(v);
    if (v != 0 && count > (std::size_t(1) << 48) / v)
      raise<IoError>(op, "'" + f.path + "' declares an implausible size " + to_string(f.shape));
    count *= v;
  }
  f.data_bytes = count * esize;
  return 4 + dims.size();
}

inline std::string describe_idx(const IdxFile& f) {
  return to_string(f.shape) + " " + idx_type_name(f.type) + " = " + std::to_string(f.data_bytes) +
         " data bytes";
}

/// Opens an IDX file, plain or gzip (recognised by its content, not its name), validating the
/// magic, the dimensions and that the data is exactly as long as the header says.
inline IdxFile open_idx(const std::string& path, const char* op) {
  IdxFile f;
  f.path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) raise<IoError>(op, "cannot open '" + path + "': " + errno_text(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) raise<IoError>(op, "cannot stat '" + path + "': " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) raise<IoError>(op, "'" + path + "' is not a regular file");
  const std::size_t file_size = static_cast<std::size_t>(st.st_size);

  unsigned char gz[2] = {0, 0};
  const bool is_gzip =
      file_size >= 2 && ::pread(fd, gz, 2, 0) == 2 && gz[0] == 0x1f && gz[1] == 0x8b;
  if (!is_gzip) {
    std::size_t offset = 0;
    const std::size_t header = parse_idx_header(f, op, [&](unsigned char* buf, std::size_t n) {
      const ssize_t r = offset < file_size ? ::pread(fd, buf, n, static_cast<off_t>(offset)) : 0;
      const std::size_t got = r > 0 ? static_cast<std::size_t>(r) : 0;
      offset += got;
      return got;
    });
    if (file_size - header < f.data_bytes)
      raise<IoError>(op, "'" + path + "' is truncated: the header declares " + describe_idx(f) +
                             ", the file holds " + std::to_string(file_size - header));
    if (file_size - header > f.data_bytes)
      raise<IoError>(op, "'" + path + "' has " + std::to_string(file_size - header - f.data_bytes) +
                             " bytes after the " + describe_idx(f) + " its header declares");
    if (file_size == 0 || f.data_bytes == 0) {
      f.storage = std::make_shared<std::vector<unsigned char>>();
      return f;
    }
    void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) raise<IoError>(op, "cannot map '" + path + "': " + errno_text(errno));
    f.storage = std::shared_ptr<const void>(
        addr, [file_size](const void* p) { ::munmap(const_cast<void*>(p), file_size); });
    f.data = static_cast<const unsigned char*>(addr) + header;
    return f;
  }

  f.compressed = true;
  gzFile z = ::gzopen(path.c_str(), "rb");
  if (!z) raise<IoError>(op, "zlib cannot open '" + path + "': " + errno_text(errno));
  struct GzCloser {
    gzFile z;
    ~GzCloser() { ::gzclose(z); }
  } gz_closer{z};
  ::gzbuffer(z, 1u << 17);
  auto gz_read = [&](unsigned char* buf, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      const unsigned want = static_cast<unsigned>(std::min<std::size_t>(n - total, 1u << 30));
      const int r = ::gzread(z, buf + total, want);
      if (r <= 0) break;
      total += static_cast<std::size_t>(r);
    }
    return total;
  };
  auto gz_problem = [&]() -> std::string {
    int code = Z_OK;
    const char* msg = ::gzerror(z, &code);
    if (code == Z_OK || code == Z_STREAM_END || !msg) return "";
    return std::string(" (zlib: ") + msg + ")";
  };
  parse_idx_header(f, op, gz_read);
  // The buffer grows with the data actually decompressed, not with what the header claims: a
  // small damaged or hostile file declaring terabytes fails as truncated without allocating them.
  auto buf = std::make_shared<std::vector<unsigned char>>();
  std::size_t got = 0;
  while (got < f.data_bytes) {
    const std::size_t cap = std::min(f.data_bytes, std::max<std::size_t>(2 * got, 1u << 20));
    buf->resize(cap);
    const std::size_t r = gz_read(buf->data() + got, cap - got);
    got += r;
    if (got < cap) break;
  }
  if (got < f.data_bytes)
    raise<IoError>(op, "'" + path + "' is truncated: the header declares " + describe_idx(f) +
                           ", the compressed stream holds " + std::to_string(got) + gz_problem());
  unsigned char extra[64];
  const std::size_t more = gz_read(extra, sizeof extra);
  if (more > 0)
    raise<IoError>(
        op, "'" + path + "' has bytes after the " + describe_idx(f) + " its header declares");
  const std::string problem = gz_problem();
  if (!problem.empty()) raise<IoError>(op, "'" + path + "' is damaged" + problem);
  f.data = buf->data();
  f.storage = std::move(buf);
  return f;
}

}  // namespace detail
}  // namespace dtrain
