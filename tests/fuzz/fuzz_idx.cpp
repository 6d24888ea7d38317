// Fuzz target: the IDX reader (read_idx and IdxDataset's validation) on arbitrary file content,
// plain or gzip. Every outcome but a dtrain::Error or a valid result is a bug.
#include <cstdint>

#include <dtrain/core/error.hpp>
#include <dtrain/data/idx.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dtrain::fuzz::scratch_file(data, size, ".idx");
  try {
    const dtrain::IdxArray a = dtrain::read_idx(path);
    if (a.data.size() != dtrain::element_count(a.shape) * dtrain::detail::idx_type_size(a.type))
      __builtin_trap();  // a result whose size disagrees with its shape
  } catch (const dtrain::Error&) {
  }
  try {
    // The same file as images and labels: reaches the count, type and label-range checks.
    dtrain::IdxDataset d(path, path);
    if (d.size() > 0) {
      std::vector<std::int64_t> idx{0};
      std::vector<float> x(dtrain::element_count(d.sample_shape()));
      std::vector<std::int32_t> y(1);
      d.read(idx, x, y, dtrain::Normalize{});
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
