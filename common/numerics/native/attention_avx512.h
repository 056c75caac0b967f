// attention.cpp's task (one query token x one KV head) on AVX-512, for a head dimension that is a multiple of 16.
// Included by attention.cpp inside its namespace, after widen_all and prefetch_row_l2, which it uses
// (attention_core.h).
#pragma once

#if defined(__AVX512F__)  // attention.cpp includes <immintrin.h>

// The same task on AVX-512 for a head dimension that is a multiple of 16, sixteen keys at a time, every sum in
// the order attend_portable (attention_core.h) takes it: each key's 16-lane dot accumulators go through one shuffle
// network that makes exactly `dot`'s pairwise adds ((l, l+8), then (l, l+4), (l, l+2), (l, l+1)) for 16 keys at
// once, instead of sixteen horizontal reductions. Each key's and value's row is read and widened once, in
// registers, for up to 4 query heads of the group at a time (their q, or their o, held in registers across the
// keys), and the weights are taken in the value pass, 16 at a time, where they are used.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// a[j]: key j's 16 lane sums -> the 16 keys' dot products, in key order.
inline __m512 reduce16(const __m512* a) {
  __m512 b[8], c[4], e[2];
  for (int m = 0; m < 8; ++m)  // lanes l + (l + 8): [key 2m's 8 sums, key 2m+1's]
    b[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int m = 0; m < 4; ++m)  // + 4: quarter t holds key 4m + t's 4 sums
    c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int m = 0; m < 2; ++m) {  // + 2: quarter t holds keys 8m + t (2 sums) and 8m + 4 + t
    const __m512d x = _mm512_castps_pd(c[2 * m]), y = _mm512_castps_pd(c[2 * m + 1]);
    e[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // + 1: lane 4t + u holds key 4u + t; then into key order
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, s);
}

inline __m512 exp16(__m512 x) {  // exp_nonpositive, 16 at a time: the same operations in the same order
  const auto c = [](float v) { return _mm512_set1_ps(v); };
  x = _mm512_max_ps(c(expc::LOWEST), x);  // as x < -87 ? -87 : x (a NaN stays x)
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, c(expc::LOG2E)), c(expc::ROUND)),
                                 c(expc::ROUND));
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, c(expc::LN2_HI)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, c(expc::LN2_LO)));
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = c(expc::POLY[0]);
  for (int i = 1; i < 6; ++i)
    p = _mm512_add_ps(_mm512_mul_ps(p, r), c(expc::POLY[i]));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, z), r), c(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// The scores of G query heads (q rows qf, d apart) against 16 keys (rows[j], the n < 16 past the last zero), each
// head's 16 scores to scores + g * padded.
template <typename scalar_t, int NV, int G>
inline void key_scores(const float* qf, const scalar_t* const* rows, int n, float* scores, int64_t padded,
                       const scalar_t* const* ahead, int n_ahead) {
  constexpr int d = 16 * NV;
  __m512 qv[G][NV], acc[G][16];
  for (int g = 0; g < G; ++g)
    for (int v = 0; v < NV; ++v) qv[g][v] = _mm512_loadu_ps(qf + g * d + 16 * v);
  for (int j = 0; j < 16; ++j) {
    __m512 k[NV];
    if (j < n_ahead) prefetch_row_l2(ahead[j], d);
    for (int v = 0; v < NV; ++v) k[v] = j < n ? load16(rows[j] + 16 * v) : _mm512_setzero_ps();
    for (int g = 0; g < G; ++g) {
      __m512 a = _mm512_mul_ps(qv[g][0], k[0]);  // not fma(q, k, 0.0f): only a zero score's sign can differ
      for (int v = 1; v < NV; ++v) a = _mm512_fmadd_ps(qv[g][v], k[v], a);
      acc[g][j] = a;
    }
  }
  for (int g = 0; g < G; ++g) _mm512_storeu_ps(scores + g * padded, reduce16(acc[g]));
}

// G heads' o (d apart) += their weights times n value rows, in key order, and l[g] += the weights in key order;
// the weights exp_nonpositive((s - m[g]) * scale) of the 16 keys' scores s (g * padded apart).
template <typename scalar_t, int NV, int G>
inline void weigh_values(float* o, const float* s, int64_t padded, const float* m, float scale,
                         const scalar_t* const* rows, int n, float* l, const scalar_t* const* ahead, int n_ahead) {
  constexpr int d = 16 * NV;
  __m512 ov[G][NV];
  float lg[G], w[G * 16];
  for (int g = 0; g < G; ++g) {
    for (int v = 0; v < NV; ++v) ov[g][v] = _mm512_loadu_ps(o + g * d + 16 * v);
    lg[g] = l[g];
    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + g * padded), _mm512_set1_ps(m[g]));
    _mm512_storeu_ps(w + 16 * g, exp16(_mm512_mul_ps(x, _mm512_set1_ps(scale))));
  }
  for (int j = n; j < n_ahead; ++j) prefetch_row_l2(ahead[j], d);
  for (int j = 0; j < n; ++j) {
    if (j < n_ahead) prefetch_row_l2(ahead[j], d);
    __m512 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load16(rows[j] + 16 * v);
    for (int g = 0; g < G; ++g) {
      const float wj = w[16 * g + j];
      lg[g] += wj;
      const __m512 wv = _mm512_set1_ps(wj);
      for (int v = 0; v < NV; ++v) ov[g][v] = _mm512_fmadd_ps(wv, x[v], ov[g][v]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + g * d + 16 * v, ov[g][v]);
    l[g] = lg[g];
  }
}

// Heads at most 4 at a time (q or o of 4 heads for d = 64 fill half the 32 registers).
template <int NV>
constexpr int heads_at_once() { return NV <= 4 ? 4 : NV <= 5 ? 3 : 2; }

template <typename scalar_t, int NV, typename F>
inline void by_heads(int group, F&& f) {  // f(std::integral_constant<int, G>, first head) over the group
  constexpr int G = heads_at_once<NV>();
  int g = 0;
  for (; g + G <= group; g += G) f(std::integral_constant<int, G>{}, g);
  switch (group - g) {
    case 3: if constexpr (G > 3) f(std::integral_constant<int, 3>{}, g); break;
    case 2: if constexpr (G > 2) f(std::integral_constant<int, 2>{}, g); break;
    case 1: f(std::integral_constant<int, 1>{}, g); break;
    default: break;
  }
}

template <typename scalar_t, int NV>
void attend_one_avx512(const scalar_t* q, int group, const scalar_t* k_base, const scalar_t* v_base,
                       const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int64_t keys, float scale,
                       std::vector<float>& scratch, scalar_t* out) {
  constexpr int d = 16 * NV;  // the head dimension, 16 lanes at a time
  const int64_t padded = (keys + 15) / 16 * 16, groups = padded / 16;
  scratch.resize(static_cast<size_t>(group) * (2 * d + padded + 2));
  float* __restrict qf = scratch.data();
  float* __restrict scores = qf + group * d;
  float* __restrict o = scores + group * padded;
  float* __restrict l = o + group * d;
  float* __restrict m = l + group;  // each head's maximum score
  widen_all(q, qf, group * d);
  const scalar_t* rows[16];
  // The keys' then the values' groups of 16 are one stream of 2 * groups; while group i of it is used, group
  // i + PREFETCH_GROUPS is asked for: in an engine step the keys and values are cold (the step's weights streamed
  // through the caches since this layer last ran), and one head's 16 keys are one run of 16 * d elements, the
  // next run a block of all KV heads further on, where the hardware's own prefetcher does not follow.
  const scalar_t* ahead[16];
  auto prefetch = [&](int64_t i) {  // the rows of the stream's group i, to ahead
    return stream_rows(k_base, v_base, chunks, head_offset, chunk_len, d, keys, i, ahead);
  };
  for (int64_t i = 0; i < PREFETCH_GROUPS; ++i) {
    const int n_ahead = prefetch(i);
    for (int j = 0; j < n_ahead; ++j) prefetch_row_l2(ahead[j], d);
  }
  for (int64_t i = 0; i < groups; ++i) {
    const int n_ahead = prefetch(i + PREFETCH_GROUPS);
    const int n = rows_of(k_base, chunks, head_offset, chunk_len, d, 16 * i, keys, rows);
    by_heads<scalar_t, NV>(group, [&](auto G, int g) {
      key_scores<scalar_t, NV, G>(qf + g * d, rows, n, scores + g * padded + 16 * i, padded, ahead,
                                  g ? 0 : n_ahead);
    });
  }
  for (int g = 0; g < group; ++g) {  // the maximum, exact in any order
    float* __restrict sg = scores + g * padded;
    __m512 mv = _mm512_set1_ps(sg[0]);
    int64_t j = 0;
    for (; j + 16 <= keys; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sg + j));
    m[g] = _mm512_reduce_max_ps(mv);
    for (; j < keys; ++j) m[g] = sg[j] > m[g] ? sg[j] : m[g];
    l[g] = 0.0f;
  }
  std::fill(o, o + group * d, 0.0f);
  for (int64_t i = 0; i < groups; ++i) {
    const int n_ahead = prefetch(groups + i + PREFETCH_GROUPS);
    const int n = rows_of(v_base, chunks, head_offset, chunk_len, d, 16 * i, keys, rows);
    by_heads<scalar_t, NV>(group, [&](auto G, int g) {
      weigh_values<scalar_t, NV, G>(o + g * d, scores + g * padded + 16 * i, padded, m + g, scale, rows, n, l + g,
                                    ahead, g ? 0 : n_ahead);
    });
  }
  for (int g = 0; g < group; ++g)
    for (int i = 0; i < d; ++i) out[g * d + i] = round_to<scalar_t>(o[g * d + i] / l[g]);
}

// attend_one_avx512 with the head dimension's 16-lane count as a constant, so its loops unroll into registers.
template <typename scalar_t, int NV = 1>
void attend_avx512(int nv, const scalar_t* q, int group, const scalar_t* k_base, const scalar_t* v_base,
                   const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int64_t keys, float scale,
                   std::vector<float>& scratch, scalar_t* out) {
  if constexpr (NV < 8) {
    if (nv != NV)
      return attend_avx512<scalar_t, NV + 1>(nv, q, group, k_base, v_base, chunks, head_offset, chunk_len, keys,
                                             scale, scratch, out);
  }
  attend_one_avx512<scalar_t, NV>(q, group, k_base, v_base, chunks, head_offset, chunk_len, keys, scale, scratch,
                                  out);
}
#endif  // __AVX512F__
