// The arithmetic of attention_core.h's task, written once in plain C++ (the definition) and again for the vector
// units that make it fast (AVX2 + FMA, ARM NEON), each vector version making exactly the plain version's roundings
// in the plain version's order. Torch-free. Built with -ffp-contract=off: the only fused multiply-adds are the
// ones written out (std::fma, one rounding: the same bits on every ISA that has them, and in software where not).
//
//   dot          q . k: lane l (of 16) accumulates products l, l+16, l+32 ... in order from 0.0f, each by one
//                fused multiply-add (acc = fma(q_i, k_i, acc)); the lanes pairwise, halving: (l, l+8), (l, l+4),
//                (l, l+2), (l, l+1); then any products past the last 16 one by one, fused the same way
//   key_sums     dot for 16 keys at once (d = 16 * NV): each key's 16 lane sums kept in registers (2 x 8 lanes on
//                AVX2, 4 x 4 on NEON), the pairwise adds for several keys together through shuffles
//   exp_scores   s_j = exp_nonpositive((s_j - m) * scale), each its own chain of float operations (nothing fused)
//   weigh_values o_i = fma(w_j, v_ji, o_i) for the keys in order, each element of the head dimension apart
//   max_of       exact in any order
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace stepwise {
namespace attn {

constexpr int LANES = 16;

// exp(x) for x <= 0 (Cephes' expf: Cody-Waite reduction by ln 2, degree-6 polynomial; ~1 ulp). Below -87 the
// result is clamped near 0. Its constants, named once for the scalar, AVX2, NEON and AVX-512 versions, which take
// the same operations in the same order:
namespace expc {
constexpr float LOWEST = -87.0f, ROUND = 12582912.0f;  // ROUND = 1.5 * 2^23: adding and subtracting it rounds
constexpr float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                           5.0000001201e-1f};  // p = POLY[0], then p = p * r + POLY[i]
}  // namespace expc

inline float exp_nonpositive(float x) {
  using namespace expc;
  x = x < LOWEST ? LOWEST : x;
  const float n = (x * LOG2E + ROUND) - ROUND;
  float r = x - n * LN2_HI;
  r = r - n * LN2_LO;
  const float z = r * r;
  float p = POLY[0];
  for (int i = 1; i < 6; ++i) p = p * r + POLY[i];
  p = p * z + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// 16 lane sums -> one: (l, l+8), (l, l+4), (l, l+2), (l, l+1). Overwrites acc.
inline float reduce_lanes(float* acc) {
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  for (int l = 0; l < 2; ++l) acc[l] += acc[l + 2];
  return acc[0] + acc[1];
}

// q . k in the order above: the definition every vector version repeats.
inline float dot(const float* a, const float* b, int d) {
  float acc[LANES] = {0};
  int i = 0;
  for (; i + LANES <= d; i += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  float s = reduce_lanes(acc);
  for (; i < d; ++i) s = std::fma(a[i], b[i], s);  // a head dimension that is not a multiple of 16: the rest in order
  return s;
}

// The plain versions: the definitions, and what runs where there is no vector version.
template <int NV>
inline void key_sums_portable(const float* q, const float* block, float* out) {
  for (int j = 0; j < 16; ++j) out[j] = dot(q, block + j * 16 * NV, 16 * NV);
}

inline void exp_scores_portable(float* s, int64_t n, float m, float scale) {
  for (int64_t j = 0; j < n; ++j) s[j] = exp_nonpositive((s[j] - m) * scale);
}

template <int NV>
inline void weigh_values_portable(float* o, const float* w, const float* block, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    for (int i = 0; i < 16 * NV; ++i) o[i] = std::fma(w[j], block[j * 16 * NV + i], o[i]);
}

inline float max_of_portable(const float* s, int64_t n) {
  float m = s[0];
  for (int64_t j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
  return m;
}

#if defined(__AVX2__) && defined(__FMA__)
template <int NV>
inline void key_sums(const float* q, const float* block, float* out) {
  for (int half = 0; half < 2; ++half) {  // keys 8 * half ... 8 * half + 7
    __m256 b[8];
    for (int j = 0; j < 8; ++j) {
      const float* k = block + (8 * half + j) * 16 * NV;
      __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();  // lanes 0-7 and 8-15
      for (int v = 0; v < NV; ++v) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * v), _mm256_loadu_ps(k + 16 * v), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * v + 8), _mm256_loadu_ps(k + 16 * v + 8), hi);
      }
      b[j] = _mm256_add_ps(lo, hi);  // (l, l+8)
    }
    __m256 c[4], e[2];
    for (int m = 0; m < 4; ++m)  // (l, l+4): half t of c[m] holds key 2m + t's 4 sums
      c[m] = _mm256_add_ps(_mm256_permute2f128_ps(b[2 * m], b[2 * m + 1], 0x20),
                           _mm256_permute2f128_ps(b[2 * m], b[2 * m + 1], 0x31));
    for (int m = 0; m < 2; ++m) {  // (l, l+2): half t holds keys 4m + t and 4m + 2 + t, 2 sums each
      const __m256d x = _mm256_castps_pd(c[2 * m]), y = _mm256_castps_pd(c[2 * m + 1]);
      e[m] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    // (l, l+1): keys 0 2 4 6 | 1 3 5 7, then into key order
    const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm256_storeu_ps(out + 8 * half, _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

inline __m256 exp8(__m256 x) {  // exp_nonpositive, 8 at a time: the same operations in the same order
  const auto c = [](float v) { return _mm256_set1_ps(v); };
  x = _mm256_max_ps(c(expc::LOWEST), x);  // as x < -87 ? -87 : x (a NaN stays x)
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, c(expc::LOG2E)), c(expc::ROUND)),
                                 c(expc::ROUND));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, c(expc::LN2_HI)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, c(expc::LN2_LO)));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = c(expc::POLY[0]);
  for (int i = 1; i < 6; ++i)
    p = _mm256_add_ps(_mm256_mul_ps(p, r), c(expc::POLY[i]));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, z), r), c(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

inline void exp_scores(float* s, int64_t n, float m, float scale) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(s + j, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(m)),
                                               _mm256_set1_ps(scale))));
  exp_scores_portable(s + j, n - j, m, scale);
}

template <int NV>
inline void weigh_values(float* o, const float* w, const float* block, int64_t n) {
  __m256 acc[2 * NV];
  for (int v = 0; v < 2 * NV; ++v) acc[v] = _mm256_loadu_ps(o + 8 * v);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 wj = _mm256_set1_ps(w[j]);
    for (int v = 0; v < 2 * NV; ++v)
      acc[v] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(block + j * 16 * NV + 8 * v), acc[v]);
  }
  for (int v = 0; v < 2 * NV; ++v) _mm256_storeu_ps(o + 8 * v, acc[v]);
}

inline float max_of(const float* s, int64_t n) {
  __m256 mv = _mm256_set1_ps(s[0]);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(s + j), mv);  // a NaN s_j is passed over, as below
  float lanes[8];
  _mm256_storeu_ps(lanes, mv);
  float m = max_of_portable(lanes, 8);
  for (; j < n; ++j) m = s[j] > m ? s[j] : m;
  return m;
}
#elif defined(__aarch64__) && defined(__ARM_NEON)
template <int NV>
inline void key_sums(const float* q, const float* block, float* out) {
  for (int quad = 0; quad < 4; ++quad) {  // keys 4 * quad ... 4 * quad + 3
    float32x4_t c[4];
    for (int j = 0; j < 4; ++j) {
      const float* k = block + (4 * quad + j) * 16 * NV;
      float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
      for (int v = 0; v < NV; ++v)
        for (int u = 0; u < 4; ++u)  // lanes 4u ... 4u + 3
          a[u] = vfmaq_f32(a[u], vld1q_f32(q + 16 * v + 4 * u), vld1q_f32(k + 16 * v + 4 * u));
      c[j] = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));  // (l, l+8), then (l, l+4)
    }
    // (l, l+2): [key 0's 2 sums, key 1's], [key 2's, key 3's]; then (l, l+1) across the pairs: the 4 keys in order
    const float32x4_t x = vaddq_f32(vcombine_f32(vget_low_f32(c[0]), vget_low_f32(c[1])),
                                    vcombine_f32(vget_high_f32(c[0]), vget_high_f32(c[1])));
    const float32x4_t y = vaddq_f32(vcombine_f32(vget_low_f32(c[2]), vget_low_f32(c[3])),
                                    vcombine_f32(vget_high_f32(c[2]), vget_high_f32(c[3])));
    vst1q_f32(out + 4 * quad, vaddq_f32(vuzp1q_f32(x, y), vuzp2q_f32(x, y)));
  }
}

inline float32x4_t exp4(float32x4_t x) {  // exp_nonpositive, 4 at a time: the same operations in the same order
  const auto c = [](float v) { return vdupq_n_f32(v); };
  x = vbslq_f32(vcltq_f32(x, c(expc::LOWEST)), c(expc::LOWEST), x);  // x < -87 ? -87 : x
  const float32x4_t n = vsubq_f32(vaddq_f32(vmulq_f32(x, c(expc::LOG2E)), c(expc::ROUND)),
                                  c(expc::ROUND));
  float32x4_t r = vsubq_f32(x, vmulq_f32(n, c(expc::LN2_HI)));
  r = vsubq_f32(r, vmulq_f32(n, c(expc::LN2_LO)));
  const float32x4_t z = vmulq_f32(r, r);
  float32x4_t p = c(expc::POLY[0]);
  for (int i = 1; i < 6; ++i)
    p = vaddq_f32(vmulq_f32(p, r), c(expc::POLY[i]));
  p = vaddq_f32(vaddq_f32(vmulq_f32(p, z), r), c(1.0f));
  const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(bits));
}

inline void exp_scores(float* s, int64_t n, float m, float scale) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    vst1q_f32(s + j, exp4(vmulq_f32(vsubq_f32(vld1q_f32(s + j), vdupq_n_f32(m)), vdupq_n_f32(scale))));
  exp_scores_portable(s + j, n - j, m, scale);
}

template <int NV>
inline void weigh_values(float* o, const float* w, const float* block, int64_t n) {
  float32x4_t acc[4 * NV];
  for (int v = 0; v < 4 * NV; ++v) acc[v] = vld1q_f32(o + 4 * v);
  for (int64_t j = 0; j < n; ++j) {
    const float32x4_t wj = vdupq_n_f32(w[j]);
    for (int v = 0; v < 4 * NV; ++v)
      acc[v] = vfmaq_f32(acc[v], wj, vld1q_f32(block + j * 16 * NV + 4 * v));
  }
  for (int v = 0; v < 4 * NV; ++v) vst1q_f32(o + 4 * v, acc[v]);
}

inline float max_of(const float* s, int64_t n) { return max_of_portable(s, n); }
#else
template <int NV>
inline void key_sums(const float* q, const float* block, float* out) { key_sums_portable<NV>(q, block, out); }
inline void exp_scores(float* s, int64_t n, float m, float scale) { exp_scores_portable(s, n, m, scale); }
template <int NV>
inline void weigh_values(float* o, const float* w, const float* block, int64_t n) {
  weigh_values_portable<NV>(o, w, block, n);
}
inline float max_of(const float* s, int64_t n) { return max_of_portable(s, n); }
#endif

}  // namespace attn
}  // namespace stepwise
