// Fuzz target: the run description reader (parse_run_config) on arbitrary text, YAML or JSON.
// Every outcome but a dtrain::Error or a description that holds the text it was read from is a
// bug (yaml-cpp's own exceptions included: they must come back as dtrain::InvalidArgument).
#include <cstdint>
#include <string>

#include <dtrain/config/run_config.hpp>
#include <dtrain/core/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const dtrain::RunConfig run = dtrain::parse_run_config(text, "fuzz.yaml");
    if (run.text != text || run.layers.empty()) __builtin_trap();
  } catch (const dtrain::Error&) {
  }
  return 0;
}
