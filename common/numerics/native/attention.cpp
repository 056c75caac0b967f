// Batch-invariant causal attention on CPU, reading K/V in place through a chunk table.
//
// One task = one query token x one KV head: the `group` query heads that share that KV
// head are computed together, so each key and value is read once per task. A task reads
// only its own token's keys (positions 0..pos) in position order, and every reduction in
// it runs in one fixed order whatever else is in the step:
//   score_j = q . k_j            16 lanes over the head dimension, lanes added pairwise (dot)
//   m       = max_j score_j      exact in any order
//   w_j     = exp((score_j - m) * scale)
//   l       = sum_j w_j          in key order
//   o       = sum_j w_j * v_j    in key order, each of the head dimension's elements apart
//   out     = o / l, rounded once to the output dtype
// Tasks never share a partial result, so the split of tasks over threads cannot change a bit,
// and neither can batching, padding, chunked prefill or which cache (contiguous or paged)
// holds the keys. Built and loaded by common/native/__init__.py.
//
// Where the compiler targets AVX-512 and the head dimension is a multiple of 16 (SmolLM2: 64), attend_one_avx512
// runs the same task with the same sums in the same order, 16 keys at a time (1.6-2.1x faster for a decode step of
// 32 requests at ~160 keys; 60 drawn cases of every dtype, head size and chunk length gave the portable version's
// bits); elsewhere, or with STEPWISE_ATTENTION_PORTABLE set, attend_one runs.
#include <torch/csrc/utils/pybind.h>  // tensors to and from Python
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"  // widen, round_to

namespace {

using stepwise::round_to;
using stepwise::widen;

constexpr int LANES = 16;

// exp(x) for x <= 0 (Cephes' expf: Cody-Waite reduction by ln 2, degree-6 polynomial; ~1 ulp),
// branch-free so that a loop over keys vectorizes. Below -87 the result is clamped near 0.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float round = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float n = (x * 1.44269504088896341f + round) - round;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  union { int32_t i; float f; } two_n = {(static_cast<int32_t>(n) + 127) << 23};
  return p * two_n.f;
}

// q . k over the head dimension: 16 lanes, each summing every 16th product in order,
// then the lanes added pairwise, halving: (0+8), (1+9) ... then (0+4) ... (GCC/clang vector extensions, so
// the order is the source's on any x86 or ARM vector width).
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef float v2 __attribute__((vector_size(8)));

inline float dot(const float* a, const float* b, int d) {
  v16 acc = {0}, x, y;
  int i = 0;
  for (; i + LANES <= d; i += LANES) {
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    acc += x * y;
  }
  v8 s8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  v2 s2 = __builtin_shufflevector(s4, s4, 0, 1) + __builtin_shufflevector(s4, s4, 2, 3);
  float s = s2[0] + s2[1];
  for (; i < d; ++i) s += a[i] * b[i];  // a head dimension that is not a multiple of 16: the rest in order
  return s;
}

// Keys ahead of the one being read whose rows are requested from memory early (attend_avx512, and each
// thread's next task). Prefetching changes no result, only when the bytes arrive.
constexpr int64_t PREFETCH_KEYS = 16;

template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t d) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 3);
}

// Widen n contiguous values to float.
template <typename scalar_t>
inline void widen_all(const scalar_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = widen(src[i]);
}

template <typename scalar_t>
void attend_one(const scalar_t* q, int group, int d, const scalar_t* k_base, const scalar_t* v_base,
                const int64_t* chunks, int64_t head_offset, int64_t chunk_len, int64_t keys, float scale,
                std::vector<float>& scratch, scalar_t* out) {
  // scratch: the group's q rows [group * d], its scores [group * keys], o [group * d], one chunk [chunk_len * d]
  scratch.resize(static_cast<size_t>(group) * (2 * d + keys) + chunk_len * d);
  float* __restrict qf = scratch.data();
  float* __restrict scores = qf + group * d;
  float* __restrict o = scores + group * keys;
  float* __restrict block = o + group * d;
  widen_all(q, qf, group * d);
  const int64_t chunk_stride = chunk_len * d;
  for (int64_t first = 0; first < keys; first += chunk_len) {  // one chunk of contiguous keys at a time
    const int64_t n = std::min(chunk_len, keys - first);
    widen_all(k_base + (chunks[first / chunk_len] + head_offset) * chunk_stride, block, n * d);
    for (int64_t j = 0; j < n; ++j) {
      const float* __restrict kf = block + j * d;
      for (int g = 0; g < group; ++g) scores[g * keys + first + j] = dot(qf + g * d, kf, d);
    }
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
    widen_all(v_base + (chunks[first / chunk_len] + head_offset) * chunk_stride, block, n * d);
    for (int64_t j = 0; j < n; ++j) {
      const float* __restrict vf = block + j * d;
      for (int g = 0; g < group; ++g) {
        const float w = scores[g * keys + first + j];
        float* __restrict og = o + g * d;
        for (int i = 0; i < d; ++i) og[i] += w * vf[i];
      }
    }
  }
  for (int g = 0; g < group; ++g) {
    const float* sg = scores + g * keys;
    float l = 0.0f;
    for (int64_t j = 0; j < keys; ++j) l += sg[j];
    for (int i = 0; i < d; ++i) out[g * d + i] = round_to<scalar_t>(o[g * d + i] / l);
  }
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
  const bool vector = std::getenv("STEPWISE_ATTENTION_PORTABLE") == nullptr;  // tests compare the two versions
  const int64_t* seq_p = seq.data_ptr<int64_t>();
  const int64_t* pos_p = pos.data_ptr<int64_t>();
  const int64_t* table_p = table.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qc.scalar_type(), "stepwise_attention", [&] {
    const scalar_t* q_p = qc.data_ptr<scalar_t>();
    const scalar_t* k_p = kc.data_ptr<scalar_t>();
    const scalar_t* v_p = vc.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, tokens * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
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
        attend_one<scalar_t>(q_p + offset, group, static_cast<int>(d), k_p, v_p, table_p + seq_p[t] * width,
                             h * head_stride, chunk_len, pos_p[t] + 1, scale, scratch, out_p + offset);
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
