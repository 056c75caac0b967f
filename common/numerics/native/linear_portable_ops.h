// The portable linear's torch side, part of linear.cpp: packing a weight tensor into linear_portable_pack.h's
// layout once at load, and one call of linear_portable.h's kernel on a tensor of rows, its outputs split over
// torch's threads (whole blocks of 16 outputs each: a thread never splits an output's sum).
#pragma once

#include "linear_portable.h"

namespace {

namespace sp = stepwise_portable;

const char* portable_isa() { return sp::ISA; }
const char* w4a8_isa() { return sp::DOT_ISA; }  // which instruction sums W4A8's integer products

// weight [n, k] (bfloat16, float32 or int8) -> bfloat16 [blocks, kp / 2, 16, 2], float32 or int8 [blocks, kp, 16].
at::Tensor pack_portable(const at::Tensor& weight_in) {
  TORCH_CHECK(weight_in.dim() == 2, "pack_portable takes a 2-D weight");
  const auto w = weight_in.contiguous();
  const int64_t n = w.size(0), k = w.size(1), blocks = sp::block_count(n), kp = sp::padded_inputs(k);
  switch (w.scalar_type()) {
    case at::kBFloat16: {
      auto out = at::empty({blocks, kp / 2, sp::BLOCK, 2}, w.options());
      sp::pack_dense(sp::Kind::bf16, reinterpret_cast<const uint16_t*>(w.const_data_ptr()), n, k,
                     reinterpret_cast<uint16_t*>(out.data_ptr()));
      return out;
    }
    case at::kFloat: {
      auto out = at::empty({blocks, kp, sp::BLOCK}, w.options());
      sp::pack_dense(sp::Kind::f32, w.const_data_ptr<float>(), n, k, out.data_ptr<float>());
      return out;
    }
    case at::kChar: {
      auto out = at::empty({blocks, kp, sp::BLOCK}, w.options());
      sp::pack_dense(sp::Kind::int8, w.const_data_ptr<int8_t>(), n, k, out.data_ptr<int8_t>());
      return out;
    }
    default: TORCH_CHECK(false, "pack_portable takes bfloat16, float32 or int8 weights");
  }
}

// Q4_1 groups: codes [n, k] (uint8, 0..15), d and m [n, k / 32] (float16) -> records uint8 [blocks, k / 32, 320].
at::Tensor pack_int4_portable(const at::Tensor& codes, const at::Tensor& d, const at::Tensor& mins) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte, "codes must be 2-D uint8");
  TORCH_CHECK(d.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf, "d and m must be float16");
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(k % sp::GROUP == 0 && d.dim() == 2 && d.sizes() == mins.sizes() && d.size(0) == n &&
              d.size(1) == k / sp::GROUP, "int4 takes groups of 32 inputs: codes [n, k], d and m [n, k / 32]");
  const auto c = codes.contiguous(), dc = d.contiguous(), mc = mins.contiguous();
  auto out = at::empty({sp::block_count(n), k / sp::GROUP, sp::INT4_RECORD}, codes.options());
  sp::pack_int4(c.const_data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(dc.const_data_ptr()),
                reinterpret_cast<const uint16_t*>(mc.const_data_ptr()), n, k, out.data_ptr<uint8_t>());
  return out;
}

sp::Kind portable_kind(const at::Tensor& packed) {
  switch (packed.scalar_type()) {
    case at::kBFloat16: return sp::Kind::bf16;
    case at::kFloat: return sp::Kind::f32;
    case at::kChar: return sp::Kind::int8;
    case at::kByte: return sp::Kind::int4;
    default: TORCH_CHECK(false, "the packed weight must be bfloat16, float32, int8 or int4 (from pack_portable)");
  }
}

// x [m, k] (bfloat16; float32 for float32 weights) times a weight from pack_portable / pack_int4_portable: [m, n].
// w4a8: int4 records, the rows quantized to int8 per group first (linear_portable_w4a8.h).
at::Tensor linear_portable(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& scales,
                           int64_t n, bool w4a8 = false) {
  const sp::Kind kind = w4a8 ? sp::Kind::w4a8 : portable_kind(packed);
  TORCH_CHECK(!w4a8 || packed.scalar_type() == at::kByte, "w4a8 reads int4 records (pack_int4_portable)");
  // int4 records (int4 and w4a8) share a layout; int4 alone takes the group sums of x, w4a8 its rows in int8
  const bool f32 = kind == sp::Kind::f32, int8 = kind == sp::Kind::int8, int4 = kind == sp::Kind::int4 || w4a8;
  const bool sums_of_x = kind == sp::Kind::int4;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == (f32 ? at::kFloat : at::kBFloat16),
              f32 ? "x must be 2-D float32 for float32 weights" : "x must be 2-D bfloat16");
  TORCH_CHECK(packed.is_contiguous() && packed.dim() == (kind == sp::Kind::bf16 ? 4 : 3) &&
              packed.size(2) == (int4 ? sp::INT4_RECORD : sp::BLOCK), "the packed weight is not pack_portable's");
  TORCH_CHECK(int8 == scales.has_value(), "int8 weights need their scales, other weights none");
  const int64_t m = x.size(0), k = x.size(1), blocks = packed.size(0);
  const int64_t kp = int4 ? packed.size(1) * sp::GROUP : kind == sp::Kind::bf16 ? packed.size(1) * 2 : packed.size(1);
  TORCH_CHECK(k <= kp && kp - k < sp::K_ALIGN && n <= blocks * sp::BLOCK && n > blocks * sp::BLOCK - sp::BLOCK,
              "x or n does not fit the weight");
  TORCH_CHECK(!int4 || k == kp, "int4 takes whole groups of 32 inputs");
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  // The rows in float32 (bfloat16 widens exactly: a shift), zero padded to kp inputs, in a buffer of this thread's
  // (two tensor operations here cost more than the kernel on a small linear).
  const at::Tensor xc = x.contiguous();
  thread_local std::vector<float> buffer;
  const float* X = f32 && k == kp ? xc.const_data_ptr<float>() : nullptr;
  if (!X) {
    buffer.resize(m * kp);
    for (int64_t r = 0; r < m; ++r) {
      float* row = buffer.data() + r * kp;
      if (f32) {
        std::copy(xc.const_data_ptr<float>() + r * k, xc.const_data_ptr<float>() + (r + 1) * k, row);
      } else {
        const uint16_t* bits = reinterpret_cast<const uint16_t*>(xc.const_data_ptr()) + r * k;
        for (int64_t i = 0; i < k; ++i) {
          const uint32_t wide = uint32_t{bits[i]} << 16;
          std::memcpy(row + i, &wide, 4);
        }
      }
      std::fill(row + k, row + kp, 0.0f);
    }
    X = buffer.data();
  }
  const at::Tensor scale = int8 ? scales->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!int8 || scale.numel() >= n, "one scale per output");
  std::vector<float> sums(sums_of_x ? m * (kp / sp::GROUP) : 0);
  if (sums_of_x) sp::group_sums(X, m, kp, kp / sp::GROUP, sums.data());
  thread_local std::vector<int8_t> qa;  // this (calling) thread's: the workers below write through pointers
  thread_local std::vector<float> qs;
  if (w4a8) {
    qa.resize(m * kp), qs.resize(m * (kp / sp::GROUP) * 2);
    int8_t* const a = qa.data();
    float* const s = qs.data();
    at::parallel_for(0, m, 8, [=](int64_t r0, int64_t r1) {
      sp::quantize_rows(X + r0 * kp, r1 - r0, kp, kp, a + r0 * kp, s + r0 * (kp / sp::GROUP) * 2);
    });
  }
  const sp::Problem problem{kind, X, m, kp, kp, n, packed.const_data_ptr(),
                            int8 ? scale.const_data_ptr<float>() : nullptr, sums.empty() ? nullptr : sums.data(),
                            out.data_ptr(), w4a8 ? qa.data() : nullptr, w4a8 ? qs.data() : nullptr};
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) { sp::linear_blocks(problem, b0, b1); });
  return out;
}

}  // namespace
