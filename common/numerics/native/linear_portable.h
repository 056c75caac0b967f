// The portable batch-invariant linear: y = x @ W.T on any CPU, the same bits on every ISA (AVX2, NEON, plain C++)
// and the same bits as linear_avx512.h's "AVX-512 FMA" kernel. Torch-free: linear.cpp binds it for the engine,
// native/test/linear_test.cpp builds it alone (natively, for the scalar path, and for aarch64 under qemu).
//
// Why the bits cannot differ. In the packed layout (linear_portable_pack.h) one output sits in one vector lane, so
// an output's sum is a plain chain over its inputs in input order, from +0:
//     acc = fma(x_i, w_i, acc)          i = 0 .. kp - 1 (zero padded)
// one rounding per input; no horizontal sum, no split of the inputs, no contraction (explicit fma, built with
// -ffp-contract=off). Which rows share a call, how rows and outputs are blocked into registers, how outputs are
// split over threads: none of it touches a chain, so a row has the same bits in a call of any size, on any
// machine. Then, per output:
//   bfloat16 weights  y = bf16(acc)
//   float32 weights   y = acc (float32 x, float32 y)
//   int8 weights      y = bf16(acc * scale)       (the AVX-512 kernels' order: sum the integers, scale once)
//   int4 (Q4_1)       per group of 32 inputs a fresh chain part over its input pairs, the odd input of each
//                     pair first (the order of VDPBF16PS in linear_avx512.h's int4 kernel), then
//                     acc = fma(m, sum_g(x), fma(d, part, acc)), group after group; y = bf16(acc)
//   w4a8              int4's records times the rows rounded to int8, in integers: linear_portable_w4a8.h
// bf16() is VCVTNEPS2BF16's rounding (to nearest even, a subnormal to a signed zero), which the AVX-512 kernels use.
//
// Speed: decoding one request reads every weight once, so one row runs 2 blocks of 16 outputs at once (4 chains in
// flight) and requests its lines ahead; more rows run up to `max_rows` rows x 16 outputs in registers, in one pass;
// more than that, in passes over tiles of a block's inputs that stay in L1 (linear_portable_tiles.h; int4 from 3
// rows, its codes widened once per tile). int4 below that decodes its codes without shifts, against inputs scaled
// by powers of two (`scale_inputs`): the same products, so the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "linear_portable_pack.h"
#include "portable_simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace stepwise_portable {

// Rows per pass over a block, in registers. AVX2 has 16 vector registers and 16 outputs take 2, so R rows are 2R
// accumulators beside what one input step needs: float32 weights (a float32 model, or int4 widened once per tile)
// two weight vectors and a broadcast, room for 6 rows; int8 (two widened vectors) and w4a8's integer sums 6 as well;
// bfloat16 pairs 5 (at 6 they spilled to the stack); int4 decoded in registers, 4. A call's rows are cut into
// passes as even as can be (8 rows: 4 + 4, not 6 + 2). Measured: docs/native-kernels.md ("third stop"; int8 at 5
// and 6 rows in one pass: "verify rows").
constexpr int GROUP_BLOCKS = 4;
constexpr int64_t max_rows(Kind kind, bool widened) {
  return widened || kind == Kind::f32 || kind == Kind::w4a8 || kind == Kind::int8 ? 6 : kind == Kind::bf16 ? 5 : 4;
}

// `rows` rows in passes of at most `most`, as even as can be: run(row0, rows) for each.
template <class Run>
inline void row_passes(int64_t rows, int64_t most, const Run& run) {
  const int64_t passes = (rows + most - 1) / most;
  for (int64_t pass = 0, row0 = 0; pass < passes; ++pass) {
    const int64_t size = rows / passes + (pass < rows % passes);
    run(row0, size);
    row0 += size;
  }
}

// VCVTNEPS2BF16: round to nearest even; zero and subnormal -> signed zero; NaN stays a (quiet) NaN.
inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7F800000u) == 0x7F800000u) return static_cast<uint16_t>((u >> 16) | ((u & 0x7FFFFFu) ? 0x40u : 0u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct Problem {
  Kind kind;
  const float* x;  // [m][ldx] float32 (bfloat16 widened exactly); inputs k .. kp - 1 must be zero
  int64_t m, ldx, kp, n;
  const void* w;  // packed (linear_portable_pack.h)
  const float* scale;  // int8: one per output
  const float* sums;  // int4: [m][kp / 32], `group_sums`
  void* out;  // [m][n]: float32 for float32 weights, else bfloat16 bits
  const int8_t* qa = nullptr;  // w4a8: the rows quantized, [m][kp] and [m][kp / 32][2] (`quantize_rows`)
  const float* qs = nullptr;
};

// Each row's sum of x over each group of 32 inputs, in the order of linear_int4.h's `sum_groups`: x[i] + x[i + 16],
// then the halving tree of GCC's _mm512_reduce_add_ps (8 + 8, 4 + 4, lanes j and j + 2, lanes 0 and 1).
inline void group_sums(const float* X, int64_t m, int64_t ldx, int64_t groups, float* sums) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = X + r * ldx + g * GROUP;
      float v[16], t[8], u[4];
      for (int i = 0; i < 16; ++i) v[i] = x[i] + x[i + 16];
      for (int i = 0; i < 8; ++i) t[i] = v[i + 8] + v[i];
      for (int i = 0; i < 4; ++i) u[i] = t[i + 4] + t[i];
      sums[r * groups + g] = (u[0] + u[2]) + (u[1] + u[3]);
    }
}

// How far ahead the weights are requested (into L2: `prefetch`): AHEAD_BYTES on in this thread's walk over its
// blocks, C at a time side by side, so that near a block's end the request lands in the next C blocks (a thread's
// blocks are short runs, int4: 18 or 48 records at SmolLM2's shapes; asking a little ahead inside a block never
// reached the next pair, whose first lines then came late). It was "the same line two blocks on", which at a wide
// layer's shapes is 0.5-1 MB ahead; 4, 8 and 16 KB and two blocks measured alike at SmolLM2's (docs/native-kernels.md).
constexpr int64_t AHEAD_BYTES = 8192;
// What to request ahead of p, which lies `offset` bytes into its block of `bytes` (C blocks walked side by side).
template <int C>
inline const char* ahead_of(const char* p, int64_t offset, int64_t bytes) {
  return p + AHEAD_BYTES + (offset + AHEAD_BYTES >= bytes ? (C - 1) * bytes : 0);
}

// Group g's record of each of C blocks; with `ahead`, the record AHEAD_BYTES on requested.
template <int C>
inline void group_records(const char* const* blocks, int64_t g, int64_t groups, bool ahead,
                          const uint8_t* (&records)[C]) {
  for (int c = 0; c < C; ++c) {
    records[c] = reinterpret_cast<const uint8_t*>(blocks[c]) + g * INT4_RECORD;
    if (ahead)
      for (int l = 0; l < INT4_RECORD; l += 64)
        prefetch(ahead_of<C>(reinterpret_cast<const char*>(records[c]), g * INT4_RECORD, groups * INT4_RECORD) + l);
  }
}

}  // namespace stepwise_portable

#include "linear_portable_w4a8.h"

namespace stepwise_portable {

// One 64-byte line of a block, half h (outputs 8h .. 8h + 7): the weights of its input I, widened.
template <Kind K, int I>
inline V8 weight(const char* line, int h) {
  if constexpr (K == Kind::bf16) {
    V8 even, odd;
    widen_pairs(reinterpret_cast<const uint16_t*>(line + 32 * h), even, odd);
    return I == 0 ? even : odd;
  } else if constexpr (K == Kind::f32) {
    return load(reinterpret_cast<const float*>(line + 32 * h));
  } else {
    return widen_int8(reinterpret_cast<const int8_t*>(line + 16 * I + 8 * h));
  }
}
template <Kind K> constexpr int inputs_per_line() { return K == Kind::bf16 ? 2 : K == Kind::f32 ? 1 : 4; }

// Input i (the line's I-th) of R rows into their chains for C blocks: each row's input broadcast once.
template <Kind K, int I, int R, int C>
inline void multiply_input(const float* X, int64_t ldx, int64_t i, const char* const* lines, V8 (&acc)[R][C][2]) {
  V8 w[C][2];
  for (int c = 0; c < C; ++c) w[c][0] = weight<K, I>(lines[c], 0), w[c][1] = weight<K, I>(lines[c], 1);
  for (int r = 0; r < R; ++r) {
    const V8 x = broadcast(X[r * ldx + i]);
    for (int c = 0; c < C; ++c) acc[r][c][0] = fma(x, w[c][0], acc[r][c][0]), acc[r][c][1] = fma(x, w[c][1], acc[r][c][1]);
  }
}

// R rows x C blocks (bfloat16, float32 or int8 weights): every output's chain through inputs [i0, i1), in order,
// from +0 where i0 is 0, else from `out` (a tile of the many-row path goes on where the one before it stopped: the
// same chain, stored and reloaded exactly). `blocks` point at input i0 of each block. The chains live in a local
// array (registers), written out once: through `out` the compiler would store them after every step, since X's
// floats may alias them.
template <Kind K, int R, int C>
void dot(const float* X, int64_t ldx, int64_t kp, int64_t i0, int64_t i1, const char* const* blocks, bool ahead,
         V8 (&out)[R][C][2]) {
  constexpr int IN = inputs_per_line<K>();
  V8 acc[R][C][2];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c][0] = i0 == 0 ? zero() : out[r][c][0], acc[r][c][1] = i0 == 0 ? zero() : out[r][c][1];
  for (int64_t i = i0; i < i1; i += IN) {
    const char* lines[C];
    for (int c = 0; c < C; ++c) {
      lines[c] = blocks[c] + (i - i0) / IN * 64;
      if (ahead) {  // one or two rows of float32: into L1, this line of the block two on (`prefetch` says why)
        if constexpr (K == Kind::f32 && R <= 2) prefetch<true>(lines[c] + 2 * (kp / IN) * 64);
        else prefetch(ahead_of<C>(lines[c], i / IN * 64, kp / IN * 64));
      }
    }
    multiply_input<K, 0>(X, ldx, i, lines, acc);
    if constexpr (IN > 1) multiply_input<K, 1>(X, ldx, i + 1, lines, acc);
    if constexpr (IN > 2) multiply_input<K, 2>(X, ldx, i + 2, lines, acc);
    if constexpr (IN > 3) multiply_input<K, 3>(X, ldx, i + 3, lines, acc);
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r][c][0] = acc[r][c][0], out[r][c][1] = acc[r][c][1];
}

// int4, code T of a run (input i + T) into the R x C group chains of half H.
template <int T, int H, int R, int C>
inline void multiply_code(const float* X, int64_t ldx, int64_t i, const Codes (&codes)[C], V8 (&part)[R][C][2]) {
  V8 x[R];
  for (int r = 0; r < R; ++r) x[r] = broadcast(X[r * ldx + i + T]);
  for (int c = 0; c < C; ++c) {
    const V8 w = code_scaled<T>(codes[c]);  // q 16^T, against an input scaled by 2^-4T (`scale_inputs`)
    for (int r = 0; r < R; ++r) part[r][c][H] = fma(x[r], w, part[r][c][H]);
  }
}

// One run of codes (inputs i = 8 run .. 8 run + 7 of the group, half H of the outputs), each pair odd input first. H
// is a template argument so that the chains stay in registers (indexed at run time, they lived on the stack).
template <int H, int R, int C>
inline void multiply_run(const float* X, int64_t ldx, int64_t i, const uint8_t* const* records, int run,
                         V8 (&part)[R][C][2]) {
  Codes codes[C];
  for (int c = 0; c < C; ++c) codes[c] = load_codes(records[c] + 64 + 32 * (2 * run + H));
  multiply_code<1, H>(X, ldx, i, codes, part), multiply_code<0, H>(X, ldx, i, codes, part);
  multiply_code<3, H>(X, ldx, i, codes, part), multiply_code<2, H>(X, ldx, i, codes, part);
  multiply_code<5, H>(X, ldx, i, codes, part), multiply_code<4, H>(X, ldx, i, codes, part);
  multiply_code<7, H>(X, ldx, i, codes, part), multiply_code<6, H>(X, ldx, i, codes, part);
}

// The same for one block whose codes were widened once (`widen_tile`; `wide` at input i's 16 weights): input i + T,
// both halves.
template <int T, int R>
inline void multiply_wide(const float* X, int64_t ldx, int64_t i, const float* wide, V8 (&part)[R][1][2]) {
  const V8 w0 = load(wide + T * BLOCK), w1 = load(wide + T * BLOCK + 8);
  for (int r = 0; r < R; ++r) {
    const V8 x = broadcast(X[r * ldx + i + T]);
    part[r][0][0] = fma(x, w0, part[r][0][0]), part[r][0][1] = fma(x, w1, part[r][0][1]);
  }
}

// R rows x C blocks of int4 records, groups [g0, g1), into acc[r][c][16] (floats: adds group after group; from +0
// where g0 is 0, else going on from acc). WIDE: one block, its codes read from `wide`, which holds group g0's first
// input (its d and m still from the records).
template <int R, int C, bool WIDE = false>
void dot_int4(const float* X, int64_t ldx, int64_t groups, const float* sums, const char* const* blocks, bool ahead,
              float (&acc)[R][C][16], const float* wide = nullptr, int64_t g0 = 0, int64_t g1 = -1) {
  if (g0 == 0)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) std::fill(acc[r][c], acc[r][c] + 16, 0.0f);
  for (int64_t g = g0; g < (g1 < 0 ? groups : g1); ++g) {
    const uint8_t* records[C];
    group_records<C>(blocks, g, groups, ahead, records);
    V8 part[R][C][2];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[r][c][0] = part[r][c][1] = zero();
    for (int run = 0; run < 4; ++run) {  // inputs 8 run .. 8 run + 7
      const int64_t i = g * GROUP + 8 * run;
      if constexpr (WIDE) {
        const float* w = wide + (i - g0 * GROUP) * BLOCK;
        multiply_wide<1>(X, ldx, i, w, part), multiply_wide<0>(X, ldx, i, w, part);
        multiply_wide<3>(X, ldx, i, w, part), multiply_wide<2>(X, ldx, i, w, part);
        multiply_wide<5>(X, ldx, i, w, part), multiply_wide<4>(X, ldx, i, w, part);
        multiply_wide<7>(X, ldx, i, w, part), multiply_wide<6>(X, ldx, i, w, part);
      } else {
        multiply_run<0>(X, ldx, i, records, run, part), multiply_run<1>(X, ldx, i, records, run, part);
      }
    }
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < 2; ++h) {
        const uint16_t* half = reinterpret_cast<const uint16_t*>(records[c]) + 8 * h;
        const V8 d = widen_half(half), mins = widen_half(half + 16);
        for (int r = 0; r < R; ++r) {
          V8 a = fma(d, part[r][c][h], load(acc[r][c] + 8 * h));
          store(acc[r][c] + 8 * h, fma(mins, broadcast(sums[r * groups + g]), a));
        }
      }
  }
}

// Rounds (and scales) R rows x C blocks of sums into out's columns from col0.
template <int R, int C>
void store_rows(const Problem& p, int64_t row0, int64_t col0, float (&acc)[R][C][16]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int64_t col = col0 + 16 * c, cols = std::min<int64_t>(16, p.n - col);
      for (int64_t o = 0; o < cols; ++o) {
        const float v = p.kind == Kind::int8 ? acc[r][c][o] * p.scale[col + o] : acc[r][c][o];
        if (p.kind == Kind::f32) static_cast<float*>(p.out)[(row0 + r) * p.n + col + o] = v;
        else static_cast<uint16_t*>(p.out)[(row0 + r) * p.n + col + o] = round_bf16(v);
      }
    }
}

template <int R, int C>
void run(const Problem& p, int64_t row0, int64_t block) {
  const char* blocks[C];
  const int64_t bytes = block_bytes(p.kind, p.kp);
  for (int c = 0; c < C; ++c) blocks[c] = static_cast<const char*>(p.w) + (block + c) * bytes;
  const float* X = p.x + row0 * p.ldx;
  const bool ahead = row0 == 0;  // later passes over the rows find the weights in cache
  float out[R][C][16];
  if (p.kind == Kind::int4) {
    dot_int4<R, C>(X, p.ldx, p.kp / GROUP, p.sums + row0 * (p.kp / GROUP), blocks, ahead, out);
  } else if (p.kind == Kind::w4a8) {
    dot_w4a8<R, C>(p.qa + row0 * p.kp, p.kp, p.qs + 2 * row0 * (p.kp / GROUP), blocks, ahead, out);
  } else {
    V8 acc[R][C][2];
    if (p.kind == Kind::bf16) dot<Kind::bf16, R, C>(X, p.ldx, p.kp, 0, p.kp, blocks, ahead, acc);
    else if (p.kind == Kind::f32) dot<Kind::f32, R, C>(X, p.ldx, p.kp, 0, p.kp, blocks, ahead, acc);
    else dot<Kind::int8, R, C>(X, p.ldx, p.kp, 0, p.kp, blocks, ahead, acc);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store(out[r][c], acc[r][c][0]), store(out[r][c] + 8, acc[r][c][1]);
  }
  store_rows<R, C>(p, row0, block * BLOCK, out);
}

// `rows` rows from row0 times `count` blocks from `block`: one or two rows take two blocks at once (one row's 4 chains
// of one block wait on the fused multiply-add's latency), more rows one (their chains fill the registers). On the
// 2-core EPYC (Zen 1), 576 x 576 at one row from L2, a core: 4 blocks at once were 15-30% slower than 2 (spills).
template <int R>
void run_blocks(const Problem& p, int64_t row0, int64_t block, int64_t count) {
  for (int64_t b = block; b < block + count;) {
    if (R <= 2 && block + count - b >= 2) run<R, 2>(p, row0, b), b += 2;
    else run<R, 1>(p, row0, b), b += 1;
  }
}

// Blocks [b0, b1) of the outputs, every row, `max_rows` rows a pass (int4: each pass decodes the codes again).
inline void linear_blocks_direct(const Problem& p, int64_t b0, int64_t b1) {
  for (int64_t block = b0; block < b1; block += GROUP_BLOCKS) {
    const int64_t count = std::min<int64_t>(GROUP_BLOCKS, b1 - block);
    row_passes(p.m, max_rows(p.kind, false), [&](int64_t row0, int64_t rows) {
      switch (rows) {
        case 6: run_blocks<6>(p, row0, block, count); break;
        case 5: run_blocks<5>(p, row0, block, count); break;
        case 4: run_blocks<4>(p, row0, block, count); break;
        case 3: run_blocks<3>(p, row0, block, count); break;
        case 2: run_blocks<2>(p, row0, block, count); break;
        default: run_blocks<1>(p, row0, block, count); break;
      }
    });
  }
}

// int4 without shifts. Code T of a word is masked in place, so it arrives as q 16^T (`code_scaled`; code 7, the
// top nibble, is shifted down instead), and input T of each run of 8 arrives scaled by 2^-4T: the product
// x 2^-4T * q 16^T is the real number x q, so every fma rounds exactly as the chain above states, with one
// instruction fewer for six codes in eight. Exact while the scaling loses no bit of x: every input zero or at
// least 2^-100 in magnitude; `scale_inputs` finds one smaller (or a NaN) in the same pass and says no, and the call
// takes the widened path, which multiplies the codes as they are.
constexpr float SCALABLE_MIN = 0x1p-100f;
inline bool scale_inputs(const Problem& p, std::vector<float>& xs) {
  static constexpr float by[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
  xs.resize(p.m * p.kp);
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t i = 0; i < p.kp; ++i) {
      const float x = p.x[r * p.ldx + i];
      if (x != 0.0f && !(std::fabs(x) >= SCALABLE_MIN)) return false;
      xs[r * p.kp + i] = x * by[i % 8];
    }
  return true;
}

}  // namespace stepwise_portable

#include "linear_portable_tiles.h"

namespace stepwise_portable {

// Blocks [b0, b1) of the outputs, every row: what one thread does (threads split the outputs, never the inputs).
inline void linear_blocks(const Problem& p, int64_t b0, int64_t b1) {
  if (p.kind == Kind::int4) {
    thread_local std::vector<float> xs;  // each thread scales the one or two rows itself: a few µs, no barrier
    if (p.m >= INT4_WIDE_ROWS || !scale_inputs(p, xs)) return linear_blocks_tiled(p, b0, b1);
    Problem scaled = p;
    scaled.x = xs.data(), scaled.ldx = p.kp;
    return linear_blocks_direct(scaled, b0, b1);
  }
  // w4a8's records are compact (4 blocks of SmolLM2's layer: 23 KB), and passes over 4 blocks find them in L1
  // anyway: tiles gained nothing there (0.96-0.98x at 8 and 16 rows)
  if (p.m > max_rows(p.kind, false) && p.kind != Kind::w4a8) return linear_blocks_tiled(p, b0, b1);
  linear_blocks_direct(p, b0, b1);
}

// Every block: split evenly over OpenMP's threads where the build has them, else on this thread.
inline void linear(const Problem& p) {
  const int64_t blocks = block_count(p.n);
#ifdef _OPENMP
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    linear_blocks(p, blocks * t / threads, blocks * (t + 1) / threads);
  }
#else
  linear_blocks(p, 0, blocks);
#endif
}

}  // namespace stepwise_portable
