// Fuzz targets: a scratch file per process for readers that take a path, and the one-rank
// communicator the checkpoint code runs on. Each target defines LLVMFuzzerTestOneInput; it is
// linked either with libFuzzer (clang -fsanitize=fuzzer, tests/fuzz/run.sh) or with
// replay_main.cpp, which feeds it the kept corpus and every regression input (a unit test).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::fuzz {

/// Writes `n` bytes to this process's scratch file (under $TMPDIR or /tmp) and returns its path.
inline const std::string& scratch_file(const std::uint8_t* data, std::size_t n,
                                       const char* suffix) {
  static std::string path;
  if (path.empty()) {
    const char* dir = std::getenv("TMPDIR");
    path = std::string(dir && *dir ? dir : "/tmp") + "/dtrain-fuzz-" + std::to_string(getpid()) +
           suffix;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (n && std::fwrite(data, 1, n, f) != n) std::abort();
  std::fclose(f);
  return path;
}

/// A world of one rank: the Checkpointer's communicator contract with nothing to exchange.
struct SelfComm {
  int rank() const { return 0; }
  int size() const { return 1; }
  void barrier() {}
  void broadcast(BufferView, int) {}
  void allreduce(BufferView, ReduceOp) {}
};

/// Reads little pieces of the fuzz input in order; zeros once it is used up.
class Bytes {
 public:
  Bytes(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  std::uint8_t u8() { return off_ < n_ ? p_[off_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return v;
  }
  std::size_t left() const { return n_ - off_; }
  const std::uint8_t* rest() const { return p_ + off_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t off_ = 0;
};

}  // namespace dtrain::fuzz
