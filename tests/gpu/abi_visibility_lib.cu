// A shared library that uses dtrain's device code, for the ABI check: its dynamic symbol table
// must export the library's own entry point and nothing from dtrain::gpu (hidden, versioned
// inline namespace), so two libraries built against different dtrain versions cannot bind to
// each other's kernels or launchers.
#include <cstddef>

#include <dtrain/kernels/convert.cuh>
#include <dtrain/kernels/memory.cuh>
#include <dtrain/kernels/optim.cuh>

extern "C" __attribute__((visibility("default"))) int abi_check_entry(float* x, std::size_t n) {
  dtrain::gpu::fill(x, 1.0f, n);
  dtrain::gpu::adamw_update(x, x, x, x, n, dtrain::host::AdamWParams{});
  return 0;
}
