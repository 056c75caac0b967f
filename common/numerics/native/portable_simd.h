// The per-ISA part of the portable linear (linear_portable.h): eight float32 lanes, `V8`, and the few operations the
// kernel needs, each written three times: AVX2 + FMA + F16C (one 256-bit register), NEON on aarch64 (two 128-bit
// registers) and plain C++ (eight floats, `std::fma`). Nothing here reorders a sum: every operation is per lane,
// and `fma` rounds once, like the hardware instruction on every ISA, so a lane's result is the same bits on each.
// W4A8's integer dot products (`Dot`) pick the best instruction each ISA has: their sums are exact, so any will do.
// Torch-free: native/test/linear_test.cpp builds it alone, for each ISA.
//
// Which one compiles: AVX2 where the compiler targets it (-march=native on an AVX2 CPU), NEON on aarch64, else
// scalar; -DSTEPWISE_PORTABLE_SCALAR forces scalar (the test builds it on x86 too).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if !defined(STEPWISE_PORTABLE_SCALAR) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define STEPWISE_PORTABLE_AVX2 1
#include <immintrin.h>
#elif !defined(STEPWISE_PORTABLE_SCALAR) && defined(__aarch64__) && defined(__ARM_NEON)
#define STEPWISE_PORTABLE_NEON 1
#include <arm_neon.h>
#endif

namespace stepwise_portable {

// float16 -> float32, exactly (every float16, subnormals included, is a float32); for the scalar path.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // infinity, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // normal: rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: mantissa * 2^-24, normal in float32
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400)) m <<= 1, ++shift;
    bits = sign | ((113 - shift) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#if defined(STEPWISE_PORTABLE_AVX2)
constexpr const char* ISA = "AVX2";
using V8 = __m256;
inline V8 zero() { return _mm256_setzero_ps(); }
inline V8 broadcast(float x) { return _mm256_set1_ps(x); }
inline V8 fma(V8 x, V8 w, V8 acc) { return _mm256_fmadd_ps(x, w, acc); }  // acc + x w, one rounding
inline V8 load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, V8 v) { _mm256_storeu_ps(p, v); }
// 8 outputs' input pairs (bfloat16, even input in the low half): a shift and a mask widen them exactly.
inline void widen_pairs(const uint16_t* p, V8& even, V8& odd) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
inline V8 widen_int8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline V8 widen_half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// 8 lanes of 8 int4 codes each (code t in bits 4t..4t+3): code T of every lane, as float.
struct Codes { __m256i u; };
inline Codes load_codes(const uint8_t* p) { return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))}; }
template <int T>
inline V8 code(Codes c) {
  const __m256i shifted = T ? _mm256_srli_epi32(c.u, 4 * T) : c.u;
  return _mm256_cvtepi32_ps(T == 7 ? shifted : _mm256_and_si256(shifted, _mm256_set1_epi32(15)));
}
// Code T times 16^T, masked in place (no shift), for T < 7; code 7 (the top nibble) shifted down, unscaled.
template <int T>
inline V8 code_scaled(Codes c) {
  if constexpr (T == 7) return _mm256_cvtepi32_ps(_mm256_srli_epi32(c.u, 28));
  else return _mm256_cvtepi32_ps(_mm256_and_si256(c.u, _mm256_set1_epi32(15 << (4 * T))));
}

inline V8 mul(V8 a, V8 b) { return _mm256_mul_ps(a, b); }
// W4A8 (linear_portable_w4a8.h): 8 outputs' int4 codes (4 per 32-bit lane, one per byte, 0..15) times 4 int8
// inputs broadcast, summed per lane in integers: exact, so every ISA's instruction gives the same sums.
using Bytes32 = __m256i;
inline void split_codes(const uint8_t* p, Bytes32& lo, Bytes32& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), nibble = _mm256_set1_epi8(15);
  lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
}
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr const char* DOT_ISA = "AVX-512 VNNI";
struct Dot { __m256i v; };  // int32 per lane
inline Dot dot_add(Dot acc, Bytes32 codes, int32_t x4) { return {_mm256_dpbusd_epi32(acc.v, codes, _mm256_set1_epi32(x4))}; }
inline V8 dot_value(Dot acc) { return _mm256_cvtepi32_ps(acc.v); }
#elif defined(__AVXVNNI__)
constexpr const char* DOT_ISA = "AVX-VNNI";
struct Dot { __m256i v; };
inline Dot dot_add(Dot acc, Bytes32 codes, int32_t x4) { return {_mm256_dpbusd_avx_epi32(acc.v, codes, _mm256_set1_epi32(x4))}; }
inline V8 dot_value(Dot acc) { return _mm256_cvtepi32_ps(acc.v); }
#else
constexpr const char* DOT_ISA = "AVX2";
// int16 pairs (VPMADDUBSW: q0 x0 + q1 x1, |.| <= 2 * 15 * 127 = 3810): a group's 8 adds stay below 2^15, exact;
// VPMADDWD then adds the pairs into the lane's int32.
struct Dot { __m256i v; };
inline Dot dot_add(Dot acc, Bytes32 codes, int32_t x4) {
  return {_mm256_add_epi16(acc.v, _mm256_maddubs_epi16(codes, _mm256_set1_epi32(x4)))};
}
inline V8 dot_value(Dot acc) { return _mm256_cvtepi32_ps(_mm256_madd_epi16(acc.v, _mm256_set1_epi16(1))); }
#endif
inline Dot dot_zero() { return {_mm256_setzero_si256()}; }

#elif defined(STEPWISE_PORTABLE_NEON)
constexpr const char* ISA = "NEON";
struct V8 { float32x4_t lo, hi; };
inline V8 zero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
inline V8 broadcast(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
inline V8 fma(V8 x, V8 w, V8 acc) { return {vfmaq_f32(acc.lo, x.lo, w.lo), vfmaq_f32(acc.hi, x.hi, w.hi)}; }
inline V8 load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline void store(float* p, V8 v) { vst1q_f32(p, v.lo), vst1q_f32(p + 4, v.hi); }
inline void widen_pairs(const uint16_t* p, V8& even, V8& odd) {
  const uint32x4_t a = vld1q_u32(reinterpret_cast<const uint32_t*>(p)), b = vld1q_u32(reinterpret_cast<const uint32_t*>(p + 8));
  const uint32x4_t high = vdupq_n_u32(0xFFFF0000u);
  even = {vreinterpretq_f32_u32(vshlq_n_u32(a, 16)), vreinterpretq_f32_u32(vshlq_n_u32(b, 16))};
  odd = {vreinterpretq_f32_u32(vandq_u32(a, high)), vreinterpretq_f32_u32(vandq_u32(b, high))};
}
inline V8 widen_int8(const int8_t* p) {
  const int16x8_t h = vmovl_s8(vld1_s8(p));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))};
}
inline V8 widen_half(const uint16_t* p) {
  return {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))), vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4)))};
}
struct Codes { uint32x4_t lo, hi; };
inline Codes load_codes(const uint8_t* p) {
  return {vld1q_u32(reinterpret_cast<const uint32_t*>(p)), vld1q_u32(reinterpret_cast<const uint32_t*>(p + 16))};
}
template <int T>
inline V8 code(Codes c) {
  const uint32x4_t fifteen = vdupq_n_u32(15);
  if constexpr (T == 0) return {vcvtq_f32_u32(vandq_u32(c.lo, fifteen)), vcvtq_f32_u32(vandq_u32(c.hi, fifteen))};
  else return {vcvtq_f32_u32(vandq_u32(vshrq_n_u32(c.lo, 4 * T), fifteen)),
               vcvtq_f32_u32(vandq_u32(vshrq_n_u32(c.hi, 4 * T), fifteen))};
}
template <int T>
inline V8 code_scaled(Codes c) {
  if constexpr (T == 7) return {vcvtq_f32_u32(vshrq_n_u32(c.lo, 28)), vcvtq_f32_u32(vshrq_n_u32(c.hi, 28))};
  const uint32x4_t mask = vdupq_n_u32(15u << (4 * T));
  return {vcvtq_f32_u32(vandq_u32(c.lo, mask)), vcvtq_f32_u32(vandq_u32(c.hi, mask))};
}

inline V8 mul(V8 a, V8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
struct Bytes32 { int8x16_t a, b; };  // lanes 0-3 and 4-7
inline void split_codes(const uint8_t* p, Bytes32& lo, Bytes32& hi) {
  const uint8x16_t a = vld1q_u8(p), b = vld1q_u8(p + 16), nibble = vdupq_n_u8(15);
  lo = {vreinterpretq_s8_u8(vandq_u8(a, nibble)), vreinterpretq_s8_u8(vandq_u8(b, nibble))};
  hi = {vreinterpretq_s8_u8(vshrq_n_u8(a, 4)), vreinterpretq_s8_u8(vshrq_n_u8(b, 4))};
}
#if defined(__ARM_FEATURE_DOTPROD)
constexpr const char* DOT_ISA = "NEON dotprod";
struct Dot { int32x4_t a, b; };
inline Dot dot_zero() { return {vdupq_n_s32(0), vdupq_n_s32(0)}; }
inline Dot dot_add(Dot acc, Bytes32 codes, int32_t x4) {
  const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
  return {vdotq_s32(acc.a, codes.a, x), vdotq_s32(acc.b, codes.b, x)};
}
inline V8 dot_value(Dot acc) { return {vcvtq_f32_s32(acc.a), vcvtq_f32_s32(acc.b)}; }
#else
constexpr const char* DOT_ISA = "NEON";
// Each byte's products summed in int16 (|.| <= 8 * 15 * 127 = 15240 for a group's 8 adds: exact), the four
// bytes of a lane added at the end.
struct Dot { int16x8_t a0, a1, b0, b1; };
inline Dot dot_zero() { return {vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0)}; }
inline Dot dot_add(Dot acc, Bytes32 codes, int32_t x4) {
  const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
  return {vmlal_s8(acc.a0, vget_low_s8(codes.a), vget_low_s8(x)), vmlal_high_s8(acc.a1, codes.a, x),
          vmlal_s8(acc.b0, vget_low_s8(codes.b), vget_low_s8(x)), vmlal_high_s8(acc.b1, codes.b, x)};
}
inline V8 dot_value(Dot acc) {
  return {vcvtq_f32_s32(vpaddq_s32(vpaddlq_s16(acc.a0), vpaddlq_s16(acc.a1))),
          vcvtq_f32_s32(vpaddq_s32(vpaddlq_s16(acc.b0), vpaddlq_s16(acc.b1)))};
}
#endif

#else
constexpr const char* ISA = "scalar";
struct V8 { float v[8]; };
inline V8 zero() { return V8{}; }
inline V8 broadcast(float x) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = x; return r; }
inline V8 fma(V8 x, V8 w, V8 acc) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = std::fma(x.v[i], w.v[i], acc.v[i]); return r; }
inline V8 load(const float* p) { V8 r; std::memcpy(r.v, p, 32); return r; }
inline void store(float* p, V8 v) { std::memcpy(p, v.v, 32); }
inline float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline void widen_pairs(const uint16_t* p, V8& even, V8& odd) {
  for (int i = 0; i < 8; ++i) even.v[i] = from_bits(uint32_t{p[2 * i]} << 16), odd.v[i] = from_bits(uint32_t{p[2 * i + 1]} << 16);
}
inline V8 widen_int8(const int8_t* p) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>(p[i]); return r; }
inline V8 widen_half(const uint16_t* p) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = half_to_float(p[i]); return r; }
struct Codes { uint32_t u[8]; };
inline Codes load_codes(const uint8_t* p) {
  Codes c;
  for (int i = 0; i < 8; ++i) c.u[i] = uint32_t{p[4 * i]} | uint32_t{p[4 * i + 1]} << 8 | uint32_t{p[4 * i + 2]} << 16 | uint32_t{p[4 * i + 3]} << 24;
  return c;
}
template <int T>
inline V8 code(Codes c) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>((c.u[i] >> (4 * T)) & 15); return r; }
template <int T>
inline V8 code_scaled(Codes c) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>(T == 7 ? c.u[i] >> 28 : c.u[i] & (15u << (4 * T)));
  return r;
}
inline V8 mul(V8 a, V8 b) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = a.v[i] * b.v[i]; return r; }
constexpr const char* DOT_ISA = "scalar";
struct Bytes32 { uint8_t b[32]; };
inline void split_codes(const uint8_t* p, Bytes32& lo, Bytes32& hi) {
  for (int i = 0; i < 32; ++i) lo.b[i] = p[i] & 15, hi.b[i] = p[i] >> 4;
}
struct Dot { int32_t v[8]; };
inline Dot dot_zero() { return Dot{}; }
inline Dot dot_add(Dot acc, Bytes32 codes, int32_t x4) {
  for (int lane = 0; lane < 8; ++lane)
    for (int j = 0; j < 4; ++j)
      acc.v[lane] += codes.b[4 * lane + j] * static_cast<int8_t>(static_cast<uint32_t>(x4) >> (8 * j));
  return acc;
}
inline V8 dot_value(Dot acc) { V8 r; for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>(acc.v[i]); return r; }
#endif

// Requests the line at p into L2 (x86 PREFETCHT1, ARM PRFM PLDL2KEEP), or with L1 into L1 as well (PREFETCHT0,
// PLDL1KEEP). Into L2 is the rule: asked for kilobytes ahead, lines brought into L1 pushed out what the passes were
// reading, the rows' inputs among them, and held L1's few miss buffers. On the 2-core Zen 4 (one thread, SmolLM2's
// layer from memory, a shared machine: provisional), AVX2 build: one row of w4a8 about 1.7x and of int8 1.4x as
// fast, 5 rows of bfloat16 1.6x. One or two rows of float32 weights, the densest stream, are the exception: into L2
// they read at about 0.8x the rate; into L1, two blocks ahead, as before (docs/native-kernels.md, "verify rows").
template <bool L1 = false>
inline void prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, L1 ? 3 : 2);
#else
  (void)p;
#endif
}

}  // namespace stepwise_portable
