// Conversions between the model's dtypes and float, shared by every kernel source (common/native/attention.cpp,
// stages/04_kernels/cpu_kernels.cpp). Widening is exact; narrowing rounds to nearest even, as torch does. The
// bfloat16 ones are integer operations, so a loop over a row of them vectorizes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace stepwise {

inline float widen(float x) { return x; }
inline float widen(at::Half x) { return static_cast<float>(x); }
inline float widen(at::BFloat16 x) {  // bfloat16 is float32's upper half
  union { uint32_t i; float f; } u = {static_cast<uint32_t>(x.x) << 16};
  return u.f;
}

template <typename scalar_t>
inline scalar_t round_to(float x) { return static_cast<scalar_t>(x); }

template <>
inline at::BFloat16 round_to<at::BFloat16>(float x) {
  union { float f; uint32_t i; } u = {x};
  uint32_t rounded = (u.i + 0x7FFFu + ((u.i >> 16) & 1u)) >> 16;
  rounded = x != x ? 0x7FC0u : rounded;  // NaN stays a NaN
  return at::BFloat16(static_cast<uint16_t>(rounded), at::BFloat16::from_bits());
}

}  // namespace stepwise
