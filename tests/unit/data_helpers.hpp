// Test helpers for the data subsystem: temporary directories, an IDX writer, a checkpoint-style
// visitor that keeps state in memory.
#pragma once

#include "support/memory_state.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>

namespace dtrain::test {

/// A fresh directory under $TMPDIR (or /tmp), removed with its files on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/dtrain_data_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") std::remove((path_ + "/" + n).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Bytes of an IDX file: header (type code, big-endian dims) then `payload` as given.
inline std::vector<unsigned char> idx_bytes(std::uint8_t type,
                                            const std::vector<std::uint32_t>& dims,
                                            const std::vector<unsigned char>& payload) {
  std::vector<unsigned char> out{0, 0, type, static_cast<unsigned char>(dims.size())};
  for (std::uint32_t d : dims) {
    out.push_back(static_cast<unsigned char>(d >> 24));
    out.push_back(static_cast<unsigned char>(d >> 16));
    out.push_back(static_cast<unsigned char>(d >> 8));
    out.push_back(static_cast<unsigned char>(d));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

inline void write_file(const std::string& path, const std::vector<unsigned char>& bytes,
                       bool gzip = false) {
  if (gzip) {
    gzFile z = gzopen(path.c_str(), "wb6");
    if (!z || (bytes.size() && gzwrite(z, bytes.data(), static_cast<unsigned>(bytes.size())) <= 0))
      throw std::runtime_error("gzwrite failed: " + path);
    gzclose(z);
    return;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
    throw std::runtime_error("write failed: " + path);
  std::fclose(f);
}

/// Deterministic synthetic image bytes: sample i, element k.
inline unsigned char synth_pixel(std::size_t i, std::size_t k) {
  return static_cast<unsigned char>((i * 131u + k * 7u + (i * k) % 13u) & 0xffu);
}
inline unsigned char synth_label(std::size_t i, int classes) {
  return static_cast<unsigned char>((i * 7u + 3u) % static_cast<unsigned>(classes));
}

/// Writes images [n, rows, cols] and labels [n] as IDX files; returns their paths.
struct IdxPair {
  std::string images, labels;
};
inline IdxPair write_synthetic_idx(const TempDir& dir, const std::string& stem, std::size_t n,
                                   std::uint32_t rows, std::uint32_t cols, bool gzip,
                                   int classes = 10) {
  std::vector<unsigned char> img(n * rows * cols), lab(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < rows * cols; ++k) img[i * rows * cols + k] = synth_pixel(i, k);
    lab[i] = synth_label(i, classes);
  }
  IdxPair p{dir.file(stem + "-images" + (gzip ? ".gz" : "")),
            dir.file(stem + "-labels" + (gzip ? ".gz" : ""))};
  write_file(p.images, idx_bytes(0x08, {static_cast<std::uint32_t>(n), rows, cols}, img), gzip);
  write_file(p.labels, idx_bytes(0x08, {static_cast<std::uint32_t>(n)}, lab), gzip);
  return p;
}

template <class T>
MemoryState save_state(T& obj) {
  MemoryState s;
  obj.visit_state(s);
  return s;
}
template <class T>
void load_state(MemoryState s, T& obj) {
  s.load = true;
  obj.visit_state(s);
}

}  // namespace dtrain::test
