// int4 on the AMX tiles, part of linear.cpp (included there, after the tile helpers it uses: Tiles, store_rows).
//
// int4 keeps the GGUF's Q4_1 groups (32 inputs of one output share an fp16 scale d and minimum m: w = d q + m)
// and never forms w: a chunk of 32 inputs is one group, so a tile product is the group's sum x . q with the exact
// integers q, which is then scaled: d (x . q) + m (the group's sum of x), added group after group in float32.
// That costs a tile round trip per group, which one request's decode step amortizes (`multiply_int4_row`).
#pragma once

namespace {

constexpr int64_t INT4_RECORD = 320;  // one chunk of one block: d[16], m[16] (fp16), 256 code bytes

#ifdef STEPWISE_AVX512
// The helpers both int4 kernels use (the AMX one below, linear_avx512.h's): widening, the records' prefetch, a
// group's scaling, the groups' sums of x. How far ahead of the widening the records are requested, in chunks (a
// 320-byte record per block); picked like linear.cpp's prefetch distances.
constexpr int PREFETCH_INT4_CHUNKS = 16;

// int4 codes -> bfloat16, exactly (0..15). A chunk's 256 code bytes hold its 16 tile rows, four per 64 bytes
// (see `pack_int4`): the low nibbles give rows 4g and 4g + 1, the high ones rows 4g + 2 and 4g + 3, each through
// two 16-entry lookups (the low and the high byte of bfloat16(q)) and the same in-lane unpacks as int8.
struct Int4Tables {
  alignas(64) uint8_t low[64], high[64];
  Int4Tables() {
    for (int i = 0; i < 64; ++i) {
      const float f = static_cast<float>(i % 16);
      uint32_t bits;
      __builtin_memcpy(&bits, &f, 4);
      low[i] = static_cast<uint8_t>(bits >> 16), high[i] = static_cast<uint8_t>(bits >> 24);
    }
  }
};
const Int4Tables kInt4;

void widen_int4(const uint8_t* codes, uint16_t* dst) {
  const __m512i low = _mm512_load_si512(kInt4.low), high = _mm512_load_si512(kInt4.high);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int g = 0; g < 4; ++g) {
    const __m512i v = _mm512_loadu_si512(codes + 64 * g);
    const __m512i halves[2] = {_mm512_and_si512(v, nibble), _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble)};
    for (int h = 0; h < 2; ++h) {
      const __m512i lo = _mm512_shuffle_epi8(low, halves[h]), hi = _mm512_shuffle_epi8(high, halves[h]);
      _mm512_storeu_si512(dst + 32 * (4 * g + 2 * h), _mm512_unpacklo_epi8(lo, hi));
      _mm512_storeu_si512(dst + 32 * (4 * g + 2 * h + 1), _mm512_unpackhi_epi8(lo, hi));
    }
  }
}

// Requests a chunk's records (of one or both blocks) PREFETCH_INT4_CHUNKS chunks ahead.
void prefetch_records(const uint8_t* record, int64_t block_records, bool second) {
  for (int l = 0; l < INT4_RECORD; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(record) + PREFETCH_INT4_CHUNKS * INT4_RECORD + l, _MM_HINT_T0);
    if (second)
      _mm_prefetch(reinterpret_cast<const char*>(record + block_records) + PREFETCH_INT4_CHUNKS * INT4_RECORD + l,
                   _MM_HINT_T0);
  }
}

// One group into one row's 16 outputs: acc + d * (x . q), then + m * (the group's sum of x), each a fused
// multiply-add rounding once. Both paths below add every group through here, in group order.
inline __m512 add_group(__m512 acc, const uint8_t* record, __m512 products, float sum) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(record)));
  const __m512 mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + 32)));
  return _mm512_fmadd_ps(mins, _mm512_set1_ps(sum), _mm512_fmadd_ps(d, products, acc));
}
inline __m512 add_group(__m512 acc, const uint8_t* record, const float* products, float sum) {
  return add_group(acc, record, _mm512_loadu_ps(products), sum);
}

// Each row's sum of x over each group of 32 inputs, in float32, in one fixed order: [m][kp / 32].
void sum_groups(const uint16_t* X, int64_t m, int64_t kp, float* sums) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < kp / 32; ++c) {
      const uint16_t* x = X + r * kp + c * 32;
      const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
      const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16))), 16));
      sums[r * (kp / 32) + c] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    }
}
#endif

#ifdef STEPWISE_AMX
// For one row: how many groups share a tile round trip (rows of the spread activation tile) and how many chunks
// ahead of their tile loads the codes are widened (into a ring of buffers).
constexpr int DIAG = 4, RING = 4, AHEAD = 2;
static_assert(DIAG >= 1 && DIAG <= 16 && AHEAD < RING, "a tile has 16 rows; a ring slot is rewritten after use");
constexpr int INT4_BUFFER = RING * 1024;  // uint16 of widened weights per thread: RING slots of 2 blocks x 512

// int4: every row of x times one or two blocks of 16 outputs. Each chunk of 32 inputs is one Q4_1 group, so each
// tile product is one group's sum x . q (exact products, float32 sums), and the outputs add, group after group,
// d * (x . q) and then m * (the group's sum of x) in float32 (two fused multiply-adds, one rounding each): a row's
// bits depend on that row alone. `group_sums` [m][chunks]; `wide` (more than one pass over the rows) holds the
// pair's codes widened once, else they are widened chunk by chunk into `buffer` (L1).
void multiply_int4(const uint16_t* X, int64_t m, int64_t kp, const uint8_t* r0, int64_t block_records, bool second,
                   const float* group_sums, int64_t col0, int64_t n, uint16_t* O, Tiles& tiles, uint16_t* buffer,
                   uint16_t* wide) {
  alignas(64) float part[4][16][16], acc[4][16][16];
  const int64_t chunks = kp / 32;
  if (wide)
    for (int64_t c = 0; c < chunks; ++c) {
      widen_int4(r0 + c * INT4_RECORD + 64, wide + c * 512);
      if (second) widen_int4(r0 + block_records + c * INT4_RECORD + 64, wide + (chunks + c) * 512);
    }
  for (int64_t row0 = 0; row0 < m; row0 += 32) {  // two tiles of up to 16 rows
    const int a = static_cast<int>(std::min<int64_t>(16, m - row0));
    const int b = static_cast<int>(std::clamp<int64_t>(m - row0 - 16, 0, 16));
    const int rows[4] = {a, second ? a : 0, b, second ? b : 0};
    tiles.configure(a, b ? b : a);  // with one tile of rows, tiles 2, 3 and 5 take a second group of the same rows
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < rows[t]; ++r) _mm512_store_ps(acc[t][r], _mm512_setzero_ps());
    const uint16_t* X0 = X + row0 * kp;
    const uint16_t* X1 = X0 + 16 * kp;
    // The input features, one group of 32 at a time, in order. With one tile of rows, two groups go through the
    // tiles at once (accumulators 0, 1 and 2, 3): each group's products must leave the tiles before they are
    // scaled, and two in flight hide half of that round trip.
    for (int64_t c = 0; c < chunks;) {
      const int step = b == 0 && c + 1 < chunks ? 2 : 1;
      const uint16_t* W[2][2];  // [group of the step][block]
      for (int i = 0; i < step; ++i) {
        const uint8_t* rec = r0 + (c + i) * INT4_RECORD;
        if (wide) {
          W[i][0] = wide + (c + i) * 512, W[i][1] = wide + (chunks + c + i) * 512;
          continue;
        }
        if (row0 == 0) prefetch_records(rec, block_records, second);
        widen_int4(rec + 64, buffer + i * 1024);
        if (second) widen_int4(rec + block_records + 64, buffer + i * 1024 + 512);
        W[i][0] = buffer + i * 1024, W[i][1] = buffer + i * 1024 + 512;
      }
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      _tile_loadd(4, X0 + c * 32, kp * 2);
      _tile_loadd(6, W[0][0], 64);
      _tile_dpbf16ps(0, 4, 6);
      if (second) { _tile_loadd(7, W[0][1], 64); _tile_dpbf16ps(1, 4, 7); }
      if (step == 2) {  // the next group's products into tiles 2, 3
        _tile_loadd(5, X0 + (c + 1) * 32, kp * 2);
        _tile_loadd(6, W[1][0], 64);
        _tile_dpbf16ps(2, 5, 6);
        if (second) { _tile_loadd(7, W[1][1], 64); _tile_dpbf16ps(3, 5, 7); }
      } else if (b) {  // the same group's products for rows 16..31 into tiles 2, 3
        _tile_loadd(5, X1 + c * 32, kp * 2);
        _tile_dpbf16ps(2, 5, 6);
        if (second) _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, part[0], 64);
      if (second) _tile_stored(1, part[1], 64);
      if (step == 2 || b) { _tile_stored(2, part[2], 64); if (second) _tile_stored(3, part[3], 64); }
      for (int t = 0; t < 4; ++t) {
        // tile t holds group c + (t >> 1) of rows [0, a) when two groups ran, else group c of the rows it covers
        const int group = step == 2 ? t >> 1 : 0, half = step == 2 ? 0 : t >> 1, into = step == 2 ? t & 1 : t;
        const int count = step == 2 ? rows[t & 1] : rows[t];
        if (!count) continue;
        const uint8_t* rec = r0 + (t & 1) * block_records + (c + group) * INT4_RECORD;
        const float* sums = group_sums + (row0 + half * 16) * chunks + c + group;
        for (int r = 0; r < count; ++r)
          _mm512_store_ps(acc[into][r], add_group(_mm512_load_ps(acc[into][r]), rec, part[t][r], sums[r * chunks]));
      }
      c += step;
    }
    for (int t = 0; t < 4; ++t) {
      const int64_t col = col0 + (t & 1) * 16, cols = std::min<int64_t>(16, n - col);
      if (rows[t] == 0 || cols <= 0) continue;
      store_rows(acc[t], rows[t], nullptr, O + (row0 + (t >> 1) * 16) * n + col, n, cols);
    }
  }
}

// int4, one row (a request's decode step): the same products and sums as `multiply_int4`, with a DIAG-th of its
// tile round trips. The row's input is spread so that group c sits alone in row c % DIAG of chunk c's activation
// tile (`spread`: group c at 64-byte block DIAG c, zeros between, so the tile's other rows, DIAG - 1 blocks
// either side at most, read zeros).
// DIAG chunks then add into one tile, each group's products in its own row, and the tile leaves once. Products
// with zeros add +0, which leaves a group's sum as a fresh tile product gives it, so the row gets exactly the
// bits `multiply_int4` gives it inside any batch (tests/test_quant.py checks it).
void multiply_int4_row(const uint16_t* spread, int64_t chunks, const uint8_t* r0, int64_t block_records, bool second,
                       const float* sums, int64_t col0, int64_t n, uint16_t* O, Tiles& tiles, uint16_t* buffer) {
  alignas(64) float part[2][16][16], acc[2][1][16] = {};
  tiles.configure(DIAG, DIAG);
  // The codes are widened AHEAD chunks before their tiles load them (a ring of buffers), so the vector stores
  // have reached the cache when the tile loads read them.
  auto widen_chunk = [&](int64_t c) {
    const uint8_t* record = r0 + c * INT4_RECORD;
    prefetch_records(record, block_records, second);
    uint16_t* into = buffer + (c % RING) * 1024;
    widen_int4(record + 64, into);
    if (second) widen_int4(record + block_records + 64, into + 512);
  };
  for (int64_t c = 0; c < std::min<int64_t>(AHEAD, chunks); ++c) widen_chunk(c);
  for (int64_t c0 = 0; c0 < chunks; c0 += DIAG) {
    const int window = static_cast<int>(std::min<int64_t>(DIAG, chunks - c0));
    _tile_zero(0); _tile_zero(1);
    for (int i = 0; i < window; ++i) {
      const int64_t c = c0 + i;
      if (c + AHEAD < chunks) widen_chunk(c + AHEAD);
      const uint16_t* w = buffer + (c % RING) * 1024;
      _tile_loadd(4, spread + (DIAG * c - i) * 32, 64);  // row i: the group; rows j != i: zeros
      _tile_loadd(6, w, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (second) { _tile_loadd(7, w + 512, 64); _tile_dpbf16ps(1, 4, 7); }
    }
    _tile_stored(0, part[0], 64);
    if (second) _tile_stored(1, part[1], 64);
    for (int block = 0; block < (second ? 2 : 1); ++block) {
      __m512 v = _mm512_load_ps(acc[block][0]);
      for (int i = 0; i < window; ++i)  // the groups in order, as multiply_int4 adds them
        v = add_group(v, r0 + block * block_records + (c0 + i) * INT4_RECORD, part[block][i], sums[c0 + i]);
      _mm512_store_ps(acc[block][0], v);
    }
  }
  for (int block = 0; block < (second ? 2 : 1); ++block) {
    const int64_t col = col0 + block * 16, cols = std::min<int64_t>(16, n - col);
    if (cols > 0) store_rows(acc[block], 1, nullptr, O + col, n, cols);
  }
}

#endif

// GGUF Q4_1 groups (codes [n, k] in 0..15; fp16 d and m [n, k / 32]: weight = d * q + m) -> one record of
// INT4_RECORD bytes per block of 16 outputs and chunk of 32 inputs (one group): the 16 outputs' d, their m, then
// the codes of the chunk's 16 tile rows (row j: inputs 2j and 2j + 1, word 2o + p = input 2j + p of output o),
// stored for `widen_int4`: byte 16 L + 8 h + r of each 64 holds word 8 L + r of row 4g + h in its low nibble and
// of row 4g + 2 + h in its high one. Zero padded to 16 outputs. 0.625 bytes a weight, as in the GGUF.
at::Tensor pack_int4(const at::Tensor& codes, const at::Tensor& d, const at::Tensor& mins) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte, "codes must be 2-D uint8");
  TORCH_CHECK(codes.numel() == 0 || codes.max().item<int>() <= 15, "int4 codes must lie in 0..15");
  TORCH_CHECK(d.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf, "d and m must be float16");
  const int64_t n = codes.size(0), k = codes.size(1), np = round_up(n, 16), chunks = k / 32;
  TORCH_CHECK(k % 32 == 0 && d.sizes() == mins.sizes() && d.size(0) == n && d.size(1) == chunks,
              "int4 takes groups of 32 inputs: codes [n, k], d and m [n, k / 32]");
  auto padded = at::zeros({np, k}, codes.options());
  padded.narrow(0, 0, n).copy_(codes);
  // [block, output, chunk, row j, pair p] -> rows [block, chunk, j, word 2o + p] -> [.., g, s, L, r] (j = 4g + s)
  auto rows = padded.view({np / 16, 16, chunks, 16, 2}).permute({0, 2, 3, 1, 4}).reshape({np / 16, chunks, 4, 4, 4, 8});
  auto bytes = at::bitwise_or(rows.narrow(3, 0, 2), rows.narrow(3, 2, 2).mul(16))  // [.., g, h, L, r]
                   .permute({0, 1, 2, 4, 3, 5}).reshape({np / 16, chunks, 256});
  auto scales = [&](const at::Tensor& t) {
    auto p = at::zeros({np, chunks}, t.options());
    p.narrow(0, 0, n).copy_(t);
    return p.view({np / 16, 16, chunks}).permute({0, 2, 1}).contiguous().view(at::kByte).view({np / 16, chunks, 32});
  };
  return at::cat({scales(d), scales(mins), bytes}, 2).contiguous();
}

}  // namespace
