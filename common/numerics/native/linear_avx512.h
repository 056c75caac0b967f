// Linears on AVX-512, for CPUs without AMX (AMD Zen 4 and later, Intel Cooper Lake, Xeons whose hypervisor hides
// AMX), part of linear.cpp. The same packed weights as the AMX kernel, blocks of [in / 2][16][2] (int8 in its
// widening order) for each 16 outputs, except that `pack` interleaves the 64-byte lines of groups of blocks for them
// (`block_start`). Two kernels over that layout; a machine runs one (`common.native.linear_kernel` picks it from the
// CPU), and every stage and the reference run the same one.
//
// Each 64-byte line of the packed layout holds an input pair of 16 outputs. "fma": widened to float32 in
// registers (a shift, a mask: exact), it gives two vectors of 16 weights, and each meets one input of a row
// (broadcast) in a float32 fused multiply-add into those 16 outputs' accumulators. "dot": VDPBF16PS takes the line
// as it is and a row's input pair (broadcast) and adds the pair's two products to the accumulators, the odd one
// first. Either way every output's accumulator runs through the inputs in one order, from zero, one rounding per
// input: the order is fixed by construction and no other row takes part, so a row gets the same bits in a call of
// any size (the two kernels' bits differ). Registers hold AVX_ROWS rows x AVX_BLOCKS blocks of accumulators; a
// call of more rows repeats the pass over the same weights (from cache). No split over the inputs, no reduction
// across threads: threads take whole groups of blocks.
//
// Why two. A decode step's 121 linears of SmolLM2 (weights read from memory) at 1 / 32 / 64 rows: on a Xeon whose
// VM hides AMX (family 6 model 207), fma 14.7 / 63.2 / 94.9 ms, dot 14.8 / 74.9 / 129.0 (it issues VDPBF16PS at
// half the rate of its float32 multiply-adds); on an AMD EPYC (Zen 5, family 26), fma 6.3 / 30.9 / 67.0 ms, dot
// 5.4 / 16.3 / 25.4 (one VDPBF16PS does the work of two multiply-adds and two widenings), oneDNN 9.8 / 21.5 / 34.5.
#pragma once

namespace {

#ifdef STEPWISE_AVX512
constexpr int AVX_ROWS = 6, AVX_BLOCKS = 4;  // 24 accumulators of the 32 registers
// How far ahead of its loads each block's weights are requested: bfloat16 and int4 into L2 (PREFETCHT1), int8 into
// L1. Into L1, one row of bfloat16 read its weights at about 0.7x the rate on the 2-core Zen 4 (weights from memory,
// one thread, shared machine: provisional), and 5 rows cost 1.5x as much: the requests held L1's few miss buffers,
// the loads waited for them. int4 gained about 1.1x into L2; int8, whose widening spaces its loads out, lost at one
// and two rows (0.96x, 0.9x) and stays (docs/native-kernels.md, "verify rows").
constexpr int64_t AVX_PREFETCH_BYTES = 1024;
// Each thread takes one contiguous run of blocks (at::parallel_for splits [0, blocks) evenly: SmolLM2's 576
// outputs are 36 blocks, 18 a thread) and goes through it AVX_BLOCKS blocks at a time, then 2, then 1. The blocks
// of a group are independent accumulator chains, and one row needs them: each VDPBF16PS waits for the one before
// it on the same accumulator. On the EPYC, 576 x 576 at one row with the weights in cache, one thread: 14.0 us
// (bfloat16) and 15.0 us (int8) with one block at a time, 8.6 and 6.5 us in groups. In an engine the weights come
// from memory, and there the 121 linears of a step came out the same: at one row (memory-bound; medians of ten
// alternations in one process, 6.22 / 3.80 ms before and 6.45 / 3.81 after, bfloat16 / int8) and at 4 and 32
// rows (within the 2-5% by which whichever build ran second in an alternation won). No bits change: an output's
// sum never depends on how outputs are grouped or split over threads.
//
// `align`: the weight's interleave. An even split can fall inside a group of interleaved blocks (SmolLM2's 36
// blocks: thread 1 starts at block 18, the third of group 16-19), and then every group of that thread straddled
// two interleaved groups, reading half the lines of each: two strided streams instead of one run of memory. So a
// thread first takes the blocks up to the next boundary (2, then 1). Stage 04, flipped on and off every other
// engine step in one process, medians of 170-510 steps: one request, int8, 7.14 -> 6.97 ms a step (6.80 with
// the scales' prefetch below too; again 6.56 -> 6.32 with both); bfloat16 10.85 -> 10.79 and 10.93 -> 10.91;
// 32 requests, bfloat16 31.10 -> 30.98, int8 with both 28.65 -> 28.16.
template <typename Run>
void for_block_groups(int64_t blocks, const Run& run, int64_t align = 1, int64_t most = AVX_BLOCKS) {
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t block = b0; block < b1;) {
      const int64_t left = b1 - block, to_aligned = (align - block % align) % align;
      if (to_aligned >= 2 && left >= 2) run(std::integral_constant<int, 2>(), block), block += 2;
      else if (to_aligned == 1) run(std::integral_constant<int, 1>(), block), block += 1;
      else if (most >= AVX_BLOCKS && left >= AVX_BLOCKS)
        run(std::integral_constant<int, AVX_BLOCKS>(), block), block += AVX_BLOCKS;
      else if (left >= 2) run(std::integral_constant<int, 2>(), block), block += 2;
      else run(std::integral_constant<int, 1>(), block), block += 1;
    }
  });
}

// Two input pairs (p, p + 1, p even) of one block's packed weights, as bfloat16 vectors: read in place, or int8
// widened in registers (`widen_int8`'s order: 64 bytes hold pairs p and p + 1). A block's 64-byte lines lie
// `stride` bytes apart: 64 where each block is contiguous, 64 x interleave where `pack` interleaved blocks.
struct Bf16Pairs {
  static constexpr int64_t bytes_per_pair = 64;
  static constexpr bool into_l2 = true;  // `AVX_PREFETCH_BYTES` says why
  static void load(const void* block, int64_t p, int64_t stride, __m512i& a, __m512i& b) {
    const auto* w = static_cast<const char*>(block) + p * stride;
    a = _mm512_loadu_si512(w), b = _mm512_loadu_si512(w + stride);
  }
};

struct Int8Pairs {
  static constexpr int64_t bytes_per_pair = 32;
  static constexpr bool into_l2 = false;
  static void load(const void* block, int64_t p, int64_t stride, __m512i& a, __m512i& b) {
    const __m512i s = _mm512_loadu_si512(static_cast<const char*>(block) + p / 2 * stride);
    const __m512i low0 = _mm512_load_si512(kWidening.low), low1 = _mm512_load_si512(kWidening.low + 64);
    const __m512i high0 = _mm512_load_si512(kWidening.high), high1 = _mm512_load_si512(kWidening.high + 64);
    const __m512i lo = _mm512_permutex2var_epi8(low0, s, low1);
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, s, high1), s,
                                                 _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
    a = _mm512_unpacklo_epi8(lo, hi), b = _mm512_unpackhi_epi8(lo, hi);
  }
};

// Asks for the line AVX_PREFETCH_BYTES (of the block's own bytes) past pair p of a block, once per step of the loops
// below (two pairs: one line of int8, two of bfloat16, of which the hardware prefetcher finds the other).
template <typename Pairs>
inline void prefetch_line(const void* block, int64_t p, int64_t stride) {
  const char* line = static_cast<const char*>(block) + (p * Pairs::bytes_per_pair + AVX_PREFETCH_BYTES) / 64 * stride;
  if constexpr (Pairs::into_l2) _mm_prefetch(line, _MM_HINT_T1);
  else _mm_prefetch(line, _MM_HINT_T0);
}

// Four inputs (2p .. 2p + 3) of a block's 16 outputs, as float32: bfloat16 is float32's upper half, so the
// even input of each packed pair is the pair shifted left, the odd one the pair with its low half cleared.
template <typename Pairs>
inline void widen_four(const void* block, int64_t p, int64_t stride, __m512 (&w)[4]) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512i a, b;
  Pairs::load(block, p, stride, a, b);
  w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), w[1] = _mm512_castsi512_ps(_mm512_and_si512(a, high));
  w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), w[3] = _mm512_castsi512_ps(_mm512_and_si512(b, high));
}

// R rows of x (float32, row stride kp) times C blocks of 16 outputs, into acc[r][c]: one fused multiply-add per
// input, in input order, from zero. The weights are widened in registers on every pass over the rows: widening
// them once into a float32 copy in L2 and reading that on each pass was slower (timed on the build machine).
template <int R, int C, typename Pairs>
void dot_rows(const float* X, int64_t kp, const void* const* blocks, int64_t stride, __m512 (&acc)[R][C]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp / 2; p += 2) {
    __m512 w[C][4];
    for (int c = 0; c < C; ++c) {
      prefetch_line<Pairs>(blocks[c], p, stride);
      widen_four<Pairs>(blocks[c], p, stride, w[c]);
    }
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < R; ++r) {
        const __m512 xi = _mm512_set1_ps(X[r * kp + 2 * p + i]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xi, w[c][i], acc[r][c]);
      }
  }
}

// The same with VDPBF16PS, x as bfloat16 pairs (row stride kp / 2): one instruction per input pair, which adds
// the pair's odd product, then its even one, to the accumulator (each product of two bfloat16 is exact in
// float32). Again every output's accumulator runs through the inputs in one fixed order that no other row changes.
template <int R, int C, typename Pairs>
void dot_rows(const uint32_t* X, int64_t kp, const void* const* blocks, int64_t stride, __m512 (&acc)[R][C]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp / 2; p += 2) {
    __m512i w[C][2];
    for (int c = 0; c < C; ++c) {
      prefetch_line<Pairs>(blocks[c], p, stride);
      Pairs::load(blocks[c], p, stride, w[c][0], w[c][1]);
    }
    for (int i = 0; i < 2; ++i)
      for (int r = 0; r < R; ++r) {
        const __m512bh xi = (__m512bh)_mm512_set1_epi32(static_cast<int>(X[r * (kp / 2) + p + i]));
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xi, (__m512bh)w[c][i]);
      }
  }
}

// Where block b of a packed weight starts: blocks one after another (interleave 1), or groups of `interleave`
// blocks (2 or 4) with their 64-byte lines alternating, so that a task of four blocks reads one run of memory
// rather than four (common.native.block_interleave has the timings).
inline const char* block_start(const char* W, int64_t b, int64_t block_bytes, int interleave) {
  return W + b / interleave * interleave * block_bytes + b % interleave * 64;
}

// All m rows times C blocks (output columns from col0): passes of up to AVX_ROWS rows (later passes find the
// weights in cache). X: float32 rows (multiply-adds) or bfloat16 pairs (VDPBF16PS).
template <int C, typename Pairs, typename XT>
void multiply_avx512(const XT* X, int64_t m, int64_t kp, const char* W, int64_t block_bytes, int interleave,
                     int64_t col0, int64_t n, const float* scale, uint16_t* O) {
  const int64_t row_stride = std::is_same_v<XT, uint32_t> ? kp / 2 : kp;
  const void* blocks[C];
  for (int c = 0; c < C; ++c) blocks[c] = block_start(W, col0 / 16 + c, block_bytes, interleave);
  const int64_t stride = 64 * interleave;
  // int8: the C blocks' scales, requested now so that they arrive while the weights stream. They are read only
  // after the last input, and in a decode step they are cold (the step's weights streamed through the caches
  // since this layer ran): left to the store, each group waited a memory latency at its end. One request, int8,
  // flipped on and off every other step: 7.14 -> 6.99 ms a step (medians of ~190 steps).
  if (scale)
    for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(scale + col0 + 16 * c), _MM_HINT_T0);
  alignas(64) float acc_rows[AVX_ROWS][C][16];
  for (int64_t row0 = 0; row0 < m; row0 += AVX_ROWS) {
    const int rows = static_cast<int>(std::min<int64_t>(AVX_ROWS, m - row0));
    const XT* Xr = X + row0 * row_stride;
    auto run = [&](auto rows_constant) {
      constexpr int R = decltype(rows_constant)::value;
      __m512 acc[R][C];
      dot_rows<R, C, Pairs>(Xr, kp, blocks, stride, acc);
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) _mm512_store_ps(acc_rows[r][c], acc[r][c]);
    };
    switch (rows) {
      case 6: run(std::integral_constant<int, 6>()); break;
      case 5: run(std::integral_constant<int, 5>()); break;
      case 4: run(std::integral_constant<int, 4>()); break;
      case 3: run(std::integral_constant<int, 3>()); break;
      case 2: run(std::integral_constant<int, 2>()); break;
      default: run(std::integral_constant<int, 1>()); break;
    }
    for (int c = 0; c < C; ++c) {
      const int64_t col = col0 + 16 * c, cols = std::min<int64_t>(16, n - col);
      if (cols <= 0) continue;
      for (int r = 0; r < rows; ++r)
        store_rows(&acc_rows[r][c], 1, scale ? scale + col : nullptr, O + (row0 + r) * n + col, n, cols);
    }
  }
}

// x [m, kp] (padded; float32 for multiply-adds, bfloat16 pairs for VDPBF16PS) times every block of a packed
// weight, bfloat16 or int8 (then scaled per output).
template <typename XT>
void linear_avx512(const XT* X, int64_t m, int64_t kp, const void* W, bool int8, int64_t blocks, int interleave,
                   const float* scale, int64_t n, uint16_t* O) {
  const int64_t block_bytes = kp * 16 * (int8 ? 1 : 2);
  const char* base = static_cast<const char*>(W);
  for_block_groups(blocks, [&](auto blocks_constant, int64_t block) {
    constexpr int C = decltype(blocks_constant)::value;
    if (int8) multiply_avx512<C, Int8Pairs>(X, m, kp, base, block_bytes, interleave, block * 16, n, scale, O);
    else multiply_avx512<C, Bf16Pairs>(X, m, kp, base, block_bytes, interleave, block * 16, n, scale, O);
  }, interleave);
}

// int4 (`pack_int4`'s records: per block of 16 outputs and group of 32 inputs, the outputs' fp16 d and m, then the
// codes) with VDPBF16PS, for R rows x C blocks: each group's 16 input pairs, widened to bfloat16 in registers (as
// `widen_int4` does: 64 code bytes give four pairs), go into fresh accumulators, one VDPBF16PS per pair in input
// order; then every output adds d * (x . q) and m * (the group's sum of x), group after group, as the AMX kernel
// does (`add_group`).
template <int R, int C>
void multiply_int4_rows(const uint32_t* X, int64_t kp, const uint8_t* const* records, const float* sums,
                        float (*acc)[C][16]) {
  const int64_t chunks = kp / 32;
  const __m512i low = _mm512_load_si512(kInt4.low), high = _mm512_load_si512(kInt4.high);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_store_ps(acc[r][c], _mm512_setzero_ps());
  for (int64_t g = 0; g < chunks; ++g) {
    for (int c = 0; c < C; ++c)
      for (int l = 0; l < INT4_RECORD; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(records[c] + g * INT4_RECORD) + PREFETCH_INT4_CHUNKS * INT4_RECORD
                     + l, _MM_HINT_T1);
    __m512 part[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[r][c] = _mm512_setzero_ps();
    for (int q = 0; q < 4; ++q)  // pairs 4q .. 4q + 3
      for (int h = 0; h < 2; ++h) {
        __m512i w[C][2];
        for (int c = 0; c < C; ++c) {
          const __m512i v = _mm512_loadu_si512(records[c] + g * INT4_RECORD + 64 + 64 * q);
          const __m512i nibbles = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, nibble);
          const __m512i lo = _mm512_shuffle_epi8(low, nibbles), hi = _mm512_shuffle_epi8(high, nibbles);
          w[c][0] = _mm512_unpacklo_epi8(lo, hi), w[c][1] = _mm512_unpackhi_epi8(lo, hi);
        }
        for (int i = 0; i < 2; ++i)
          for (int r = 0; r < R; ++r) {
            const int64_t pair = g * 16 + 4 * q + 2 * h + i;
            const __m512bh xp = (__m512bh)_mm512_set1_epi32(static_cast<int>(X[r * (kp / 2) + pair]));
            for (int c = 0; c < C; ++c) part[r][c] = _mm512_dpbf16_ps(part[r][c], xp, (__m512bh)w[c][i]);
          }
      }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        _mm512_store_ps(acc[r][c], add_group(_mm512_load_ps(acc[r][c]), records[c] + g * INT4_RECORD, part[r][c],
                                             sums[r * chunks + g]));
  }
}

// Rows a pass: 4 x AVX_BLOCKS blocks (16 group accumulators, 8 weight vectors, a broadcast), or 8 x 2 blocks. Calls
// of 5 to 8 rows take blocks two at a time and run one pass over them, each record decoded once for all its rows:
// against passes of 4 over 4 blocks (which decode every record twice), 1.04-1.10x at 5-8 rows on the 2-core Zen 4
// (weights from memory, one thread, alternated in one process). The bfloat16 and int8 kernels above gained nothing
// from it (their blocks interleave in fours, and 2 of 4 read half of every 256 bytes).
constexpr int INT4_ROWS = 4, INT4_WIDE_ROWS = 8;

// x [m, kp] (bfloat16 pairs) times int4 records [blocks][kp / 32][INT4_RECORD]; `sums` [m][kp / 32].
void linear_int4_avx512(const uint32_t* X, int64_t m, int64_t kp, const uint8_t* W, int64_t blocks,
                        const float* sums, int64_t n, uint16_t* O) {
  const int64_t block_records = kp / 32 * INT4_RECORD;
  for_block_groups(blocks, [&](auto blocks_constant, int64_t first) {
    constexpr int C = decltype(blocks_constant)::value;
    const uint8_t* records[C];
    for (int c = 0; c < C; ++c) records[c] = W + (first + c) * block_records;
    constexpr int ROWS = C <= 2 ? INT4_WIDE_ROWS : INT4_ROWS;
    alignas(64) float acc[ROWS][C][16];
    for (int64_t row0 = 0; row0 < m; row0 += ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(ROWS, m - row0));
      const uint32_t* Xr = X + row0 * (kp / 2);
      const float* Sr = sums + row0 * (kp / 32);
      switch (rows) {
        case 8: if constexpr (ROWS >= 8) multiply_int4_rows<8, C>(Xr, kp, records, Sr, acc); break;
        case 7: if constexpr (ROWS >= 7) multiply_int4_rows<7, C>(Xr, kp, records, Sr, acc); break;
        case 6: if constexpr (ROWS >= 6) multiply_int4_rows<6, C>(Xr, kp, records, Sr, acc); break;
        case 5: if constexpr (ROWS >= 5) multiply_int4_rows<5, C>(Xr, kp, records, Sr, acc); break;
        case 4: multiply_int4_rows<4, C>(Xr, kp, records, Sr, acc); break;
        case 3: multiply_int4_rows<3, C>(Xr, kp, records, Sr, acc); break;
        case 2: multiply_int4_rows<2, C>(Xr, kp, records, Sr, acc); break;
        default: multiply_int4_rows<1, C>(Xr, kp, records, Sr, acc); break;
      }
      for (int c = 0; c < C; ++c) {
        const int64_t col = (first + c) * 16, cols = std::min<int64_t>(16, n - col);
        if (cols <= 0) continue;
        for (int r = 0; r < rows; ++r) store_rows(&acc[r][c], 1, nullptr, O + (row0 + r) * n + col, n, cols);
      }
    }
  }, 1, m > INT4_ROWS && m <= INT4_WIDE_ROWS ? 2 : AVX_BLOCKS);
}
#endif

}  // namespace
