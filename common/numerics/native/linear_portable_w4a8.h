// W4A8: the int4 records (Q4_1 groups, linear_portable_pack.h) times activations quantized to int8, group by group,
// in integer dot products: what llama.cpp's Q4_1 x Q8_1 does. Part of linear_portable.h (after `Problem`).
//
// Why a second int4. The int4 kernels keep x in float32, so every weight costs a widening and a float
// multiply-add; one request's decode is then bound by that arithmetic, not by reading the 4-bit weights. Here 4
// inputs x 8 outputs are one integer instruction (VPDPBUSD with AVX-512 VNNI or AVX-VNNI, VPMADDUBSW + VPMADDWD on
// AVX2, SDOT or SMLAL on NEON). Integer sums are exact in any order, so the bits are the same on every ISA and in
// every batch by construction; the definition (tensor ops: common/numerics/linear_reference.py `w4a8`):
//
//   per row and group g of 32 inputs   amax = max |x_i|;  if amax >= 2^-100:  a_i = nearbyint(x_i * (127 / amax)),
//                                      s = amax / 127  (a_i in -127..127; else a_i = 0, s = 0)
//                                      ms = s * float(sum_i a_i)
//   per output                         acc = 0;  group after group:
//                                      acc = fma(m, ms, fma(d * s, float(sum_i q_i a_i), acc))
//                                      y = bf16(acc)
//
// each operation in float32, rounding once (nearbyint: to nearest even). The price: each input is rounded to
// 8 bits per group (relative error up to 1/254 of the group's largest), the same trade llama.cpp makes.
#pragma once

namespace stepwise_portable {

constexpr float W4A8_MIN = 0x1p-100f;  // a group's largest |x| below this quantizes to zeros (127 / amax overflows)

// Where input i of a group sits among its int8 inputs: each run of 8 holds its even inputs, then its odd ones, so
// that one 32-bit word meets the low nibbles of a run's codes (inputs 8c, 8c + 2, ...), the next the high ones.
inline int64_t w4a8_slot(int64_t i) { return i / 8 * 8 + i % 2 * 4 + i % 8 / 2; }

#if defined(STEPWISE_PORTABLE_AVX2)
// One group, eight lanes at a time (the same operations as the plain loop below, so the same bits): the largest
// |x| (an exact maximum, in any order), and with inv given, the int8 inputs in w4a8_slot order and their sum.
inline float group_amax(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int v = 0; v < 4; ++v) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * v)), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.0f;
  for (float f : lanes) amax = std::max(amax, f);
  return amax;
}
inline int quantize_group(const float* x, float inv, int8_t* a) {
  const __m256 by = _mm256_set1_ps(inv);
  const __m256i slots = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // a run's even inputs, then its odd ones
  __m256i q[4], total = _mm256_setzero_si256();
  for (int v = 0; v < 4; ++v) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * v), by),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[v] = _mm256_permutevar8x32_epi32(_mm256_cvtps_epi32(r), slots);
    total = _mm256_add_epi32(total, q[v]);
  }
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  int sum = 0;
  for (int32_t l : lanes) sum += l;
  return sum;
}
#elif defined(STEPWISE_PORTABLE_NEON)
// The same on NEON, four lanes at a time (FRINTN rounds to nearest even, as nearbyint does by default).
inline float group_amax(const float* x) {
  float32x4_t m = vdupq_n_f32(0.0f);
  for (int v = 0; v < 8; ++v) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + 4 * v)));
  return vmaxnmvq_f32(m);
}
inline int quantize_group(const float* x, float inv, int8_t* a) {
  int32x4_t total = vdupq_n_s32(0);
  for (int run = 0; run < 4; ++run) {  // a run's even inputs, then its odd ones
    const int32x4_t lo = vcvtq_s32_f32(vrndnq_f32(vmulq_n_f32(vld1q_f32(x + 8 * run), inv)));
    const int32x4_t hi = vcvtq_s32_f32(vrndnq_f32(vmulq_n_f32(vld1q_f32(x + 8 * run + 4), inv)));
    const int32x4_t even = vuzp1q_s32(lo, hi), odd = vuzp2q_s32(lo, hi);
    vst1_s8(a + 8 * run, vmovn_s16(vcombine_s16(vmovn_s32(even), vmovn_s32(odd))));
    total = vaddq_s32(total, vaddq_s32(even, odd));
  }
  return vaddvq_s32(total);
}
#else
inline float group_amax(const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < GROUP; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}
inline int quantize_group(const float* x, float inv, int8_t* a) {
  int sum = 0;
  for (int i = 0; i < GROUP; ++i) {
    const int q = static_cast<int>(std::nearbyint(x[i] * inv));
    a[w4a8_slot(i)] = static_cast<int8_t>(q), sum += q;
  }
  return sum;
}
#endif

// X [m][ldx] (float32) -> qa [m][kp] (int8, in w4a8_slot order) and qs [m][kp / 32][2] (s, ms), as defined above.
inline void quantize_rows(const float* X, int64_t m, int64_t ldx, int64_t kp, int8_t* qa, float* qs) {
  const int64_t groups = kp / GROUP;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = X + r * ldx + g * GROUP;
      int8_t* a = qa + r * kp + g * GROUP;
      const float amax = group_amax(x);
      float s = 0.0f;
      int sum = 0;
      if (amax >= W4A8_MIN) {
        s = amax / 127.0f;
        sum = quantize_group(x, 127.0f / amax, a);
      } else {
        std::fill(a, a + GROUP, int8_t{0});
      }
      qs[2 * (r * groups + g)] = s, qs[2 * (r * groups + g) + 1] = s * static_cast<float>(sum);
    }
}

// R rows x C blocks of records, groups [g0, g1), into acc[r][c][16] (from +0 where g0 is 0, else going on from
// acc). A group's sums are integers (`Dot`), scaled into float32 once per group; the records are read once per pass
// of up to `max_rows` rows.
template <int R, int C>
void dot_w4a8(const int8_t* qa, int64_t kp, const float* qs, const char* const* blocks, bool ahead,
              float (&acc)[R][C][16], int64_t g0 = 0, int64_t g1 = -1) {
  const int64_t groups = kp / GROUP;
  if (g0 == 0)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) std::fill(acc[r][c], acc[r][c] + 16, 0.0f);
  for (int64_t g = g0; g < (g1 < 0 ? groups : g1); ++g) {
    const uint8_t* records[C];
    group_records<C>(blocks, g, groups, ahead, records);
    Dot part[R][C][2];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[r][c][0] = part[r][c][1] = dot_zero();
    for (int run = 0; run < 4; ++run) {  // inputs 8 run .. 8 run + 7: the low nibbles meet the even ones
      Bytes32 lo[C][2], hi[C][2];
      for (int c = 0; c < C; ++c)
        for (int h = 0; h < 2; ++h) split_codes(records[c] + 64 + 32 * (2 * run + h), lo[c][h], hi[c][h]);
      for (int r = 0; r < R; ++r) {
        int32_t even, odd;
        std::memcpy(&even, qa + r * kp + g * GROUP + 8 * run, 4);
        std::memcpy(&odd, qa + r * kp + g * GROUP + 8 * run + 4, 4);
        for (int c = 0; c < C; ++c)
          for (int h = 0; h < 2; ++h) part[r][c][h] = dot_add(dot_add(part[r][c][h], lo[c][h], even), hi[c][h], odd);
      }
    }
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < 2; ++h) {
        const uint16_t* half = reinterpret_cast<const uint16_t*>(records[c]) + 8 * h;
        const V8 d = widen_half(half), mins = widen_half(half + 16);
        for (int r = 0; r < R; ++r) {
          const float* q = qs + 2 * (r * groups + g);
          const V8 a = fma(mul(d, broadcast(q[0])), dot_value(part[r][c][h]), load(acc[r][c] + 8 * h));
          store(acc[r][c] + 8 * h, fma(mins, broadcast(q[1]), a));
        }
      }
  }
}

}  // namespace stepwise_portable
