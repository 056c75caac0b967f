// The portable linear's many-row path, part of linear_portable.h: calls of more rows than one pass holds
// (`max_rows`: a verify step's 6-8 rows, a prefill's hundreds), and int4 from 3 rows.
//
// One block at a time, its inputs in tiles (`tile_inputs`: 4-8 KB of the block's weights); each tile runs every
// pass over the rows back to back, so its weights come from memory once, in the first pass (which requests the
// lines ahead, as one row does), and from L1 in the others. Passes over whole groups of blocks, one after another,
// read each group again from L2 in every later pass. Each pass's chains go on where the tile before left them: kept
// in `chains`, stored and loaded exactly, so every output's sum is the same chain in the same order and a row's bits
// never depend on the rows beside it. int4 widens a tile's codes once (to float32, exactly: `widen_tile`, in L1)
// for all its passes. Measured: docs/native-kernels.md ("verify rows").
#pragma once

namespace stepwise_portable {

// Inputs a tile: 256 (8 KB of bfloat16 weights, 4 KB of int8, 8 int4 groups), float32 64 (4 KB). At 8 rows of
// SmolLM2's layer (AVX2 build, one thread), 256 against 64 gave bfloat16 1.13x, int8 1.12x, int4 1.06x; float32
// 0.87x (16 KB a tile then shared L1 with 8 KB of the rows' inputs).
constexpr int64_t TILE = 256;
constexpr int64_t tile_inputs(Kind kind) { return kind == Kind::f32 ? 64 : TILE; }

// Inputs [i0, i1) of an int4 block's codes as float32 [i1 - i0][16] (the float32 layout), exactly.
template <int T>
inline void widen_code(const Codes& codes, float* wide) { store(wide + T * BLOCK, code<T>(codes)); }
inline void widen_tile(const Problem& p, int64_t block, int64_t i0, int64_t i1, float* wide) {
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + block * block_bytes(p.kind, p.kp);
  for (int64_t g = i0 / GROUP; g < i1 / GROUP; ++g)  // the records are requested ahead by `dot_int4`'s first pass
    for (int run = 0; run < 4; ++run)
      for (int h = 0; h < 2; ++h) {
        const Codes codes = load_codes(w + g * INT4_RECORD + 64 + 32 * (2 * run + h));
        float* into = wide + (g * GROUP - i0 + 8 * run) * BLOCK + 8 * h;
        widen_code<0>(codes, into), widen_code<1>(codes, into), widen_code<2>(codes, into);
        widen_code<3>(codes, into), widen_code<4>(codes, into), widen_code<5>(codes, into);
        widen_code<6>(codes, into), widen_code<7>(codes, into);
      }
}

// One pass of R rows from row0 over inputs [i0, i1) of one block, its chains in chains[R][16] (`wide`: int4's tile,
// widened).
template <int R>
void tile_pass(const Problem& p, int64_t row0, int64_t block, int64_t i0, int64_t i1, const float* wide, bool ahead,
               float* chains) {
  float (&acc)[R][1][16] = *reinterpret_cast<float (*)[R][1][16]>(chains);
  const float* X = p.x + row0 * p.ldx;
  const char* start = static_cast<const char*>(p.w) + block * block_bytes(p.kind, p.kp);
  const int64_t groups = p.kp / GROUP;
  if (p.kind == Kind::int4) {
    const char* blocks[1] = {start};
    dot_int4<R, 1, true>(X, p.ldx, groups, p.sums + row0 * groups, blocks, ahead, acc, wide, i0 / GROUP, i1 / GROUP);
    return;
  }
  if (p.kind == Kind::w4a8) {
    const char* blocks[1] = {start};
    dot_w4a8<R, 1>(p.qa + row0 * p.kp, p.kp, p.qs + 2 * row0 * groups, blocks, ahead, acc, i0 / GROUP, i1 / GROUP);
    return;
  }
  V8 v[R][1][2];
  for (int r = 0; r < R; ++r) v[r][0][0] = load(acc[r][0]), v[r][0][1] = load(acc[r][0] + 8);
  const char* blocks[1] = {start + i0 * (block_bytes(p.kind, p.kp) / p.kp)};  // input i0's line
  if (p.kind == Kind::bf16) dot<Kind::bf16, R, 1>(X, p.ldx, p.kp, i0, i1, blocks, ahead, v);
  else if (p.kind == Kind::f32) dot<Kind::f32, R, 1>(X, p.ldx, p.kp, i0, i1, blocks, ahead, v);
  else dot<Kind::int8, R, 1>(X, p.ldx, p.kp, i0, i1, blocks, ahead, v);
  for (int r = 0; r < R; ++r) store(acc[r][0], v[r][0][0]), store(acc[r][0] + 8, v[r][0][1]);
}

// Blocks [b0, b1) of the outputs, every row, tile by tile.
inline void linear_blocks_tiled(const Problem& p, int64_t b0, int64_t b1) {
  const bool widen = p.kind == Kind::int4;
  thread_local std::vector<float> chains;  // this thread's [m][16] chains
  chains.resize(p.m * BLOCK);
  // int4's widened tile, this thread's: 64-byte aligned (in a vector, at malloc's 16 bytes, its 32-byte loads and
  // stores split lines) and an object of its own, which the compiler knows `chains` cannot alias (a second vector,
  // even aligned, cost 5 rows of int4 1.2x: every store to a chain made it reload the tile)
  alignas(64) thread_local float wide_tile[TILE * BLOCK];
  float* const wide = wide_tile;
  const int64_t tile = tile_inputs(p.kind);
  for (int64_t block = b0; block < b1; ++block) {
    for (int64_t i0 = 0; i0 < p.kp; i0 += tile) {
      const int64_t i1 = std::min(p.kp, i0 + tile);
      if (widen) widen_tile(p, block, i0, i1, wide);
      row_passes(p.m, max_rows(p.kind, widen), [&](int64_t row0, int64_t rows) {
        const bool ahead = row0 == 0;  // the first pass requests the weights ahead; the others find them in L1
        float* acc = chains.data() + row0 * BLOCK;
        const float* w = widen ? wide : nullptr;
        switch (rows) {
          case 6: tile_pass<6>(p, row0, block, i0, i1, w, ahead, acc); break;
          case 5: tile_pass<5>(p, row0, block, i0, i1, w, ahead, acc); break;
          case 4: tile_pass<4>(p, row0, block, i0, i1, w, ahead, acc); break;
          case 3: tile_pass<3>(p, row0, block, i0, i1, w, ahead, acc); break;
          case 2: tile_pass<2>(p, row0, block, i0, i1, w, ahead, acc); break;
          default: tile_pass<1>(p, row0, block, i0, i1, w, ahead, acc); break;
        }
      });
    }
    for (int64_t r = 0; r < p.m; ++r)
      store_rows<1, 1>(p, r, block * BLOCK, *reinterpret_cast<float (*)[1][1][16]>(chains.data() + r * BLOCK));
  }
}

// From this many rows an int4 call widens its codes once per tile and runs float32 chains over them; below it, the
// codes are decoded in registers (with the shift-free scaling of `scale_inputs`). On the 2-core EPYC (Zen 1), 3 and
// 4 rows of int4 took 1.4x and 2.2x less time widened than decoded per row block (whose 3 and 4 rows ran slower
// than 2), 2 rows 1.2x more.
constexpr int64_t INT4_WIDE_ROWS = 3;

}  // namespace stepwise_portable
