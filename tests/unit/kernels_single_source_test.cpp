// The f16/bf16 conversions and the dropout mask exist once, as DTRAIN_HOST_DEVICE functions that
// host and device code both call. This reads the header trees and checks that each has exactly one
// definition and that the device headers call it instead of carrying their own arithmetic.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/host_device.hpp>

namespace fs = std::filesystem;

namespace {
struct Source {
  std::string path, text;
};
std::vector<Source> library_headers() {
  std::vector<Source> out;
  for (const char* root : {"include", "kernels", "transports"}) {
    const fs::path dir = fs::path(DTRAIN_SOURCE_DIR) / root;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      const auto ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".hpp" && ext != ".cuh")) continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      out.push_back({e.path().string(), ss.str()});
    }
  }
  return out;
}
// Definitions (a body follows the parameter list) of function `name` across the library.
std::vector<std::string> definitions_of(const std::vector<Source>& files, const std::string& name) {
  const std::regex def(name + R"(\s*\([^;{)]*\)\s*(const\s*)?(noexcept\s*)?\{)");
  std::vector<std::string> where;
  for (const auto& f : files)
    for (auto it = std::sregex_iterator(f.text.begin(), f.text.end(), def);
         it != std::sregex_iterator(); ++it)
      where.push_back(f.path);
  return where;
}
}  // namespace

TEST_CASE("f16/bf16 conversions and the dropout mask are defined once, for host and device") {
  const auto files = library_headers();
  REQUIRE(files.size() > 20);
  for (const char* fn : {"float_to_half_bits", "half_bits_to_float", "float_to_bf16_bits",
                         "bf16_bits_to_float", "dropout_keep"}) {
    const auto defs = definitions_of(files, fn);
    INFO(fn);
    REQUIRE(defs.size() == 1);
  }
  // The device conversions hold no rounding arithmetic of their own: no binary16 exponent masks.
  for (const auto& f : files) {
    if (f.path.size() < 4 || f.path.substr(f.path.size() - 4) != ".cuh") continue;
    INFO(f.path);
    CHECK(f.text.find("0x7c00") == std::string::npos);
    CHECK(f.text.find("0x7fff") == std::string::npos);
  }
}

TEST_CASE("DTRAIN_HOST_DEVICE is empty for a host compiler and the conversions still round") {
  // A host compiler sees the annotation as nothing; the stringised expansion is empty.
#define DTRAIN_TEST_STR2(x) #x
#define DTRAIN_TEST_STR(x) DTRAIN_TEST_STR2(x)
  CHECK(std::string(DTRAIN_TEST_STR(DTRAIN_HOST_DEVICE)).empty());
  CHECK(dtrain::half(1.0f).bits == 0x3c00);
  CHECK(dtrain::bfloat16(1.0f).bits == 0x3f80);
  CHECK(static_cast<float>(dtrain::half::from_bits(0x0001)) == 5.9604644775390625e-8f);
}
