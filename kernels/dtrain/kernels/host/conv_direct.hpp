// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the host's direct convolution (stride 1, dilation 1, zero or periodic padding, any kernel
// size, 1-, 2- or 3-D, float or double): forward, input gradient, weight and bias gradient, with
// no lowered matrix and no GEMM.
//
// Layout. Each sample's channels are copied onto a padded grid (in + 2 pad cells per axis, the
// border zero or wrapped) and laid out flat, so that kernel cell t reads the grid `offset(t)`
// cells to the right of the output cell it serves: output cell (d, h, w) becomes the "wide" index
// (d * padded[1] + h) * padded[2] + w, and a row of output cells plus the padding columns between
// rows is one contiguous range. The kernels run over those ranges in tiles of a fixed width, so
// they have no per-row tails; the few wide cells that are not output cells are computed and
// dropped (a crop after the forward, a fold after the input gradient).
//
// Register tiles. The forward keeps C output channels x NV vectors of pixels in registers and
// walks input channels and kernel cells: each step loads NV input vectors and broadcasts C
// weights (6 x 4 x 16 floats with AVX-512, as measured in benchmarks/compare/conv_candidates.cpp).
// The input gradient is the same kernel over the output gradient with the weights transposed and
// the offsets mirrored. The weight gradient keeps C output channels x G kernel cells of partial
// dot products in registers.
//
// Instruction sets. A header-only library is compiled without -march flags, so the kernels are
// templates over the vector width, instantiated once per instruction set inside functions marked
// `target("avx512f,fma")` and `target("avx2,fma")` (every helper is always_inline and takes no
// vector arguments, so it is compiled for its caller's set), plus a portable version of 16-byte
// vectors. host::conv_isa() picks one per process with __builtin_cpu_supports the first time it is
// asked; the x86 versions exist only in x86 host compilations (not in the device passes of nvcc
// or hipcc, not on other CPUs), where the portable one is the only one.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <dtrain/core/error.hpp>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define DTRAIN_CONV_DIRECT_X86 1
#else
#define DTRAIN_CONV_DIRECT_X86 0
#endif

namespace dtrain {
namespace host {

/// The instruction sets the direct convolution is compiled for: `portable` (16-byte vectors, any
/// CPU), `avx2` (AVX2 + FMA, x86 only) and `avx512` (AVX-512F + FMA, x86 only).
enum class ConvIsa : unsigned char { portable, avx2, avx512 };

inline const char* conv_isa_name(ConvIsa isa) noexcept {
  return isa == ConvIsa::avx512 ? "avx512" : isa == ConvIsa::avx2 ? "avx2" : "portable";
}

/// Whether this build has `isa` and this CPU runs it. Local, thread-safe.
inline bool conv_isa_supported(ConvIsa isa) noexcept {
  if (isa == ConvIsa::portable) return true;
#if DTRAIN_CONV_DIRECT_X86
  __builtin_cpu_init();
  if (isa == ConvIsa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

namespace detail {
inline ConvIsa best_conv_isa() noexcept {
  static const ConvIsa best = conv_isa_supported(ConvIsa::avx512) ? ConvIsa::avx512
                              : conv_isa_supported(ConvIsa::avx2) ? ConvIsa::avx2
                                                                  : ConvIsa::portable;
  return best;
}
// -1: no override; otherwise the ConvIsa that conv_isa() returns.
inline std::atomic<int> conv_isa_override{-1};
}  // namespace detail

/// The instruction set that convolution layers configured from now on use: the widest this CPU
/// runs, unless force_conv_isa chose another. Local, thread-safe.
inline ConvIsa conv_isa() noexcept {
  const int forced = detail::conv_isa_override.load(std::memory_order_relaxed);
  return forced < 0 ? detail::best_conv_isa() : static_cast<ConvIsa>(forced);
}

/// Makes layers configured from now on use `isa` (tests compare the versions); throws
/// InvalidArgument when this CPU or build lacks it. Returns the previous choice. Local; affects
/// the whole process.
inline ConvIsa force_conv_isa(ConvIsa isa) {
  DTRAIN_REQUIRE(conv_isa_supported(isa), "conv",
                 "this CPU or build lacks the " << conv_isa_name(isa) << " convolution kernels");
  const ConvIsa previous = conv_isa();
  detail::conv_isa_override.store(static_cast<int>(isa), std::memory_order_relaxed);
  return previous;
}

/// Most kernel cells the direct convolution takes (its tap offsets live on the stack).
inline constexpr std::int64_t conv_direct_max_taps = 512;

/// The extents and buffer strides of one direct convolution, trivially copyable. Scratch per
/// sample (the caller allocates it zero-filled once, at the strides below, and keeps it):
/// `xpad` [in_channels, x_stride], `ywide` [out_channels, y_stride], `dywide` [out_channels,
/// dy_stride], `dxwide` [in_channels, dx_stride]; per batch `dwlanes` (see lane_bytes).
struct ConvDirectPlan {
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
  bool periodic = false;
  std::int64_t padded[3] = {1, 1, 1};  // in + 2 pad
  std::int64_t taps = 1, last_offset = 0, wide = 1;
  std::int64_t x_stride = 0, y_stride = 0, dy_stride = 0, dx_stride = 0;

  /// Every tile width of every instruction set divides this.
  static constexpr std::int64_t round = 64;
  /// Bytes of the widest vector: each weight's slot in the weight-gradient scratch `dwlanes`
  /// ([out_channels * in_channels * taps] slots of this many bytes).
  static constexpr std::int64_t lane_bytes = 64;
  static std::int64_t round_up(std::int64_t n) { return (n + round - 1) / round * round; }

  ConvDirectPlan() = default;
  ConvDirectPlan(std::int64_t cin, std::int64_t cout, const std::int64_t (&in_ext)[3],
                 const std::int64_t (&kernel_ext)[3], const std::int64_t (&pads)[3], bool wrap)
      : in_channels(cin), out_channels(cout), periodic(wrap) {
    taps = 1;
    for (int a = 0; a < 3; ++a) {
      in[a] = in_ext[a], kernel[a] = kernel_ext[a], pad[a] = pads[a];
      padded[a] = in[a] + 2 * pad[a];
      out[a] = padded[a] - kernel[a] + 1;
      taps *= kernel[a];
    }
    last_offset = flat(kernel[0] - 1, kernel[1] - 1, kernel[2] - 1);
    wide = flat(out[0] - 1, out[1] - 1, out[2] - 1) + 1;
    const std::int64_t grid = padded[0] * padded[1] * padded[2];
    y_stride = round_up(wide);
    x_stride = round_up(std::max(grid, y_stride + last_offset)) + round;
    dy_stride = last_offset + std::max(y_stride, round_up(grid)) + 2 * round;
    dx_stride = round_up(grid) + 2 * round;
  }
  /// Wide index of padded-grid cell (d, h, w).
  std::int64_t flat(std::int64_t d, std::int64_t h, std::int64_t w) const {
    return (d * padded[1] + h) * padded[2] + w;
  }
  std::int64_t in_cells() const { return in[0] * in[1] * in[2]; }
  std::int64_t out_cells() const { return out[0] * out[1] * out[2]; }
};

namespace detail {

#define DTRAIN_CONV_INLINE inline __attribute__((always_inline))

// A vector of N bytes of T, and the same vector at any address of a T (loads and stores through
// it: `memcpy` into an array of vectors made GCC keep the array in memory).
template <class T, int N>
struct ConvVec {
  typedef T type __attribute__((vector_size(N)));
  typedef T unaligned __attribute__((vector_size(N), aligned(alignof(T)), may_alias));
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12 reports the forward tile's accumulators as maybe uninitialized for double with 64-byte
// vectors; every one is assigned before use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// Rows of `n` values copied from `src` to `dst`: row (i, j, k), i < count[0], j < count[1],
/// k < count[2], starts at sum of index x step on each side (see ConvTiles::copy_rows).
template <class T>
struct ConvRowsCall {
  const T* src;
  T* dst;
  std::int64_t n;
  std::int64_t count[3], src_step[3], dst_step[3];
};

/// The register-tiled loops for one vector width. B: vector bytes; CB x NV: forward tile
/// (output channels x vectors); WC x WG: weight-gradient tile (output channels x kernel cells).
template <class T, int B, int CB, int NV, int WC, int WG>
struct ConvTiles {
  using V = typename ConvVec<T, B>::type;
  using U = typename ConvVec<T, B>::unaligned;
  static constexpr int L = B / static_cast<int>(sizeof(T));
  static constexpr int W = NV * L;  // pixels per forward tile
  static_assert(ConvDirectPlan::round % W == 0, "tiles divide the plan's rounding");

  // out[co][p] = bias[co] + sum over ci, t of w[(ci * taps + t) * cout + co] * in[ci][p + off[t]]
  // for output channels co0 .. co0 + C - 1 and pixels p0 .. p0 + N * L - 1.
  template <int C, int N>
  DTRAIN_CONV_INLINE static void tile(const T* in, std::int64_t in_stride, std::int64_t cin,
                                      const T* w, std::int64_t cout, const std::int64_t* off,
                                      std::int64_t taps, const T* bias, T* out,
                                      std::int64_t out_stride, std::int64_t co0, std::int64_t p0) {
    V acc[C][N];
    for (int c = 0; c < C; ++c) {
      const V b = (bias ? bias[co0 + c] : T(0)) - V{};
      for (int v = 0; v < N; ++v) acc[c][v] = b;
    }
    // One loop over (input channel, kernel cell) pairs: with one input channel (9 steps) GCC
    // spilled accumulators around the nested loops' boundaries.
    const std::int64_t steps = cin * taps;
    for (std::int64_t k = 0, ci = 0, t = 0; k < steps; ++k) {
      {
        const T* x = in + ci * in_stride + p0;
        const T* wc = w + ci * taps * cout + co0;
        V xv[N];
        for (int v = 0; v < N; ++v) xv[v] = *reinterpret_cast<const U*>(x + off[t] + v * L);
        const T* wt = wc + t * cout;
        for (int c = 0; c < C; ++c) {
          const V b = wt[c] - V{};  // a broadcast: w - 0 is w, so no add is emitted
          for (int v = 0; v < N; ++v) acc[c][v] += b * xv[v];
        }
      }
      if (++t == taps) t = 0, ++ci;
    }
    for (int c = 0; c < C; ++c)
      for (int v = 0; v < N; ++v)
        *reinterpret_cast<U*>(out + (co0 + c) * out_stride + p0 + v * L) = acc[c][v];
  }

  // Every output channel at pixels p0 .. p0 + N * L - 1, in channel blocks of CB, then of 4 where
  // 4 or more are left (16 channels: 6 + 6 + 4, 1-3% faster than 6 + 6 + 2 + 2 on the models'
  // layers; 8: 6 + 2, 1.3x faster than 4 + 4 on the surrogate's; conv_profile, 07 Dec).
  template <int N>
  DTRAIN_CONV_INLINE static void channels(const T* in, std::int64_t in_stride, std::int64_t cin,
                                          const T* w, std::int64_t cout, const std::int64_t* off,
                                          std::int64_t taps, const T* bias, T* out,
                                          std::int64_t out_stride, std::int64_t p0) {
    constexpr int C4 = CB > 4 ? 4 : CB;
    for (std::int64_t co = 0; co < cout;) {
      const std::int64_t rest = cout - co;
      if (rest >= CB) {
        tile<CB, N>(in, in_stride, cin, w, cout, off, taps, bias, out, out_stride, co, p0);
        co += CB;
      } else if (CB > 4 && rest >= 4) {
        tile<C4, N>(in, in_stride, cin, w, cout, off, taps, bias, out, out_stride, co, p0);
        co += C4;
      } else if (rest >= 2) {
        tile<2, N>(in, in_stride, cin, w, cout, off, taps, bias, out, out_stride, co, p0);
        co += 2;
      } else {
        tile<1, N>(in, in_stride, cin, w, cout, off, taps, bias, out, out_stride, co, p0);
        ++co;
      }
    }
  }

  // The forward over wide cells [begin, end), every output channel: tiles of W pixels, the last
  // one half as wide where half covers it (a 14 x 14 grid: 222 wide cells, 3.5 tiles, not 4).
  // Pixel tiles outside, channel blocks inside: a tile's input rows stay in L1 across blocks.
  DTRAIN_CONV_INLINE static void forward(const T* in, std::int64_t in_stride, std::int64_t cin,
                                         const T* w, std::int64_t cout, const std::int64_t* off,
                                         std::int64_t taps, const T* bias, T* out,
                                         std::int64_t out_stride, std::int64_t begin,
                                         std::int64_t end) {
    constexpr int NH = NV > 1 ? NV / 2 : NV;
    for (std::int64_t p0 = begin; p0 < end; p0 += W) {
      if (NV > 1 && end - p0 <= NH * L)
        channels<NH>(in, in_stride, cin, w, cout, off, taps, bias, out, out_stride, p0);
      else
        channels<NV>(in, in_stride, cin, w, cout, off, taps, bias, out, out_stride, p0);
    }
  }

  // dst[0, n) = src[0, n) in whole vectors of NB bytes, the last one overlapping the one before
  // (no scalar tail once n fills one), rows shorter than that in vectors half as wide, down to 8
  // bytes: the crop, the output gradient's spread, the pad and the fold are rows of 14 to 64
  // values, where a library call per row cost more than the row, and so did a scalar loop over
  // a row of 14 (17% of the 16 -> 32 layer's forward on 14 x 14).
  template <int NB = B>
  DTRAIN_CONV_INLINE static void copy_row(const T* src, T* dst, std::int64_t n) {
    using R = typename ConvVec<T, NB>::unaligned;
    constexpr std::int64_t RL = NB / static_cast<int>(sizeof(T));
    if (n < RL) {
      if constexpr (NB / 2 >= 8 && NB / 2 >= static_cast<int>(sizeof(T)))
        copy_row<NB / 2>(src, dst, n);
      else
        for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i];
      return;
    }
    std::int64_t i = 0;
    for (; i + RL <= n; i += RL)
      *reinterpret_cast<R*>(dst + i) = *reinterpret_cast<const R*>(src + i);
    if (i < n) *reinterpret_cast<R*>(dst + n - RL) = *reinterpret_cast<const R*>(src + n - RL);
  }
  DTRAIN_CONV_INLINE static void copy_rows(const ConvRowsCall<T>& a) {
    for (std::int64_t i = 0; i < a.count[0]; ++i)
      for (std::int64_t j = 0; j < a.count[1]; ++j)
        for (std::int64_t k = 0; k < a.count[2]; ++k)
          copy_row(a.src + i * a.src_step[0] + j * a.src_step[1] + k * a.src_step[2],
                   a.dst + i * a.dst_step[0] + j * a.dst_step[1] + k * a.dst_step[2], a.n);
  }

  // dw[co][ci][t0 + g] += sum over p < count of dy[co][p] * x[ci][p + off[t0 + g]], for output
  // channels co0 .. co0 + C - 1 and G kernel cells, lane by lane: dw holds one vector per weight
  // (slots of LS values), reduced across lanes once per batch by the caller. A horizontal sum per
  // tile and sample cost more than the tile's FMAs on small grids (a 14 x 14 grid is 16 vectors).
  static constexpr std::int64_t LS = ConvDirectPlan::lane_bytes / static_cast<int>(sizeof(T));
  template <int C, int G>
  DTRAIN_CONV_INLINE static void wgrad_tile(const T* x, const T* dy, std::int64_t dy_stride,
                                            std::int64_t count, const std::int64_t* off,
                                            std::int64_t t0, std::int64_t co0, std::int64_t ci,
                                            std::int64_t cin, std::int64_t taps, T* dw) {
    V acc[C][G];
    for (int c = 0; c < C; ++c)
      for (int g = 0; g < G; ++g)
        acc[c][g] = *reinterpret_cast<const U*>(dw + (((co0 + c) * cin + ci) * taps + t0 + g) * LS);
    for (std::int64_t p = 0; p < count; p += L) {
      V d[C];
      for (int c = 0; c < C; ++c)
        d[c] = *reinterpret_cast<const U*>(dy + (co0 + c) * dy_stride + p);
      for (int g = 0; g < G; ++g) {
        V xv = *reinterpret_cast<const U*>(x + p + off[t0 + g]);
#if DTRAIN_CONV_DIRECT_X86 && !defined(__clang__)
        // One load per kernel cell: GCC would otherwise fold it into each of the C FMAs. (Clang
        // checks the operand against the template's own target, before inlining, and refuses it.)
        asm("" : "+v"(xv));
#endif
        for (int c = 0; c < C; ++c) acc[c][g] += d[c] * xv;
      }
    }
    for (int c = 0; c < C; ++c)
      for (int g = 0; g < G; ++g)
        *reinterpret_cast<U*>(dw + (((co0 + c) * cin + ci) * taps + t0 + g) * LS) = acc[c][g];
  }

  template <int C>
  DTRAIN_CONV_INLINE static void wgrad_cells(const T* x, const T* dy, std::int64_t dy_stride,
                                             std::int64_t count, const std::int64_t* off,
                                             std::int64_t co0, std::int64_t ci, std::int64_t cin,
                                             std::int64_t taps, T* dw) {
    std::int64_t t = 0;
    for (; t + WG <= taps; t += WG)
      wgrad_tile<C, WG>(x, dy, dy_stride, count, off, t, co0, ci, cin, taps, dw);
    for (; t + 3 <= taps; t += 3)
      wgrad_tile<C, 3>(x, dy, dy_stride, count, off, t, co0, ci, cin, taps, dw);
    for (; t < taps; ++t) wgrad_tile<C, 1>(x, dy, dy_stride, count, off, t, co0, ci, cin, taps, dw);
  }

  // Weight gradient [cout, cin, taps] (lane by lane, see wgrad_tile) and bias gradient [cout] of
  // one sample, accumulated. count: wide cells to sum over, a multiple of L (dy is zero past the
  // output cells).
  DTRAIN_CONV_INLINE static void weight_grad(const T* x, std::int64_t x_stride, std::int64_t cin,
                                             const T* dy, std::int64_t dy_stride, std::int64_t cout,
                                             const std::int64_t* off, std::int64_t taps,
                                             std::int64_t count, T* dw, T* db) {
    // Channel blocks of WC, and of 2 rather than 1 where WC would leave one behind (a 1-channel
    // tile loads a value per multiply-add: 16 = 3 x 4 + 2 + 2, 8 = 3 + 3 + 2).
    for (std::int64_t co = 0; co < cout;) {
      const std::int64_t rest = cout - co;
      if (rest >= WC && rest != WC + 1) {
        for (std::int64_t ci = 0; ci < cin; ++ci)
          wgrad_cells<WC>(x + ci * x_stride, dy, dy_stride, count, off, co, ci, cin, taps, dw);
        co += WC;
      } else if (rest >= 2) {
        for (std::int64_t ci = 0; ci < cin; ++ci)
          wgrad_cells<2>(x + ci * x_stride, dy, dy_stride, count, off, co, ci, cin, taps, dw);
        co += 2;
      } else {
        for (std::int64_t ci = 0; ci < cin; ++ci)
          wgrad_cells<1>(x + ci * x_stride, dy, dy_stride, count, off, co, ci, cin, taps, dw);
        ++co;
      }
    }
    for (std::int64_t co = 0; co < cout; ++co) {
      V acc = {};
      for (std::int64_t p = 0; p < count; p += L) {
        acc += *reinterpret_cast<const U*>(dy + co * dy_stride + p);
      }
      T sum = 0;
      for (int j = 0; j < L; ++j) sum += acc[j];
      db[co] += sum;
    }
  }
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Register budgets: AVX-512 has 32 vector registers (6 x 4 accumulators + 4 inputs + 1 weight;
// 3 x 9 partial sums + 3 + 1), AVX2 and SSE 16 (2 x 4 + 4 + 1; 2 x 6 + 2 + 1).
template <class T>
using ConvTilesAvx512 = ConvTiles<T, 64, 6, 4, 3, 9>;
template <class T>
using ConvTilesAvx2 = ConvTiles<T, 32, 2, 4, 2, 6>;
template <class T>
using ConvTilesPortable = ConvTiles<T, 16, 2, 4, 2, 6>;

/// Arguments of one run of the tiled loops (see ConvTiles::forward and ::weight_grad).
template <class T>
struct ConvTileCall {
  const T* in;
  std::int64_t in_stride, cin;
  const T* w;
  std::int64_t cout;
  const std::int64_t* off;
  std::int64_t taps;
  const T* bias;
  T* out;
  std::int64_t out_stride, begin, end;
};
template <class T>
struct ConvWgradCall {
  const T* x;
  std::int64_t x_stride, cin;
  const T* dy;
  std::int64_t dy_stride, cout;
  const std::int64_t* off;
  std::int64_t taps, count;
  T* dw;
  T* db;
};

// One entry pair per instruction set; `flatten` pulls every helper into the target function.
#define DTRAIN_CONV_ENTRIES(suffix, tiles, attributes)                                      \
  template <class T>                                                                        \
  attributes void conv_tiles_##suffix(const ConvTileCall<T>& a) {                           \
    tiles<T>::forward(a.in, a.in_stride, a.cin, a.w, a.cout, a.off, a.taps, a.bias, a.out,  \
                      a.out_stride, a.begin, a.end);                                        \
  }                                                                                         \
  template <class T>                                                                        \
  attributes void conv_wgrad_##suffix(const ConvWgradCall<T>& a) {                          \
    tiles<T>::weight_grad(a.x, a.x_stride, a.cin, a.dy, a.dy_stride, a.cout, a.off, a.taps, \
                          a.count, a.dw, a.db);                                             \
  }                                                                                         \
  template <class T>                                                                        \
  attributes void conv_rows_##suffix(const ConvRowsCall<T>& a) {                            \
    tiles<T>::copy_rows(a);                                                                 \
  }
DTRAIN_CONV_ENTRIES(portable, ConvTilesPortable, __attribute__((flatten)))
#if DTRAIN_CONV_DIRECT_X86
DTRAIN_CONV_ENTRIES(avx2, ConvTilesAvx2, __attribute__((target("avx2,fma"), flatten)))
DTRAIN_CONV_ENTRIES(avx512, ConvTilesAvx512, __attribute__((target("avx512f,fma"), flatten)))
#endif
#undef DTRAIN_CONV_ENTRIES
#undef DTRAIN_CONV_INLINE

// Only float has the x86 versions: double, the type of gradient checks, never takes the direct
// kernel unless asked (ConvLowering::direct) and runs the portable one, which leaves two of the
// six flattened instantiations out of every program that builds double models.
template <class T>
void conv_tiles(ConvIsa isa, const ConvTileCall<T>& a) {
#if DTRAIN_CONV_DIRECT_X86
  if constexpr (std::is_same_v<T, float>) {
    if (isa == ConvIsa::avx512) return conv_tiles_avx512(a);
    if (isa == ConvIsa::avx2) return conv_tiles_avx2(a);
  }
#endif
  (void)isa;
  conv_tiles_portable(a);
}
template <class T>
void conv_wgrad(ConvIsa isa, const ConvWgradCall<T>& a) {
#if DTRAIN_CONV_DIRECT_X86
  if constexpr (std::is_same_v<T, float>) {
    if (isa == ConvIsa::avx512) return conv_wgrad_avx512(a);
    if (isa == ConvIsa::avx2) return conv_wgrad_avx2(a);
  }
#endif
  (void)isa;
  conv_wgrad_portable(a);
}

template <class T>
void conv_rows(ConvIsa isa, const ConvRowsCall<T>& a) {
#if DTRAIN_CONV_DIRECT_X86
  if constexpr (std::is_same_v<T, float>) {
    if (isa == ConvIsa::avx512) return conv_rows_avx512(a);
    if (isa == ConvIsa::avx2) return conv_rows_avx2(a);
  }
#endif
  (void)isa;
  conv_rows_portable(a);
}

// Wide offset of every kernel cell: off[t] = flat(kd, kh, kw), t in kernel order.
inline void conv_offsets(const ConvDirectPlan& p, std::int64_t* off) {
  std::int64_t t = 0;
  for (std::int64_t kd = 0; kd < p.kernel[0]; ++kd)
    for (std::int64_t kh = 0; kh < p.kernel[1]; ++kh)
      for (std::int64_t kw = 0; kw < p.kernel[2]; ++kw) off[t++] = p.flat(kd, kh, kw);
}

// One sample x [cin, in cells] onto the padded grid: the input rows in place, then with periodic
// padding the wrapped borders, axis by axis (the last axis within each input row, then whole
// rows, then whole planes: each copies cells the step before completed). Zero borders are never
// written: the caller's initial fill keeps them zero.
template <class T>
void conv_pad(const ConvDirectPlan& p, ConvIsa isa, const T* x, T* xpad) {
  const std::int64_t row = p.padded[2], plane = p.padded[1] * p.padded[2];
  conv_rows<T>(isa, {x,
                     xpad + p.flat(p.pad[0], p.pad[1], p.pad[2]),
                     p.in[2],
                     {p.in_channels, p.in[0], p.in[1]},
                     {p.in_cells(), p.in[1] * p.in[2], p.in[2]},
                     {p.x_stride, plane, row}});
  if (!p.periodic) return;
  for (std::int64_t c = 0; c < p.in_channels; ++c) {
    T* xc = xpad + c * p.x_stride;
    for (std::int64_t d = p.pad[0]; d < p.pad[0] + p.in[0]; ++d) {
      for (std::int64_t h = p.pad[1]; h < p.pad[1] + p.in[1]; ++h) {
        T* r = xc + p.flat(d, h, 0);
        for (std::int64_t w = 0; w < p.pad[2]; ++w) r[w] = r[w + p.in[2]];
        for (std::int64_t w = p.pad[2] + p.in[2]; w < row; ++w) r[w] = r[w - p.in[2]];
      }
      for (std::int64_t h = 0; h < p.pad[1]; ++h)
        std::copy_n(xc + p.flat(d, h + p.in[1], 0), row, xc + p.flat(d, h, 0));
      for (std::int64_t h = p.pad[1] + p.in[1]; h < p.padded[1]; ++h)
        std::copy_n(xc + p.flat(d, h - p.in[1], 0), row, xc + p.flat(d, h, 0));
    }
    for (std::int64_t d = 0; d < p.pad[0]; ++d)
      std::copy_n(xc + p.flat(d + p.in[0], 0, 0), plane, xc + p.flat(d, 0, 0));
    for (std::int64_t d = p.pad[0] + p.in[0]; d < p.padded[0]; ++d)
      std::copy_n(xc + p.flat(d - p.in[0], 0, 0), plane, xc + p.flat(d, 0, 0));
  }
}

}  // namespace detail

/// Forward of `rows` samples: y [rows, cout, out cells] = conv(x [rows, cin, in cells], w [cout,
/// cin, taps]) + bias. Scratch: wpack [cin * taps * cout] and the plan's xpad and ywide. Local,
/// blocking; the caller owns every buffer.
template <class T>
void conv_direct_forward(ConvDirectPlan p, ConvIsa isa, std::int64_t rows, const T* x, const T* w,
                         const T* bias, T* y, T* wpack, T* xpad, T* ywide) {
  const std::int64_t cin = p.in_channels, cout = p.out_channels, taps = p.taps;
  std::int64_t off[conv_direct_max_taps];
  detail::conv_offsets(p, off);
  // Weights as [cin, taps, cout]: a tile's C output channels are adjacent.
  for (std::int64_t co = 0; co < cout; ++co)
    for (std::int64_t ci = 0; ci < cin; ++ci)
      for (std::int64_t t = 0; t < taps; ++t)
        wpack[(ci * taps + t) * cout + co] = w[(co * cin + ci) * taps + t];
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::conv_pad(p, isa, x + r * cin * p.in_cells(), xpad);
    detail::conv_tiles<T>(
        isa, {xpad, p.x_stride, cin, wpack, cout, off, taps, bias, ywide, p.y_stride, 0, p.wide});
    // Crop: output cell (d, h, w) is wide cell flat(d, h, w).
    detail::conv_rows<T>(isa, {ywide,
                               y + r * cout * p.out_cells(),
                               p.out[2],
                               {cout, p.out[0], p.out[1]},
                               {p.y_stride, p.padded[1] * p.padded[2], p.padded[2]},
                               {p.out_cells(), p.out[1] * p.out[2], p.out[2]}});
  }
}

/// Backward of `rows` samples: dw [cout, cin, taps] and db [cout] += this batch's gradients, and
/// dx [rows, cin, in cells] = the input gradient unless dx is null. Scratch: wpack [cout * taps *
/// cin], the plan's xpad, dywide and dxwide, and dwlanes [cout * cin * taps * lane_bytes /
/// sizeof(T)] (any contents). Local, blocking; the caller owns every buffer.
template <class T>
void conv_direct_backward(ConvDirectPlan p, ConvIsa isa, std::int64_t rows, const T* x, const T* dy,
                          const T* w, T* dw, T* db, T* dx, T* wpack, T* xpad, T* dywide, T* dxwide,
                          T* dwlanes) {
  const std::int64_t cin = p.in_channels, cout = p.out_channels, taps = p.taps;
  // The weight gradient's partial sums, one vector per weight, summed across lanes at the end.
  constexpr std::int64_t LS = ConvDirectPlan::lane_bytes / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t weights = cout * cin * taps;
  std::fill(dwlanes, dwlanes + weights * LS, T(0));
  const std::int64_t margin = p.last_offset;
  // The weight gradient sums over the wide cells in whole vectors of the widest set (each set's
  // vector divides it), not over the whole y_stride (a 14 x 14 grid: 224 cells, not 256).
  const std::int64_t count = (p.wide + LS - 1) / LS * LS;
  std::int64_t off[conv_direct_max_taps], mirrored[conv_direct_max_taps];
  detail::conv_offsets(p, off);
  // The input gradient at wide cell j sums w[co][ci][t] * dy at wide cell j - off[t]: the forward
  // kernel over dywide (stored `margin` cells in) with offsets margin - off[t] and the weights as
  // [cout, taps, cin].
  for (std::int64_t t = 0; t < taps; ++t) mirrored[t] = margin - off[t];
  if (dx)
    for (std::int64_t co = 0; co < cout; ++co)
      for (std::int64_t ci = 0; ci < cin; ++ci)
        for (std::int64_t t = 0; t < taps; ++t)
          wpack[(co * taps + t) * cin + ci] = w[(co * cin + ci) * taps + t];
  // Wide cells the fold reads: the centre with zero padding, the whole grid with periodic.
  const std::int64_t grid = p.padded[0] * p.padded[1] * p.padded[2];
  const std::int64_t lo = p.periodic ? 0 : p.flat(p.pad[0], p.pad[1], p.pad[2]);
  const std::int64_t hi =
      p.periodic
          ? grid
          : p.flat(p.pad[0] + p.in[0] - 1, p.pad[1] + p.in[1] - 1, p.pad[2] + p.in[2] - 1) + 1;
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::conv_pad(p, isa, x + r * cin * p.in_cells(), xpad);
    // dy onto the wide layout; the cells between rows and past the output stay zero from the
    // caller's initial fill, so every sum below may run over whole vectors.
    detail::conv_rows<T>(isa, {dy + r * cout * p.out_cells(),
                               dywide + margin,
                               p.out[2],
                               {cout, p.out[0], p.out[1]},
                               {p.out_cells(), p.out[1] * p.out[2], p.out[2]},
                               {p.dy_stride, p.padded[1] * p.padded[2], p.padded[2]}});
    detail::conv_wgrad<T>(isa, {xpad, p.x_stride, cin, dywide + margin, p.dy_stride, cout, off,
                                taps, count, dwlanes, db});
    if (!dx) continue;
    detail::conv_tiles<T>(isa, {dywide, p.dy_stride, cout, wpack, cin, mirrored, taps, nullptr,
                                dxwide, p.dx_stride, lo, hi});
    // Fold: input cell i on an axis collects padded cell i + pad (the rows copied below), and
    // with periodic padding also the copies of it at i + pad -/+ n (added after).
    T* dxs = dx + r * cin * p.in_cells();
    detail::conv_rows<T>(isa, {dxwide + p.flat(p.pad[0], p.pad[1], p.pad[2]),
                               dxs,
                               p.in[2],
                               {cin, p.in[0], p.in[1]},
                               {p.dx_stride, p.padded[1] * p.padded[2], p.padded[2]},
                               {p.in_cells(), p.in[1] * p.in[2], p.in[2]}});
    if (!p.periodic) continue;
    auto candidates = [&](int a, std::int64_t i, std::int64_t* q) {
      int n = 0;
      q[n++] = i + p.pad[a];
      if (i + p.pad[a] - p.in[a] >= 0) q[n++] = i + p.pad[a] - p.in[a];
      if (i + p.pad[a] + p.in[a] < p.padded[a]) q[n++] = i + p.pad[a] + p.in[a];
      return n;
    };
    const std::int64_t n2 = p.in[2], pad2 = p.pad[2];
    for (std::int64_t c = 0; c < cin; ++c)
      for (std::int64_t d = 0; d < p.in[0]; ++d)
        for (std::int64_t h = 0; h < p.in[1]; ++h) {
          std::int64_t qd[3], qh[3];
          const int nd = candidates(0, d, qd), nh = candidates(1, h, qh);
          T* dst = dxs + ((c * p.in[0] + d) * p.in[1] + h) * n2;
          for (int a = 0; a < nd; ++a)
            for (int b = 0; b < nh; ++b) {
              const T* src = dxwide + c * p.dx_stride + p.flat(qd[a], qh[b], 0);
              if (a > 0 || b > 0)
                for (std::int64_t w = 0; w < n2; ++w) dst[w] += src[pad2 + w];
              // The last axis: cell w also sits at pad2 + w + n2 (w < pad2) and at pad2 + w - n2
              // (w >= n2 - pad2).
              for (std::int64_t w = 0; w < pad2; ++w) dst[w] += src[pad2 + w + n2];
              for (std::int64_t w = n2 - pad2; w < n2; ++w) dst[w] += src[pad2 + w - n2];
            }
        }
  }
  // Lanes a narrower instruction set never wrote are still zero: the sum is the same.
  for (std::int64_t k = 0; k < weights; ++k) {
    T sum = 0;
    for (std::int64_t j = 0; j < LS; ++j) sum += dwlanes[k * LS + j];
    dw[k] += sum;
  }
}

}  // namespace host
}  // namespace dtrain
