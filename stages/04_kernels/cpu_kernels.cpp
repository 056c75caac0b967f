// Fused element-wise kernels for CPU: common/ops.py's add_rms_norm, RoPE and SwiGLU, one pass and one call each.
//
// They must give the reference's bits, so every step below is one of common/ops.py's operations, rounded
// where torch rounds it: a bfloat16 add or multiply is computed in float and rounded to bfloat16
// (nearest even); a float32 operation rounds to float32; the sum of squares runs in float64 in the order
// ops.py fixes (16 interleaved lanes, each in order, then the lanes in order); the root is taken in
// float64. Compiled with -ffp-contract=off, so no multiply and add become one rounding. Nothing here is
// ISA-specific: plain loops the compiler vectorizes for whatever CPU it targets, each element rounded alone, so
// the bits are the same on AVX-512, AVX2, NEON or scalar code; the one exception is SwiGLU's silu, which is
// torch's own on this machine (the table below). Built by common/numerics/native; the bit-for-bit tests are in
// tests/test_stage_04.py.
#include <torch/csrc/utils/pybind.h>  // tensors to and from Python
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include <cmath>
#include <vector>

#include "bf16.h"      // common/numerics/native: widen, round_to
#include "parallel.h"  // common/numerics/native: stepwise::parallel_for (OpenMP, else threads of our own)

namespace {

using stepwise::round_to;
using stepwise::widen;

constexpr int LANES = 16;  // common.ops.LANES

// Rows per thread's share, from a row's width: a share of about ELEMENTS_PER_SHARE values, so the 16 rows of a
// decode step at a 2,048-wide model split over two threads (8 rows each), while a small model's rows (576 wide)
// stay on one thread, where a second one's wake-up would cost more than its share. A fixed grain of 16 rows kept
// every decode step of up to 16 rows on one thread. Every row's result is its own, so the split changes no bit.
constexpr int64_t ELEMENTS_PER_SHARE = 16384;
inline int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, ELEMENTS_PER_SHARE / std::max<int64_t>(width, 1));
}

// (RMSNorm(x + residual) * weight, x + residual) for rows of `hidden` values.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.sizes() == residual.sizes(), "x and residual are [rows, hidden]");
  TORCH_CHECK(x.size(1) % LANES == 0, "hidden must be a multiple of ", LANES);
  const auto xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  auto out = at::empty_like(xc), new_residual = at::empty_like(xc);
  const int64_t rows = xc.size(0), hidden = xc.size(1);
  const float eps_f = static_cast<float>(eps), hidden_f = static_cast<float>(hidden);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "fused_add_rms_norm", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    const scalar_t* rp = rc.data_ptr<scalar_t>();
    const scalar_t* wp = wc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    scalar_t* np = new_residual.data_ptr<scalar_t>();
    // The norm's weight is read only in the last pass over a row, and in a decode step it is cold (the step's
    // weights streamed through the caches since this layer ran): requested now, it arrives while the sum of
    // squares runs. With it, the residual of a lone row (a decode step of one request). One request, int8,
    // flipped on and off every other step: 6.26 -> 6.19 ms a step (bfloat16 9.41 -> 9.34), medians of ~380 steps.
    const auto request = [hidden](const scalar_t* row) {
      for (int64_t b = 0; b < hidden * static_cast<int64_t>(sizeof(scalar_t)); b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(row) + b, 0, 3);
    };
    request(wp);
    if (rows == 1) request(rp);
    stepwise::parallel_for(0, rows, row_grain(hidden), [&](int64_t begin, int64_t end) {
      std::vector<float> xf(hidden);
      for (int64_t row = begin; row < end; ++row) {
        const int64_t base = row * hidden;
        for (int64_t i = 0; i < hidden; ++i) {  // residual = x + residual, in the model dtype
          const scalar_t r = round_to<scalar_t>(widen(xp[base + i]) + widen(rp[base + i]));
          np[base + i] = r;
          xf[i] = widen(r);
        }
        double lane[LANES] = {0};
        for (int64_t k = 0; k < hidden; k += LANES)
          for (int l = 0; l < LANES; ++l) {
            const float square = xf[k + l] * xf[k + l];  // a float32 product, then widened
            lane[l] += static_cast<double>(square);
          }
        double total = lane[0];
        for (int l = 1; l < LANES; ++l) total += lane[l];
        float mean = static_cast<float>(total) / hidden_f;
        mean = mean + eps_f;
        const float root = static_cast<float>(std::sqrt(static_cast<double>(mean)));
        for (int64_t i = 0; i < hidden; ++i) {
          const scalar_t normed = round_to<scalar_t>(xf[i] / root);
          op[base + i] = round_to<scalar_t>(widen(wp[i]) * widen(normed));
        }
      }
    });
  });
  return {out, new_residual};
}

// x * cos + swap_halves(x) * sin for one head of d values, each product and the sum in float32.
template <typename scalar_t>
inline void rotate(const scalar_t* x, const float* c, const float* s, int64_t d, scalar_t* o) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) o[i] = round_to<scalar_t>(widen(x[i]) * c[i] + widen(x[i + half]) * s[i]);
  for (int64_t i = half; i < d; ++i) o[i] = round_to<scalar_t>(widen(x[i]) * c[i] + widen(x[i - half]) * s[i]);
}

// RoPE on the q and k heads of the merged projection's output: qkv [tokens, (heads + 2 kv_heads) * d],
// cos, sin [tokens, 1, d] float32 as ops.rope_tables makes them. Returns the rotated q and k heads,
// [tokens, heads + kv_heads, d].
at::Tensor rope_qk(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                   int64_t kv_heads) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos and sin are float32");
  const auto qc = qkv.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  const int64_t tokens = qc.size(0), d = cc.size(-1), rotated = heads + kv_heads, width = qc.size(1);
  auto out = at::empty({tokens, rotated, d}, qc.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qc.scalar_type(), "fused_rope_qk", [&] {
    const scalar_t* xp = qc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    stepwise::parallel_for(0, tokens, row_grain(width), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < rotated; ++h)
          rotate(xp + t * width + h * d, cc.data_ptr<float>() + t * d, sc.data_ptr<float>() + t * d, d,
                 op + (t * rotated + h) * d);
    });
  });
  return out;
}

// rope_qk and the KV cache's write in one pass: q heads rotated into the returned [tokens, heads, d]; each
// token's k heads rotated, and its v heads copied, straight into the cache's rows (k_rows, v_rows: a layer's
// storage viewed [rows, d]; write_rows [tokens, kv_heads]: the row of each token's head). The same roundings
// as rope_qk followed by index_copy_, without the rotated k and the copies in between.
at::Tensor rope_qk_store(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                         int64_t kv_heads, at::Tensor k_rows, at::Tensor v_rows, const at::Tensor& write_rows) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos and sin are float32");
  TORCH_CHECK(k_rows.is_contiguous() && v_rows.is_contiguous() && k_rows.scalar_type() == qkv.scalar_type() &&
              v_rows.scalar_type() == qkv.scalar_type(), "the cache rows are contiguous, in the model dtype");
  const auto qc = qkv.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  const auto rows = write_rows.to(at::kLong).contiguous();
  const int64_t tokens = qc.size(0), d = cc.size(-1), width = qc.size(1), cache_rows = k_rows.size(0);
  TORCH_CHECK(width == (heads + 2 * kv_heads) * d && k_rows.size(1) == d && rows.numel() == tokens * kv_heads,
              "qkv, the cache rows and write_rows do not fit together");
  auto q = at::empty({tokens, heads, d}, qc.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qc.scalar_type(), "fused_rope_qk_store", [&] {
    const scalar_t* xp = qc.data_ptr<scalar_t>();
    scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k_rows.data_ptr<scalar_t>(), *vp = v_rows.data_ptr<scalar_t>();
    const int64_t* rp = rows.data_ptr<int64_t>();
    stepwise::parallel_for(0, tokens, row_grain(width), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float *c = cc.data_ptr<float>() + t * d, *s = sc.data_ptr<float>() + t * d;
        const scalar_t* x = xp + t * width;
        for (int64_t h = 0; h < heads; ++h) rotate(x + h * d, c, s, d, qp + (t * heads + h) * d);
        for (int64_t j = 0; j < kv_heads; ++j) {
          const int64_t row = rp[t * kv_heads + j];
          TORCH_CHECK(row >= 0 && row < cache_rows, "write_rows outside the cache");
          rotate(x + (heads + j) * d, c, s, d, kp + row * d);
          std::memcpy(vp + row * d, x + (heads + kv_heads + j) * d, d * sizeof(scalar_t));
        }
      }
    });
  });
  return q;
}

// silu(gate) * up for the merged projection's output gate_up [rows, 2 * ffn] -> [rows, ffn]. silu goes through
// torch's vectorized exp, whose bits no formula of ours can promise to repeat; but a 16-bit gate has only 65,536
// values, so silu_table holds torch's own silu of each (built at load by F.silu on all of them, widened to
// float32: exact) and the kernel looks it up, then multiplies in float and rounds, as torch's multiply does.
// The loop vectorizes (a gather from the table, integer widening and rounding).
at::Tensor swiglu(const at::Tensor& gate_up, const at::Tensor& silu_table) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up is [rows, 2 * ffn]");
  TORCH_CHECK(silu_table.numel() == 65536 && silu_table.is_contiguous() && silu_table.scalar_type() == at::kFloat,
              "silu_table holds silu of all 65,536 values, as float32");
  const auto gc = gate_up.contiguous();
  const int64_t rows = gc.size(0), f = gc.size(1) / 2;
  auto out = at::empty({rows, f}, gc.options());
  const float* table = silu_table.data_ptr<float>();
  AT_DISPATCH_REDUCED_FLOATING_TYPES(gc.scalar_type(), "fused_swiglu", [&] {
    const scalar_t* gp = gc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    stepwise::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const uint16_t* gate = reinterpret_cast<const uint16_t*>(gp + row * 2 * f);
        const scalar_t* up = gp + row * 2 * f + f;
        scalar_t* o = op + row * f;
        for (int64_t i = 0; i < f; ++i) o[i] = round_to<scalar_t>(table[gate[i]] * widen(up[i]));
      }
    });
  });
  return out;
}

}  // namespace

// Python functions, not torch.ops operators (common/native says why); kernels let go of the interpreter lock.
PYBIND11_MODULE(STEPWISE_MODULE, m) {
  m.def("add_rms_norm", &add_rms_norm, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("rope_qk", &rope_qk, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("rope_qk_store", &rope_qk_store, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("swiglu", &swiglu, pybind11::call_guard<pybind11::gil_scoped_release>());
}
