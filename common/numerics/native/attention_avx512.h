// attention.cpp's task (one query token x one KV head) on AVX-512, for a head dimension that is a multiple of 16.
// Included by attention.cpp inside its namespace, after exp_nonpositive, widen_all and prefetch_row, which it uses
// (attention_core.h).
#pragma once

#if defined(__AVX512F__)  // attention.cpp includes <immintrin.h>

// The same task on AVX-512 for a head dimension that is a multiple of 16, sixteen keys at a time, every sum in
// the order attend_portable (attention_core.h) takes it: each key's 16-lane dot accumulators go through one shuffle network that makes
// exactly `dot`'s pairwise adds ((l, l+8), then (l, l+4), (l, l+2), (l, l+1)) for 16 keys at once, instead of
// sixteen horizontal reductions; o stays in registers across a group of keys.
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

template <typename scalar_t, int NV>
void attend_one_avx512(const scalar_t* q, int group, const scalar_t* k_base, const scalar_t* v_base,
                       const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int64_t keys, float scale,
                       std::vector<float>& scratch, scalar_t* out) {
  constexpr int d = 16 * NV;  // the head dimension, 16 lanes at a time
  const int64_t padded = (keys + 15) / 16 * 16;
  scratch.resize(static_cast<size_t>(group) * (2 * d + padded) + 16 * d);
  float* __restrict qf = scratch.data();
  float* __restrict scores = qf + group * d;
  float* __restrict o = scores + group * padded;
  float* __restrict block = o + group * d;  // 16 keys (or values) widened, [16][d]
  widen_all(q, qf, group * d);
  const int64_t chunk_stride = chunk_len * d;
  auto widen_group = [&](const scalar_t* base, int64_t first, int64_t n) {
    // Ask for the rows PREFETCH_KEYS keys ahead now: in an engine step the keys and values are cold (a step's
    // weights streamed through the caches since this layer last ran), and without it two thirds of the kernel's
    // profile samples sat on the loads below.
    if (first + PREFETCH_KEYS < keys) {
      const int64_t ahead = first + PREFETCH_KEYS, count = std::min<int64_t>(16, keys - ahead);
      int64_t chunk = ahead / chunk_len, within = ahead % chunk_len;  // one division per 16 keys, not per key
      for (int64_t j = 0; j < count; ++j) {
        prefetch_row(base + (chunks[chunk] + head_offset) * chunk_stride + within * d, d);
        if (++within == chunk_len) within = 0, ++chunk;
      }
    }
    int64_t chunk = first / chunk_len, within = first % chunk_len;
    for (int64_t j = 0; j < 16; ++j) {
      float* row = block + j * d;
      if (j < n) {
        const scalar_t* src = base + (chunks[chunk] + head_offset) * chunk_stride + within * d;
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(row + 16 * v, load16(src + 16 * v));
        if (++within == chunk_len) within = 0, ++chunk;
      } else {
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(row + 16 * v, _mm512_setzero_ps());
      }
    }
  };
  for (int64_t first = 0; first < keys; first += 16) {
    widen_group(k_base, first, std::min<int64_t>(16, keys - first));
    for (int g = 0; g < group; ++g) {
      __m512 qv[NV], acc[16];
      for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(qf + g * d + 16 * v);
      for (int j = 0; j < 16; ++j) {
        __m512 a = _mm512_setzero_ps();
        for (int v = 0; v < NV; ++v)
          a = _mm512_add_ps(a, _mm512_mul_ps(qv[v], _mm512_loadu_ps(block + j * d + 16 * v)));
        acc[j] = a;
      }
      _mm512_storeu_ps(scores + g * padded + first, reduce16(acc));
    }
  }
  float l[64] = {0};  // group <= 64
  for (int g = 0; g < group; ++g) {
    float* __restrict sg = scores + g * padded;
    __m512 mv = _mm512_set1_ps(sg[0]);  // a maximum is exact in any order
    int64_t j = 0;
    for (; j + 16 <= keys; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sg + j));
    float m = _mm512_reduce_max_ps(mv);
    for (; j < keys; ++j) m = sg[j] > m ? sg[j] : m;
    for (j = 0; j < keys; ++j) sg[j] = exp_nonpositive((sg[j] - m) * scale);
  }
  std::fill(o, o + group * d, 0.0f);
  for (int64_t first = 0; first < keys; first += 16) {
    const int64_t n = std::min<int64_t>(16, keys - first);
    widen_group(v_base, first, n);
    for (int g = 0; g < group; ++g) {
      __m512 ov[NV];
      for (int v = 0; v < NV; ++v) ov[v] = _mm512_loadu_ps(o + g * d + 16 * v);
      const float* w = scores + g * padded + first;
      float lg = l[g];  // l, each head's sum in key order, here where the weights are read anyway
      for (int64_t j = 0; j < n; ++j) {
        lg += w[j];
        const __m512 wj = _mm512_set1_ps(w[j]);
        for (int v = 0; v < NV; ++v)
          ov[v] = _mm512_add_ps(ov[v], _mm512_mul_ps(wj, _mm512_loadu_ps(block + j * d + 16 * v)));
      }
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(o + g * d + 16 * v, ov[v]);
      l[g] = lg;
    }
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
