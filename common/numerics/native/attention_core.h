// The attention task of attention.cpp, torch-free: raw pointers in, raw pointers out, so that the standalone test
// (native/test/attention_test.cpp) builds it for any CPU, an ARM one under qemu included.
//
// One task = one query token x one KV head (the `group` query heads that share it), every reduction in one order
// fixed by the source, never by the vector width:
//   score_j = q . k_j   16 lanes over the head dimension, lane l accumulating products l, l+16, l+32 ... in order
//                       from 0.0f, each by one fused multiply-add (acc = fma(q_i, k_i, acc)); then the lanes
//                       pairwise, halving: (l, l+8), (l, l+4), (l, l+2), (l, l+1); then, where the head dimension
//                       is not a multiple of 16, the last products one by one, fused the same way (dot below)
//   m       = max_j score_j                  exact in any order
//   w_j     = exp_nonpositive((score_j - m) * scale)
//   l       = sum_j w_j                      in key order
//   o       = sum_j w_j * v_j                in key order, each element of the head dimension apart, from 0.0f:
//                                            o_i = fma(w_j, v_ji, o_i)
//   out     = o / l, rounded once to the output dtype
// Every other step is one float32 operation rounded alone (built with -ffp-contract=off: the compiler fuses
// nothing; the fused multiply-adds above are written out, std::fma, one rounding, so the same on every ISA), so
// attend_portable (the reference) and attend_block (16 keys at a time through attention_lanes.h's AVX2, NEON or
// plain versions) give the same bits on every ISA; only how many lanes one instruction holds changes.
//
// The element type comes with a Cvt: Cvt::widen(x) -> float (exact) and Cvt::narrow(float) -> scalar_t (nearest
// even). attention.cpp passes bf16.h's conversions; the standalone test its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_lanes.h"  // dot, exp_nonpositive and their vector versions

namespace stepwise {
namespace attn {

// Keys ahead of the one being read whose rows are requested from memory early. Prefetching changes no result.
constexpr int64_t PREFETCH_KEYS = 16;
// AVX-512's task asks for the rows of the group of 16 keys (or values) PREFETCH_GROUPS groups ahead, one row per
// key it reads, into L2: on Zen 4, 32 prefetches into L1 at once stalled the core until their lines came (few L1
// miss buffers), so the reads did not overlap the arithmetic (a layer of 8k keys, docs/scale.md).
constexpr int64_t PREFETCH_GROUPS = 3;

template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t d) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 3);
}

template <typename scalar_t>
inline void prefetch_row_l2(const scalar_t* row, int64_t d) {  // prefetcht1: into L2, not L1
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 2);
}

template <typename Cvt, typename scalar_t>
inline void widen_all(const scalar_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Cvt::widen(src[i]);
}

// The rows of keys first ... first + 15 (those before `keys`) of one head: rows[j]; returns how many.
template <typename scalar_t>
inline int rows_of(const scalar_t* base, const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int d,
                   int64_t first, int64_t keys, const scalar_t** rows) {
  const int n = static_cast<int>(std::min<int64_t>(16, keys - first));
  int64_t chunk = first / chunk_len, within = first % chunk_len;  // one division per 16 keys, not per key
  for (int j = 0; j < n; ++j) {
    rows[j] = base + ((chunks[chunk] + head_offset) * chunk_len + within) * d;
    if (++within == chunk_len) within = 0, ++chunk;
  }
  return n;
}

// Group i of a task's stream of 2 * groups groups of 16 rows (its keys' groups, then its values'), as rows_of.
template <typename scalar_t>
inline int stream_rows(const scalar_t* k_base, const scalar_t* v_base, const int64_t* chunks, int64_t head_offset,
                       int64_t chunk_len, int d, int64_t keys, int64_t i, const scalar_t** rows) {
  const int64_t groups = (keys + 15) / 16;
  if (i >= 2 * groups) return 0;
  return i < groups ? rows_of(k_base, chunks, head_offset, chunk_len, d, 16 * i, keys, rows)
                    : rows_of(v_base, chunks, head_offset, chunk_len, d, 16 * (i - groups), keys, rows);
}

// The reference: one key at a time, in the order above. `chunks` is the token's row of the chunk table (chunk c
// holds positions c * chunk_len ... of KV head 0; this head's rows lie head_offset chunks further).
template <typename Cvt, typename scalar_t>
void attend_portable(const scalar_t* q, int group, int d, const scalar_t* k_base, const scalar_t* v_base,
                     const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int64_t keys, float scale,
                     std::vector<float>& scratch, scalar_t* out) {
  // scratch: the group's q rows [group * d], its scores [group * keys], o [group * d], one chunk [chunk_len * d]
  scratch.resize(static_cast<size_t>(group) * (2 * d + keys) + chunk_len * d);
  float* __restrict qf = scratch.data();
  float* __restrict scores = qf + group * d;
  float* __restrict o = scores + group * keys;
  float* __restrict block = o + group * d;
  widen_all<Cvt>(q, qf, group * d);
  const int64_t chunk_stride = chunk_len * d;
  for (int64_t first = 0; first < keys; first += chunk_len) {  // one chunk of contiguous keys at a time
    const int64_t n = std::min(chunk_len, keys - first);
    widen_all<Cvt>(k_base + (chunks[first / chunk_len] + head_offset) * chunk_stride, block, n * d);
    for (int64_t j = 0; j < n; ++j)
      for (int g = 0; g < group; ++g) scores[g * keys + first + j] = dot(qf + g * d, block + j * d, d);
  }
  for (int g = 0; g < group; ++g) {
    float* __restrict sg = scores + g * keys;
    float m = sg[0];
    for (int64_t j = 1; j < keys; ++j) m = sg[j] > m ? sg[j] : m;
    for (int64_t j = 0; j < keys; ++j) sg[j] = exp_nonpositive((sg[j] - m) * scale);
  }
  std::fill(o, o + group * d, 0.0f);
  for (int64_t first = 0; first < keys; first += chunk_len) {
    const int64_t n = std::min(chunk_len, keys - first);
    widen_all<Cvt>(v_base + (chunks[first / chunk_len] + head_offset) * chunk_stride, block, n * d);
    for (int64_t j = 0; j < n; ++j)
      for (int g = 0; g < group; ++g) {
        const float w = scores[g * keys + first + j];
        for (int i = 0; i < d; ++i) o[g * d + i] = std::fma(w, block[j * d + i], o[g * d + i]);
      }
  }
  for (int g = 0; g < group; ++g) {
    float l = 0.0f;
    for (int64_t j = 0; j < keys; ++j) l += scores[g * keys + j];
    for (int i = 0; i < d; ++i) out[g * d + i] = Cvt::narrow(o[g * d + i] / l);
  }
}

// The same task 16 keys at a time, for a head dimension d = 16 * NV: the keys' (then values') rows widened into a
// block of 16, the scores by key_sums, the weights by exp_scores, o by weigh_values (attention_lanes.h). Same sums,
// same order as attend_portable.
template <typename Cvt, int NV, typename scalar_t>
void attend_block(const scalar_t* q, int group, const scalar_t* k_base, const scalar_t* v_base, const int64_t* chunks,
                  int64_t head_offset, int64_t chunk_len, int64_t keys, float scale, std::vector<float>& scratch,
                  scalar_t* out) {
  constexpr int d = 16 * NV;
  const int64_t padded = (keys + 15) / 16 * 16;
  scratch.resize(static_cast<size_t>(group) * (2 * d + padded + 1) + 16 * d);
  float* __restrict qf = scratch.data();
  float* __restrict scores = qf + group * d;
  float* __restrict o = scores + group * padded;
  float* __restrict l = o + group * d;
  float* __restrict block = l + group;  // 16 keys (or values) widened, [16][d]
  widen_all<Cvt>(q, qf, group * d);
  // The keys' then the values' groups of 16 are one stream, its group i + PREFETCH_GROUPS asked for (into L2, a
  // row per row widened) while group i is widened, as attend_one_avx512 does (attention_avx512.h says why).
  const int64_t groups = padded / 16;
  const scalar_t *rows[16], *ahead[16];
  auto widen_group = [&](const scalar_t* base, int64_t i, int64_t stream) {
    const int n_ahead = stream_rows(k_base, v_base, chunks, head_offset, chunk_len, d, keys, stream, ahead);
    const int n = rows_of(base, chunks, head_offset, chunk_len, d, 16 * i, keys, rows);
    for (int j = 0; j < 16; ++j) {
      if (j < n_ahead) prefetch_row_l2(ahead[j], d);
      if (j < n) widen_all<Cvt>(rows[j], block + j * d, d);
      else std::fill(block + j * d, block + (j + 1) * d, 0.0f);
    }
    return n;
  };
  for (int64_t i = 0; i < PREFETCH_GROUPS; ++i) {
    const int n = stream_rows(k_base, v_base, chunks, head_offset, chunk_len, d, keys, i, ahead);
    for (int j = 0; j < n; ++j) prefetch_row_l2(ahead[j], d);
  }
  for (int64_t i = 0; i < groups; ++i) {
    widen_group(k_base, i, i + PREFETCH_GROUPS);
    for (int g = 0; g < group; ++g) key_sums<NV>(qf + g * d, block, scores + g * padded + 16 * i);
  }
  for (int g = 0; g < group; ++g) {
    float* __restrict sg = scores + g * padded;
    exp_scores(sg, keys, max_of(sg, keys), scale);
    l[g] = 0.0f;
  }
  for (int64_t j = 0; j < keys; ++j)  // each head's sum in key order; the heads' chains interleave
    for (int g = 0; g < group; ++g) l[g] += scores[g * padded + j];
  std::fill(o, o + group * d, 0.0f);
  for (int64_t i = 0; i < groups; ++i) {
    const int n = widen_group(v_base, i, groups + i + PREFETCH_GROUPS);
    for (int g = 0; g < group; ++g) weigh_values<NV>(o + g * d, scores + g * padded + 16 * i, block, n);
  }
  for (int g = 0; g < group; ++g)
    for (int i = 0; i < d; ++i) out[g * d + i] = Cvt::narrow(o[g * d + i] / l[g]);
}

// attend_block with d / 16 as a constant (1 ... 8: head dimensions 16 ... 128), so its loops unroll.
template <typename Cvt, typename scalar_t, int NV = 1>
void attend_blocks(int nv, const scalar_t* q, int group, const scalar_t* k_base, const scalar_t* v_base,
                   const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int64_t keys, float scale,
                   std::vector<float>& scratch, scalar_t* out) {
  if constexpr (NV < 8) {
    if (nv != NV)
      return attend_blocks<Cvt, scalar_t, NV + 1>(nv, q, group, k_base, v_base, chunks, head_offset, chunk_len, keys,
                                                  scale, scratch, out);
  }
  attend_block<Cvt, NV>(q, group, k_base, v_base, chunks, head_offset, chunk_len, keys, scale, scratch, out);
}

// One task, the fastest version this build has: 16 keys at a time where d is 16 ... 128 in steps of 16, else
// one key at a time. Both give the same bits.
template <typename Cvt, typename scalar_t>
void attend(const scalar_t* q, int group, int d, const scalar_t* k_base, const scalar_t* v_base, const int64_t* chunks,
            int64_t head_offset, int64_t chunk_len, int64_t keys, float scale, std::vector<float>& scratch,
            scalar_t* out) {
  if (d % 16 == 0 && d <= 128)
    return attend_blocks<Cvt>(d / 16, q, group, k_base, v_base, chunks, head_offset, chunk_len, keys, scale, scratch,
                              out);
  attend_portable<Cvt>(q, group, d, k_base, v_base, chunks, head_offset, chunk_len, keys, scale, scratch, out);
}

}  // namespace attn
}  // namespace stepwise
