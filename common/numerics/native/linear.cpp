// Batch-invariant linears on Intel AMX: y = x @ W.T with bfloat16 activations, float32 accumulation, and
// weights in bfloat16, in int8 with one scale per output (widened to bfloat16 exactly, a tile at a time), or
// in GGUF Q4_1 groups of 32 (int4 codes q widened exactly; each group's sums scaled by its d and m).
//
// Why a kernel of our own: oneDNN's bfloat16 linear keeps a row's bits only in calls of up
// to 32 rows on the machine this was built on, and at one row it reads the weights at about
// 10 GB/s, half of what the memory gives. This kernel fixes every output's reduction by
// construction, so a row gets the same bits in a call of any size:
//   * the input features are taken in chunks of 32, in order; each chunk is one AMX
//     TDPBF16PS that adds its 16 pairs of products into the float32 accumulator of that
//     (row, output) element; a tile's rows never mix, so how many rows a tile holds (1..16)
//     and which other rows share it cannot change a bit;
//   * the accumulator is rounded to bfloat16 once, to nearest even.
// No split over the input features, no reduction across threads: threads take whole
// column blocks. The weight is packed once at load into the tile's pair-interleaved layout,
// [out / 16][in / 2][16][2] (zero padded to 16 outputs and 32 inputs; a zero pair adds +0).
//
// int4 (the GGUF's Q4_1 groups) runs on the same tiles: `linear_int4.h`.
//
// Built with -march=native: where the compiler or the CPU lacks AMX-BF16, `ready()` is
// false, and bfloat16 and int8 weights run on `linear_avx512.h`'s kernel (the same packed
// weights) where the CPU has AVX-512 BF16, else on `linear_portable.h`'s (AVX2, NEON or plain C++;
// its own layout; the bits of the AVX-512 FMA kernel). Linux also asks each process
// to request the AMX tile state (arch_prctl) before its first use; `ready()` does that once.
#include <torch/csrc/utils/pybind.h>  // tensors to and from Python
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
#define STEPWISE_AVX512 1  // the kernel of linear_avx512.h, and what the AMX kernel needs besides the tiles
#include <immintrin.h>
#endif
#if defined(STEPWISE_AVX512) && defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
#define STEPWISE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

#ifdef STEPWISE_AVX512
// Rounds `rows` accumulator rows (times the outputs' scales, if any) to bfloat16 into out[.., 0..cols).
void store_rows(const float (*acc)[16], int rows, const float* scale, uint16_t* out, int64_t ldo, int64_t cols) {
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  const __m512 s = scale ? _mm512_maskz_loadu_ps(mask, scale) : _mm512_set1_ps(1.0f);
  for (int r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(acc[r]);
    if (scale) v = _mm512_mul_ps(v, s);
    _mm256_mask_storeu_epi16(out + r * ldo, mask, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

// int8 weights -> bfloat16, exactly (|q| <= 127 has 7 significant bits), keeping the packed order.
// `pack` stores each int8 weight as sign and magnitude (bit 7 the sign, bits 0-6 |q|), and each 64 weights
// in the order the in-lane byte unpacks below take them: then 64 weights widen with two 128-entry table
// lookups (the low and the high byte of bfloat16(|q|)), one logic op for the sign and two unpacks, about 1.4x
// fewer cycles than converting through float32.
struct WideningTables {
  alignas(64) uint8_t low[128], high[128];
  WideningTables() {
    for (int m = 0; m < 128; ++m) {
      const float f = static_cast<float>(m);
      uint32_t bits;
      __builtin_memcpy(&bits, &f, 4);
      low[m] = static_cast<uint8_t>(bits >> 16), high[m] = static_cast<uint8_t>(bits >> 24);
    }
  }
};
const WideningTables kWidening;

void widen_int8(const int8_t* q, int64_t count, uint16_t* dst) {
  const __m512i low0 = _mm512_load_si512(kWidening.low), low1 = _mm512_load_si512(kWidening.low + 64);
  const __m512i high0 = _mm512_load_si512(kWidening.high), high1 = _mm512_load_si512(kWidening.high + 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < count; i += 64) {
    const __m512i s = _mm512_loadu_si512(q + i);
    const __m512i lo = _mm512_permutex2var_epi8(low0, s, low1);  // the index's bit 7 (the sign) is ignored
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, s, high1), s, sign, 0xF8);
    _mm512_storeu_si512(dst + i, _mm512_unpacklo_epi8(lo, hi));
    _mm512_storeu_si512(dst + i + 32, _mm512_unpackhi_epi8(lo, hi));
  }
}

#endif

#ifdef STEPWISE_AMX
constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
// How far ahead of the tile loads the weights are requested, in chunks (1 KiB of bfloat16, 512 B of int8 per
// block): int8 needs the longer run-up because widening it costs time between loads. Picked by timing one
// decode step's linears at one row (weights read from memory) on the build machine; noisy, roughly 1.1x each.
constexpr int PREFETCH_BF16_CHUNKS = 2, PREFETCH_INT8_CHUNKS = 32;

struct alignas(64) TileConfig {
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0, 1 accumulate rows [0, a) against weight blocks 6, 7, from activations in 4;
// 2, 3 rows [16, 16 + b) from activations in 5 (int4 with one tile of rows: a second group of the
// same rows). Every tile row is 64 bytes (16 float32 accumulators, or 32 bfloat16 inputs, or 16
// output pairs).
struct Tiles {
  int a = -1, b = -1;
  void configure(int rows_a, int rows_b) {
    if (rows_a == a && rows_b == b) return;
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
    cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = static_cast<uint8_t>(rows_a);
    cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = static_cast<uint8_t>(rows_b > 0 ? rows_b : 1);
    cfg.rows[6] = cfg.rows[7] = 16;
    _tile_loadconfig(&cfg);
    a = rows_a, b = rows_b;
  }
};

// Where a tile's weights come from: packed bfloat16 in place, or int8 widened chunk by chunk into a 2 KiB buffer
// that stays in L1 (one chunk: 32 inputs x 16 outputs, for each of the two blocks).
struct Bf16Weights {
  const uint16_t* w0;
  int64_t block_elems;
  bool second;
  void chunk(int64_t c, const uint16_t*& t0, const uint16_t*& t1, bool first_pass) {
    t0 = w0 + c * 512, t1 = t0 + block_elems;
    if (!first_pass) return;  // later row passes find the weights in cache
    const char* ahead = reinterpret_cast<const char*>(t0 + PREFETCH_BF16_CHUNKS * 512);
    for (int l = 0; l < 1024; l += 64) {
      _mm_prefetch(ahead + l, _MM_HINT_T0);
      if (second) _mm_prefetch(ahead + block_elems * 2 + l, _MM_HINT_T0);
    }
  }
};

struct Int8Weights {
  const int8_t* q0;
  int64_t block_elems;
  bool second;
  uint16_t* buffer;  // 2 x 512, 64-byte aligned
  void chunk(int64_t c, const uint16_t*& t0, const uint16_t*& t1, bool first_pass) {
    if (first_pass) {
      const char* ahead = reinterpret_cast<const char*>(q0 + (c + PREFETCH_INT8_CHUNKS) * 512);
      for (int l = 0; l < 512; l += 64) {
        _mm_prefetch(ahead + l, _MM_HINT_T0);
        if (second) _mm_prefetch(ahead + block_elems + l, _MM_HINT_T0);
      }
    }
    widen_int8(q0 + c * 512, 512, buffer);
    if (second) widen_int8(q0 + block_elems + c * 512, 512, buffer + 512);
    t0 = buffer, t1 = buffer + 512;
  }
};

// Every row of x (m rows of kp bfloat16) times one or two blocks of 16 outputs, into out's columns
// [col0, col0 + 32) clipped to n; `scale` (or null) multiplies each output before rounding.
template <typename Weights>
void multiply_blocks(const uint16_t* X, int64_t m, int64_t kp, Weights weights, int64_t col0, int64_t n,
                     const float* scale, uint16_t* O, Tiles& tiles) {
  alignas(64) float acc[4][16][16];
  const int64_t chunks = kp / 32;
  const bool second = weights.second;
  // int8: the blocks' scales, read only at the store, requested now (as linear_avx512.h's multiply_avx512 does,
  // where it was measured; no AMX machine was at hand to time it here).
  if (scale) _mm_prefetch(reinterpret_cast<const char*>(scale + col0), _MM_HINT_T0);
  if (scale && second) _mm_prefetch(reinterpret_cast<const char*>(scale + col0 + 16), _MM_HINT_T0);
  for (int64_t row0 = 0; row0 < m; row0 += 32) {  // two tiles of up to 16 rows
    const int a = static_cast<int>(std::min<int64_t>(16, m - row0));
    const int b = static_cast<int>(std::clamp<int64_t>(m - row0 - 16, 0, 16));
    tiles.configure(a, b);
    const uint16_t* X0 = X + row0 * kp;
    const uint16_t* X1 = X0 + 16 * kp;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t c = 0; c < chunks; ++c) {  // the input features, 32 at a time, in order
      const uint16_t *W0, *W1;
      weights.chunk(c, W0, W1, row0 == 0);
      _tile_loadd(6, W0, 64);
      _tile_loadd(4, X0 + c * 32, kp * 2);
      _tile_dpbf16ps(0, 4, 6);
      if (second) { _tile_loadd(7, W1, 64); _tile_dpbf16ps(1, 4, 7); }
      if (b) {
        _tile_loadd(5, X1 + c * 32, kp * 2);
        _tile_dpbf16ps(2, 5, 6);
        if (second) _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, acc[0], 64);
    if (second) _tile_stored(1, acc[1], 64);
    if (b) { _tile_stored(2, acc[2], 64); if (second) _tile_stored(3, acc[3], 64); }
    for (int t = 0; t < 4; ++t) {
      const int64_t col = col0 + (t & 1) * 16, cols = std::min<int64_t>(16, n - col);
      const int rows = (t & 2) ? b : a;
      if (((t & 1) && !second) || rows == 0 || cols <= 0) continue;
      store_rows(acc[t], rows, scale ? scale + col : nullptr, O + (row0 + (t >> 1) * 16) * n + col, n, cols);
    }
  }
}

#endif

}  // namespace

#include "linear_int4.h"  // int4 on the same tiles: Q4_1 groups (needs Tiles and store_rows above)
#include "linear_avx512.h"  // the same packed weights on AVX-512 (float32 multiply-adds), where there is no AMX
#include "linear_portable_ops.h"  // any CPU (AVX2, NEON, plain C++): the AVX-512 FMA kernel's bits, its own layout

namespace {

bool ready() {
#ifdef STEPWISE_AMX
  static const bool ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return ok;
#else
  return false;
#endif
}

// weight [n, k] (bfloat16 or int8) -> [n / 16][k / 2][16][2], zero padded to 16 outputs and 32 inputs.
// int8 is stored for `widen_int8`: sign and magnitude, and within each 64 bytes, packed weight
// w = 8 * lane + r (lane 0-3, r 0-7) at byte 16 * lane + r, and w = 32 + 8 * lane + r at 16 * lane + 8 + r.
// `interleave` 2 or 4 (the AVX-512 kernels' layout, where it divides the number of blocks): each group of that many
// blocks with their 64-byte lines alternating (`block_start` in linear_avx512.h); 1: block after block, the layout
// every kernel reads.
at::Tensor interleave_blocks(const at::Tensor& packed, int64_t interleave) {
  if (interleave == 1) return packed;
  const int64_t blocks = packed.size(0);
  TORCH_CHECK((interleave == 2 || interleave == 4) && blocks % interleave == 0,
              "interleave takes 1, or 2 or 4 where it divides the number of blocks");
  const auto bytes = packed.view(at::kByte);
  auto lines = bytes.reshape({blocks / interleave, interleave, -1, 64}).permute({0, 2, 1, 3}).contiguous();
  return lines.view(bytes.sizes()).view(packed.scalar_type());
}

at::Tensor pack(const at::Tensor& weight, int64_t interleave) {
  TORCH_CHECK(weight.dim() == 2, "pack takes a 2-D weight");
  const int64_t n = weight.size(0), k = weight.size(1), np = round_up(n, 16), kp = round_up(k, 32);
  auto padded = at::zeros({np, kp}, weight.options());
  padded.narrow(0, 0, n).narrow(1, 0, k).copy_(weight);
  auto packed = padded.view({np / 16, 16, kp / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  if (weight.scalar_type() != at::kChar) return interleave_blocks(packed, interleave);
  TORCH_CHECK(weight.numel() == 0 || weight.min().item<int>() >= -127, "int8 weights must lie in -127..127");
  auto q = packed.to(at::kShort);
  auto sign_magnitude = at::where(q < 0, 128 - q, q).to(at::kByte).view({-1, 64});
  auto byte = at::arange(64, q.options().dtype(at::kLong));
  auto lane = byte.div(16, "floor"), r = byte.remainder(16);
  auto stored = sign_magnitude.index_select(1, at::where(r < 8, 8 * lane + r, 32 + 8 * lane + r - 8));
  return interleave_blocks(stored.view(at::kChar).view(packed.sizes()), interleave);
}

// Rows `ids` of a packed int8 weight (`pack`'s layout, with the `interleave` it was given) as int8 [ids, k]; with
// `scales`, dequantized to bfloat16: q * the row's scale (exact in float32), rounded once. The embedding lookup reads
// the tied LM head's packed table this way (one call; through tensor ops it took a dozen, about 0.6 ms a token
// in a decode step of one request, whose weights had just pushed everything else out of the caches).
at::Tensor int8_rows(const at::Tensor& packed, const at::Tensor& ids, int64_t k, int64_t interleave,
                     const c10::optional<at::Tensor>& scales) {
  const bool portable = packed.dim() == 3;  // pack_portable's [blocks][kp][16]: weight (o, i) at (o / 16, i, o % 16)
  TORCH_CHECK(packed.scalar_type() == at::kChar && (packed.dim() == 4 || portable) && packed.is_contiguous(),
              "int8_rows reads an int8 weight from pack or pack_portable");
  const int64_t blocks = packed.size(0), kp = portable ? packed.size(1) : packed.size(1) * 2, block_bytes = kp * 16;
  TORCH_CHECK(0 < k && k <= kp && (interleave == 1 || interleave == 2 || interleave == 4), "k or interleave");
  const auto id = ids.to(at::kLong).contiguous();
  const int64_t n = id.numel(), *id_p = id.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) TORCH_CHECK(0 <= id_p[r] && id_p[r] < blocks * 16, "row id out of range");
  const at::Tensor scale = scales ? scales->to(at::kFloat).contiguous() : at::Tensor();
  auto out = at::empty({n, k}, packed.options().dtype(scales ? at::kBFloat16 : at::kChar));
  const auto* W = static_cast<const uint8_t*>(packed.const_data_ptr());
  const float* S = scales ? scale.data_ptr<float>() : nullptr;
  auto* dequantized = scales ? out.data_ptr<at::BFloat16>() : nullptr;
  auto* values = scales ? nullptr : out.data_ptr<int8_t>();
  at::parallel_for(0, n, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = id_p[r] / 16, o = id_p[r] % 16;
      const uint8_t* block = W + b / interleave * interleave * block_bytes + b % interleave * 64;
      if (portable) {
        for (int64_t i = 0; i < k; ++i) {
          const int q = static_cast<int8_t>(block[i * 16 + o]);
          if (S) dequantized[r * k + i] = at::BFloat16(q * S[id_p[r]]);
          else values[r * k + i] = static_cast<int8_t>(q);
        }
        continue;
      }
      for (int64_t i = 0; i < k; ++i) {
        // Input i is half i % 2 of pair i / 2; 64-byte line i / 4 holds pairs 2l and 2l + 1 of the block's outputs,
        // packed weight w of a line at byte 16 * lane + r (w = 8 * lane + r) or 16 * lane + 8 + r (w = 32 + ...).
        const int64_t w = (i / 2 % 2) * 32 + o * 2 + i % 2, low = w % 32;
        const uint8_t byte = block[i / 4 * 64 * interleave + low / 8 * 16 + (w >= 32) * 8 + low % 8];
        const int q = byte & 0x80 ? -(byte & 0x7F) : byte & 0x7F;
        if (S) dequantized[r * k + i] = at::BFloat16(q * S[id_p[r]]);
        else values[r * k + i] = static_cast<int8_t>(q);
      }
    }
  });
  return out;
}

bool avx512_ready() {
#ifdef STEPWISE_AVX512
  return true;  // built with -march=native for this CPU, so the CPU has AVX-512 BF16
#else
  return false;
#endif
}

// x [m, k] bfloat16 times a packed weight: bfloat16; int8 with one float32 scale per output (y = (x . q) * s);
// or int4 records (`pack_int4`, uint8: y = sum over groups of d (x . q) + m (sum of x)). `kernel`: "amx" on the AMX
// tiles; "dot" (VDPBF16PS) or "fma" (float32 multiply-adds, no int4) with AVX-512 (`linear_avx512.h`); "portable"
// on any CPU, for weights from `pack_portable` / `pack_int4_portable` (float32 ones too, with float32 x); "w4a8"
// the portable kernel on int4 records with the rows quantized to int8 (`linear_portable_w4a8.h`).
// `interleave`: the layout `pack` was given (1 for AMX, int4 and the portable kernel).
at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, const c10::optional<at::Tensor>& scales, int64_t n,
                  const std::string& kernel, int64_t interleave) {
  TORCH_CHECK(kernel == "amx" || kernel == "fma" || kernel == "dot" || kernel == "portable" || kernel == "w4a8",
              "kernel must be amx, fma, dot, portable or w4a8");
  if (kernel == "portable" || kernel == "w4a8") {
    TORCH_CHECK(interleave == 1, "the portable kernel's weights are not interleaved");
    return linear_portable(x_in, packed, scales, n, kernel == "w4a8");
  }
  const bool amx = kernel == "amx";
  TORCH_CHECK(!amx || ready(), "the AMX linear needs a CPU with AMX-BF16 (see stepwise_linear::ready)");
  TORCH_CHECK(amx || avx512_ready(), "the AVX-512 linear needs a CPU with AVX-512 BF16 and VBMI");
  TORCH_CHECK(kernel != "fma" || packed.scalar_type() != at::kByte, "int4 runs on the amx and dot kernels only");
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16, "x must be 2-D bfloat16");
  const bool int8 = packed.scalar_type() == at::kChar, int4 = packed.scalar_type() == at::kByte;
  TORCH_CHECK(int8 || int4 || packed.scalar_type() == at::kBFloat16, "the packed weight must be bfloat16, int8 or int4");
  TORCH_CHECK(int8 == scales.has_value(), "int8 weights need their scales, bfloat16 and int4 weights none");
  TORCH_CHECK(!int4 || (packed.dim() == 3 && packed.size(2) == INT4_RECORD), "int4 weights come from pack_int4");
  const int64_t m = x_in.size(0), k = x_in.size(1), blocks = packed.size(0);
  const int64_t kp = int4 ? packed.size(1) * 32 : packed.size(1) * 2;
  TORCH_CHECK(k <= kp && kp - k < 32 && n <= blocks * 16 && n > blocks * 16 - 16, "x or n does not fit the weight");
  TORCH_CHECK(!int4 || k == kp, "int4 takes whole groups of 32 inputs");
  TORCH_CHECK(interleave == 1 || ((interleave == 2 || interleave == 4) && !amx && !int4 && blocks % interleave == 0),
              "interleave 2 or 4 is the AVX-512 kernels' layout of bfloat16 and int8 weights, where it divides the blocks");
  auto out = at::empty({m, n}, x_in.options());
#ifdef STEPWISE_AVX512
  if (m == 0) return out;
  at::Tensor x = x_in.contiguous();
  if (kp != k) x = at::constant_pad_nd(x, {0, kp - k}, 0);  // zero inputs meet the weight's zero padding
  at::Tensor scale = int8 ? scales->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!int8 || scale.numel() >= n, "one scale per output");
  const auto* X = reinterpret_cast<const uint16_t*>(x.data_ptr());
  auto* O = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float* S = int8 ? scale.data_ptr<float>() : nullptr;
  if (kernel == "fma") {
    const at::Tensor xf = x.to(at::kFloat);  // exact
    linear_avx512(xf.data_ptr<float>(), m, kp, packed.const_data_ptr(), int8, blocks, static_cast<int>(interleave), S,
                  n, O);
    return out;
  }
  if (kernel == "dot" && int4) {
    std::vector<float> group_sums(m * (kp / 32));
    sum_groups(X, m, kp, group_sums.data());
    linear_int4_avx512(reinterpret_cast<const uint32_t*>(X), m, kp, static_cast<const uint8_t*>(packed.const_data_ptr()),
                       blocks, group_sums.data(), n, O);
    return out;
  }
  if (kernel == "dot") {
    linear_avx512(reinterpret_cast<const uint32_t*>(X), m, kp, packed.const_data_ptr(), int8, blocks,
                  static_cast<int>(interleave), S, n, O);
    return out;
  }
#endif
#ifdef STEPWISE_AMX
  const int64_t block_elems = kp * 16, pairs = (blocks + 1) / 2, block_records = kp / 32 * INT4_RECORD;
  std::vector<float> group_sums(int4 ? m * (kp / 32) : 0);
  if (int4) sum_groups(X, m, kp, group_sums.data());
  // int4, one row: the row's groups spread for multiply_int4_row (per calling thread: zeros stay zeros). The
  // pointer is taken here: in the workers below, `spread` would be their own.
  thread_local std::vector<uint16_t> spread;
  const uint16_t* spread_x = nullptr;
  if (int4 && m == 1) {
    if (spread.size() < static_cast<size_t>(DIAG * kp)) spread.assign(DIAG * kp, 0);
    for (int64_t c = 0; c < kp / 32; ++c) std::copy(X + c * 32, X + c * 32 + 32, spread.data() + DIAG * c * 32);
    spread_x = spread.data();
  }
  const auto* Wb = reinterpret_cast<const uint16_t*>(packed.const_data_ptr());
  const auto* Wq = reinterpret_cast<const int8_t*>(packed.const_data_ptr());
  const auto* Wr = reinterpret_cast<const uint8_t*>(packed.const_data_ptr());
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    Tiles tiles;
    // int8 and int4: with more than one pass over the rows, each pair of blocks is widened once into `widened`
    // (L2); with one pass, chunk by chunk into `buffer` (L1).
    std::vector<uint16_t> widened((int8 || int4) && m > 32 ? 2 * block_elems : 0);
    alignas(64) uint16_t buffer[INT4_BUFFER];  // int8 takes 2 x 512 of it, int4 a ring of chunks
    for (int64_t p = p0; p < p1; ++p) {  // two blocks of 16 outputs
      const int64_t block = 2 * p, col0 = block * 16;
      const bool second = block + 1 < blocks;
      if (int4 && m == 1) {
        multiply_int4_row(spread_x, kp / 32, Wr + block * block_records, block_records, second, group_sums.data(),
                          col0, n, O, tiles, buffer);
      } else if (int4) {
        multiply_int4(X, m, kp, Wr + block * block_records, block_records, second, group_sums.data(), col0, n, O,
                      tiles, buffer, m > 32 ? widened.data() : nullptr);
      } else if (!int8) {
        multiply_blocks(X, m, kp, Bf16Weights{Wb + block * block_elems, block_elems, second}, col0, n, S, O, tiles);
      } else if (m <= 32) {
        multiply_blocks(X, m, kp, Int8Weights{Wq + block * block_elems, block_elems, second, buffer}, col0, n, S, O,
                        tiles);
      } else {
        widen_int8(Wq + block * block_elems, (second ? 2 : 1) * block_elems, widened.data());
        multiply_blocks(X, m, kp, Bf16Weights{widened.data(), block_elems, second}, col0, n, S, O, tiles);
      }
    }
    _tile_release();
  });
#endif
  return out;
}

}  // namespace

// Python functions, not torch.ops operators (common/native says why); kernels let go of the interpreter lock.
PYBIND11_MODULE(STEPWISE_MODULE, m) {
  m.def("ready", &ready);
  m.def("avx512_ready", &avx512_ready);
  m.def("pack", &pack, pybind11::arg("weight"), pybind11::arg("interleave") = 1);
  m.def("pack_int4", &pack_int4);
  m.def("portable_isa", &portable_isa);
  m.def("w4a8_isa", &w4a8_isa);
  m.def("pack_portable", &pack_portable);
  m.def("pack_int4_portable", &pack_int4_portable);
  m.def("int8_rows", &int8_rows, pybind11::arg("packed"), pybind11::arg("ids"), pybind11::arg("k"),
        pybind11::arg("interleave"), pybind11::arg("scales") = pybind11::none());
  m.def("linear", &linear, pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("scales"), pybind11::arg("n"),
        pybind11::arg("kernel") = "amx", pybind11::arg("interleave") = 1,
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
