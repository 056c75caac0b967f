// Batch-invariant causal attention on CPU, reading K/V in place through a chunk table.
//
// One task = one query token x one KV head: the `group` query heads that share that KV head are computed together,
// so each key and value is read once per task. A task reads only its own token's keys (positions 0..pos) in
// position order, and every reduction in it runs in one order fixed by the source (attention_core.h states it).
// Tasks never share a partial result, so the split of tasks over threads cannot change a bit, and neither can
// batching, padding, chunked prefill or which cache (contiguous or paged) holds the keys. Built and loaded by
// common/numerics/native/__init__.py.
//
// Which version runs a task: where the compiler targets AVX-512 and the head dimension is a multiple of 16 (SmolLM2:
// 64), attend_one_avx512 (attention_avx512.h: 16 keys at a time, 1.6-2.1x faster than one key at a time for a
// decode step of 32 requests at ~160 keys); elsewhere attention_core.h's attend (16 keys at a time on AVX2, NEON or
// plain loops, else one key at a time). With STEPWISE_ATTENTION_PORTABLE set, the reference attend_portable. All
// make the same sums in the same order, so they give the same bits (tests/test_invariance.py compares them on
// drawn cases here, native/test/attention_test.cpp on any ISA without torch).
#include <torch/csrc/utils/pybind.h>  // tensors to and from Python
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "attention_core.h"  // stepwise::attn: the task, torch-free
#include "bf16.h"            // widen, round_to
#include "parallel.h"        // stepwise::parallel_for: OpenMP, else threads of our own

namespace {

using stepwise::round_to;
using stepwise::attn::prefetch_row;
using stepwise::attn::prefetch_row_l2;
using stepwise::attn::PREFETCH_GROUPS;
using stepwise::attn::PREFETCH_KEYS;
namespace expc = stepwise::attn::expc;  // exp_nonpositive's constants, for exp16
using stepwise::attn::rows_of;
using stepwise::attn::stream_rows;

template <typename scalar_t>
struct Convert {  // the model dtype to float and back (bf16.h), as attention_core.h takes it
  static float widen(scalar_t x) { return stepwise::widen(x); }
  static scalar_t narrow(float x) { return round_to<scalar_t>(x); }
};

template <typename scalar_t>
inline void widen_all(const scalar_t* __restrict src, float* __restrict dst, int64_t n) {
  stepwise::attn::widen_all<Convert<scalar_t>>(src, dst, n);
}

#include "attention_avx512.h"  // attend_avx512: the same task, 16 keys at a time

// q [tokens, heads, d]; k_chunks, v_chunks [chunks, chunk_len, d]; token_seq, token_pos [tokens];
// chunk_table [seqs, width]: chunk of positions c*chunk_len... of KV head 0, head h adds h * head_stride.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k_chunks, const at::Tensor& v_chunks,
                     const at::Tensor& token_seq, const at::Tensor& token_pos, const at::Tensor& chunk_table,
                     int64_t num_kv_heads, int64_t head_stride) {
  TORCH_CHECK(q.dim() == 3 && k_chunks.dim() == 3 && v_chunks.dim() == 3, "q and the chunks are 3-d");
  TORCH_CHECK(q.scalar_type() == k_chunks.scalar_type() && q.scalar_type() == v_chunks.scalar_type(),
              "q, k and v share one dtype");
  const auto qc = q.contiguous();
  const auto kc = k_chunks.contiguous(), vc = v_chunks.contiguous();
  const auto seq = token_seq.to(at::kLong).contiguous(), pos = token_pos.to(at::kLong).contiguous();
  const auto table = chunk_table.to(at::kLong).contiguous();
  const int64_t tokens = qc.size(0), heads = qc.size(1), d = qc.size(2);
  const int64_t chunk_len = kc.size(1), width = table.size(1);
  const int group = static_cast<int>(heads / num_kv_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto out = at::empty_like(qc);
  const bool vector = std::getenv("STEPWISE_ATTENTION_PORTABLE") == nullptr;  // tests compare the versions
  const int64_t* seq_p = seq.data_ptr<int64_t>();
  const int64_t* pos_p = pos.data_ptr<int64_t>();
  const int64_t* table_p = table.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qc.scalar_type(), "stepwise_attention", [&] {
    const scalar_t* q_p = qc.data_ptr<scalar_t>();
    const scalar_t* k_p = kc.data_ptr<scalar_t>();
    const scalar_t* v_p = vc.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    stepwise::parallel_for(0, tokens * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / num_kv_heads, h = task % num_kv_heads;
        if (task + 1 < end) {  // the next task's first keys and values, on their way while this task runs
          const int64_t next_token = (task + 1) / num_kv_heads, next_head = (task + 1) % num_kv_heads;
          const int64_t first = (table_p[seq_p[next_token] * width] + next_head * head_stride) * chunk_len * d;
          const int64_t n = std::min<int64_t>({pos_p[next_token] + 1, chunk_len, PREFETCH_KEYS});
          for (int64_t j = 0; j < n; ++j) {
            prefetch_row(k_p + first + j * d, d);
            prefetch_row(v_p + first + j * d, d);
          }
        }
        const int64_t offset = (t * heads + h * group) * d;
#if defined(__AVX512F__)
        if constexpr (!std::is_same_v<scalar_t, double>) if (vector && d % 16 == 0 && d <= 128 && group <= 64) {
          attend_avx512<scalar_t>(static_cast<int>(d / 16), q_p + offset, group, k_p, v_p,
                                  table_p + seq_p[t] * width, h * head_stride, chunk_len, pos_p[t] + 1, scale,
                                  scratch, out_p + offset);
          continue;
        }
#endif
        const auto attend = vector ? stepwise::attn::attend<Convert<scalar_t>, scalar_t>
                                   : stepwise::attn::attend_portable<Convert<scalar_t>, scalar_t>;
        attend(q_p + offset, group, static_cast<int>(d), k_p, v_p, table_p + seq_p[t] * width, h * head_stride,
               chunk_len, pos_p[t] + 1, scale, scratch, out_p + offset);
      }
    });
  });
  return out;
}

}  // namespace

// Python functions, not torch.ops operators (common/native says why); kernels let go of the interpreter lock.
PYBIND11_MODULE(STEPWISE_MODULE, m) {
  m.def("attention", &attention, pybind11::call_guard<pybind11::gil_scoped_release>());
}
