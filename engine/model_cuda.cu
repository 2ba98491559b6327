// The CUDA backend: the same function as model_cpu.cpp, fp32, with cuBLAS
// for the linear layers (pedantic math: no TF32, no reduced precision) and
// small kernels for the rest. Weights come from the same seeded host
// Weights; the paged KV cache is one device array per layer for K and V.
// Every call is synchronous on the default stream. An MoE layer routes on
// the device: a router kernel scores and picks each row's top k and counts
// them per expert with atomics into device counters (read back only by
// TakeExpertCounts()); one block per (row, choice) then runs that expert's
// SwiGLU on the row (dispatch), and a combine kernel adds each row's k
// weighted outputs in the CPU's order.
//
// Compiled by nvcc -std=c++17 through a custom target (engine/meson.build).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"

namespace tokenmeter::engine {
namespace {

constexpr int kThreads = 128;  // multiple of 32 and of every head_dim

std::string CudaError(const char* what, cudaError_t e) {
  return std::string("CUDA ") + what + ": " + cudaGetErrorString(e);
}

#define TM_CUDA_TRY(expr)                                                  \
  do {                                                                     \
    const cudaError_t tm_e = (expr);                                       \
    if (tm_e != cudaSuccess) return Status::Error(CudaError(#expr, tm_e)); \
  } while (0)

#define TM_RETURN_IF_ERROR(expr)   \
  do {                             \
    Status tm_st = (expr);         \
    if (!tm_st.ok()) return tm_st; \
  } while (0)

#define TM_CUBLAS_TRY(expr)                                        \
  do {                                                             \
    const cublasStatus_t tm_s = (expr);                            \
    if (tm_s != CUBLAS_STATUS_SUCCESS) {                           \
      return Status::Error(std::string("cuBLAS ") + #expr + ": " + \
                           cublasGetStatusString(tm_s));           \
    }                                                              \
  } while (0)

// Sum over the block; every thread gets the total. `red` holds 32 floats.
__device__ float BlockSum(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0;
  const int warps = int(blockDim.x + 31) / 32;
  for (int w = 0; w < warps; ++w) total += red[w];
  return total;
}

__device__ float BlockMax(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = -INFINITY;
  const int warps = int(blockDim.x + 31) / 32;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, red[w]);
  return m;
}

__global__ void EmbedKernel(const int32_t* tokens, const float* embed, float* x,
                            int d) {
  const size_t t = blockIdx.x;
  const float* src = embed + size_t(tokens[t]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) x[t * d + i] = src[i];
}

// out[r] = x[rows ? rows[r] : r] / rms * gain
__global__ void RmsNormKernel(const float* x, const int32_t* rows,
                              const float* gain, float* out, int d, float eps) {
  __shared__ float red[32];
  const size_t r = blockIdx.x;
  const float* xr = x + size_t(rows != nullptr ? rows[r] : int32_t(r)) * d;
  float ss = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    out[r * d + i] = xr[i] * inv * gain[i];
  }
}

__global__ void RopeKernel(float* q, float* k, const int32_t* pos,
                           const float* cos_tab, const float* sin_tab,
                           int n_heads, int head_dim) {
  const size_t t = blockIdx.x;
  const int half = head_dim / 2;
  const size_t d = size_t(n_heads) * head_dim;
  const float* cs = cos_tab + size_t(pos[t]) * half;
  const float* sn = sin_tab + size_t(pos[t]) * half;
  for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const size_t o = t * d + size_t(h) * head_dim + 2 * i;
    const float qa = q[o], qb = q[o + 1];
    q[o] = qa * cs[i] - qb * sn[i];
    q[o + 1] = qa * sn[i] + qb * cs[i];
    const float ka = k[o], kb = k[o + 1];
    k[o] = ka * cs[i] - kb * sn[i];
    k[o + 1] = ka * sn[i] + kb * cs[i];
  }
}

__global__ void KvWriteKernel(const float* k, const float* v,
                              const int32_t* slots, float* kc, float* vc,
                              int d) {
  const size_t t = blockIdx.x;
  const size_t dst = size_t(slots[t]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    kc[dst + i] = k[t * d + i];
    vc[dst + i] = v[t * d + i];
  }
}

// One block per (row, head): causal attention over positions 0..pos of the
// row's sequence, through its block table. Shared memory: `ctx` scores then
// kThreads partial sums.
__global__ void AttentionKernel(const float* q, const float* kc,
                                const float* vc, const int32_t* pos,
                                const int32_t* seq_of,
                                const int32_t* block_tables, int max_blocks,
                                int block_size, int d, int head_dim, int ctx,
                                float scale, float* out) {
  extern __shared__ float smem[];
  float* scores = smem;
  float* partial = smem + ctx;
  __shared__ float qs[128];
  __shared__ float red[32];
  const size_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int p = pos[t];
  const int32_t* bt = block_tables + size_t(seq_of[t]) * max_blocks;
  const size_t hoff = size_t(h) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    qs[i] = q[t * d + hoff + i];
  }
  __syncthreads();

  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= p; j += blockDim.x) {
    const size_t slot =
        size_t(bt[j / block_size]) * block_size + j % block_size;
    const float* kh = kc + slot * d + hoff;
    float s = 0;
    for (int i = 0; i < head_dim; ++i) s += qs[i] * kh[i];
    s *= scale;
    scores[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = BlockMax(mx, red);
  float sum = 0;
  for (int j = threadIdx.x; j <= p; j += blockDim.x) {
    const float e = expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = BlockSum(sum, red);  // also makes every score visible

  const int slices = int(blockDim.x) / head_dim;
  const int dim = int(threadIdx.x) % head_dim;
  const int slice = int(threadIdx.x) / head_dim;
  float acc = 0;
  for (int j = slice; j <= p; j += slices) {
    const size_t slot =
        size_t(bt[j / block_size]) * block_size + j % block_size;
    acc += scores[j] * vc[slot * d + hoff + dim];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  if (int(threadIdx.x) < head_dim) {
    float total = 0;
    for (int s = 0; s < slices; ++s) total += partial[s * head_dim + dim];
    out[t * d + hoff + dim] = total * (1.0f / sum);
  }
}

// u[r] = scale[slot] * h[r] A[slot], A being d x rank at `a_off` of the
// slot's adapter; one block per row, rows with slot -1 skip. Each thread
// sums a slice of the d inputs for one rank column; `partial` holds them.
__global__ void LoraShrinkKernel(const float* h, const int32_t* row_slot,
                                 const float* lora_w, size_t adapter_floats,
                                 size_t a_off, const float* scale, int d,
                                 int rank, float* u) {
  __shared__ float partial[kThreads];
  const size_t r = blockIdx.x;
  const int s = row_slot[r];
  if (s < 0) return;  // the whole block
  const float* a = lora_w + size_t(s) * adapter_floats + a_off;
  const float* hr = h + r * d;
  const int slices = int(blockDim.x) / rank;
  const int k = int(threadIdx.x) % rank, slice = int(threadIdx.x) / rank;
  float acc = 0;
  if (slice < slices) {
    for (int i = slice; i < d; i += slices)
      acc += hr[i] * a[size_t(i) * rank + k];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  if (int(threadIdx.x) < rank) {
    float total = 0;
    for (int sl = 0; sl < slices; ++sl) total += partial[sl * rank + k];
    u[r * rank + k] = total * scale[s];
  }
}

// y[r] += u[r] B[slot], B being rank x d at `b_off`; one block per row.
__global__ void LoraExpandKernel(const float* u, const int32_t* row_slot,
                                 const float* lora_w, size_t adapter_floats,
                                 size_t b_off, int d, int rank, float* y) {
  __shared__ float us[kMaxLoraRank];
  const size_t r = blockIdx.x;
  const int s = row_slot[r];
  if (s < 0) return;
  const float* b = lora_w + size_t(s) * adapter_floats + b_off;
  for (int k = threadIdx.x; k < rank; k += blockDim.x) us[k] = u[r * rank + k];
  __syncthreads();
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0;
    for (int k = 0; k < rank; ++k) acc += us[k] * b[size_t(k) * d + j];
    y[r * d + j] += acc;
  }
}

__global__ void SiluMulKernel(float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = a[i];
    a[i] = x / (1.0f + expf(-x)) * b[i];
  }
}

// One block per row: router scores s_e = h . router[:, e] + bias_e (summed
// in the CPU's order, without fused multiply-adds), the top k (highest
// first, ties to the lower expert, as on the CPU), their softmax weights,
// the margin, and one atomic add per choice to counts[expert] (skipped
// when counts is null). Dynamic shared memory: d + E floats.
__global__ void MoeRouterKernel(const float* h, const float* router,
                                const float* bias, int d, int n_experts,
                                int top_k, unsigned long long* counts,
                                int32_t* sel, float* wt, float* margin) {
  extern __shared__ float smem[];
  float* hs = smem;
  float* scores = smem + d;
  const size_t r = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) hs[i] = h[r * d + i];
  __syncthreads();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    float acc = 0;
    for (int i = 0; i < d; ++i) {
      acc = __fadd_rn(acc, __fmul_rn(hs[i], router[size_t(i) * n_experts + e]));
    }
    scores[e] = __fadd_rn(acc, bias[e]);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int best[kMaxMoeTopK + 1];
  float best_s[kMaxMoeTopK + 1];
  int have = 0;
  const int keep = top_k + 1 < n_experts ? top_k + 1 : n_experts;
  for (int e = 0; e < n_experts; ++e) {
    const float v = scores[e];
    if (have == keep && !(v > best_s[have - 1])) continue;
    int i = have < keep ? have++ : have - 1;
    for (; i > 0 && v > best_s[i - 1]; --i) {
      best[i] = best[i - 1];
      best_s[i] = best_s[i - 1];
    }
    best[i] = e;
    best_s[i] = v;
  }
  margin[r] = keep > top_k ? best_s[top_k - 1] - best_s[top_k] : INFINITY;
  float sum = 0;
  float w[kMaxMoeTopK];
  for (int i = 0; i < top_k; ++i) {
    w[i] = expf(best_s[i] - best_s[0]);
    sum += w[i];
  }
  for (int i = 0; i < top_k; ++i) {
    wt[r * top_k + i] = w[i] / sum;
    sel[r * top_k + i] = best[i];
    if (counts != nullptr) atomicAdd(&counts[best[i]], 1ull);
  }
}

// Dispatch: one block per assignment a = row * k + i, running expert
// sel[a]'s SwiGLU on h[row] into out[a]. Dynamic shared memory: d + f
// floats (the row, then the activations).
__global__ void MoeExpertKernel(const float* h, const int32_t* sel,
                                const float* gate, const float* up,
                                const float* down, int d, int f, int top_k,
                                float* out) {
  extern __shared__ float smem[];
  float* hs = smem;
  float* act = smem + d;
  const size_t a = blockIdx.x, r = a / size_t(top_k);
  const size_t off = size_t(sel[a]) * size_t(d) * size_t(f);
  const float* g = gate + off;
  const float* u = up + off;
  const float* dn = down + off;
  for (int i = threadIdx.x; i < d; i += blockDim.x) hs[i] = h[r * d + i];
  __syncthreads();
  for (int j = threadIdx.x; j < f; j += blockDim.x) {
    float ga = 0, ub = 0;
    for (int i = 0; i < d; ++i) {
      ga += hs[i] * g[size_t(i) * f + j];
      ub += hs[i] * u[size_t(i) * f + j];
    }
    act[j] = ga / (1.0f + expf(-ga)) * ub;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float y = 0;
    for (int i = 0; i < f; ++i) y += act[i] * dn[size_t(i) * d + j];
    out[a * d + j] = y;
  }
}

// Combine: x[row] += sum over i of wt[row, i] * out[row * k + i], added
// in order i = 0..k-1 (highest score first), as on the CPU.
__global__ void MoeCombineKernel(float* x, const float* out, const float* wt,
                                 int d, int top_k) {
  const size_t r = blockIdx.x;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = x[r * d + j];
    for (int i = 0; i < top_k; ++i) {
      acc += wt[r * top_k + i] * out[(r * top_k + i) * d + j];
    }
    x[r * d + j] = acc;
  }
}

// A growable device array.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  Status Reserve(size_t n) {
    if (n <= cap_) return Status::Ok();
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
    TM_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
    cap_ = n;
    return Status::Ok();
  }
  Status Upload(const T* host, size_t n) {
    TM_RETURN_IF_ERROR(Reserve(n));
    TM_CUDA_TRY(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice));
    return Status::Ok();
  }
  Status Upload(const std::vector<T>& host) {
    return Upload(host.data(), host.size());
  }
  // Frees the memory now (sleep mode); Reserve() allocates it again.
  void Free() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    cap_ = 0;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t cap_ = 0;
};

struct DeviceLayer {
  DeviceArray<float> attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  DeviceArray<float> router, router_bias, e_gate, e_up, e_down;  // MoE
  DeviceArray<float> k_cache, v_cache;
};

class CudaModel final : public Model {
 public:
  CudaModel(const ModelConfig& c, const KvLayout& kv, const LoraLayout& lora)
      : config_(c),
        kv_(kv),
        lora_(lora),
        lora_floats_(LoraAdapterFloats(c, lora.rank)),
        layers_(c.n_layers) {}
  ~CudaModel() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  Status Init(const Weights& w) {
    TM_CUBLAS_TRY(cublasCreate(&cublas_));
    TM_CUBLAS_TRY(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
    TM_RETURN_IF_ERROR(embed_.Upload(w.embed));
    TM_RETURN_IF_ERROR(final_norm_.Upload(w.final_norm));
    TM_RETURN_IF_ERROR(lm_head_.Upload(w.lm_head));
    TM_RETURN_IF_ERROR(rope_cos_.Upload(w.rope_cos));
    TM_RETURN_IF_ERROR(rope_sin_.Upload(w.rope_sin));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerWeights& hw = w.layers[l];
      DeviceLayer& dl = layers_[l];
      TM_RETURN_IF_ERROR(dl.attn_norm.Upload(hw.attn_norm));
      TM_RETURN_IF_ERROR(dl.wq.Upload(hw.wq));
      TM_RETURN_IF_ERROR(dl.wk.Upload(hw.wk));
      TM_RETURN_IF_ERROR(dl.wv.Upload(hw.wv));
      TM_RETURN_IF_ERROR(dl.wo.Upload(hw.wo));
      TM_RETURN_IF_ERROR(dl.mlp_norm.Upload(hw.mlp_norm));
      if (config_.moe_experts > 0) {
        TM_RETURN_IF_ERROR(dl.router.Upload(hw.router));
        TM_RETURN_IF_ERROR(dl.router_bias.Upload(hw.router_bias));
        TM_RETURN_IF_ERROR(dl.e_gate.Upload(hw.e_gate));
        TM_RETURN_IF_ERROR(dl.e_up.Upload(hw.e_up));
        TM_RETURN_IF_ERROR(dl.e_down.Upload(hw.e_down));
      } else {
        TM_RETURN_IF_ERROR(dl.w_gate.Upload(hw.w_gate));
        TM_RETURN_IF_ERROR(dl.w_up.Upload(hw.w_up));
        TM_RETURN_IF_ERROR(dl.w_down.Upload(hw.w_down));
      }
    }
    TM_RETURN_IF_ERROR(AllocateKvCache());
    if (config_.moe_experts > 0) {
      const size_t n = size_t(config_.n_layers) * config_.moe_experts;
      TM_RETURN_IF_ERROR(expert_counts_.Reserve(n));
      TM_CUDA_TRY(
          cudaMemset(expert_counts_.get(), 0, n * sizeof(unsigned long long)));
      counts_h_.resize(n);
    }
    if (lora_.slots > 0) {
      // Zeroed: a slot never loaded adds nothing, as on the CPU.
      const size_t n = size_t(lora_.slots) * lora_floats_;
      TM_RETURN_IF_ERROR(lora_w_.Reserve(n));
      TM_CUDA_TRY(cudaMemset(lora_w_.get(), 0, n * sizeof(float)));
      TM_RETURN_IF_ERROR(lora_scale_.Reserve(lora_.slots));
      TM_CUDA_TRY(
          cudaMemset(lora_scale_.get(), 0, lora_.slots * sizeof(float)));
    }
    return Status::Ok();
  }

  Status LoadLora(uint32_t slot, const LoraAdapter& a) override {
    if (slot >= lora_.slots) return Status::Error("LoRA slot out of range");
    if (a.rank != lora_.rank || a.weights.size() != lora_floats_) {
      return Status::Error("LoRA adapter does not match the slots' rank");
    }
    TM_CUDA_TRY(cudaMemcpy(lora_w_.get() + size_t(slot) * lora_floats_,
                           a.weights.data(), lora_floats_ * sizeof(float),
                           cudaMemcpyHostToDevice));
    TM_CUDA_TRY(cudaMemcpy(lora_scale_.get() + slot, &a.scale, sizeof(float),
                           cudaMemcpyHostToDevice));
    return Status::Ok();
  }

  const char* backend() const override { return "cuda"; }
  const ModelConfig& config() const override { return config_; }

  Status ReadKvBlocks(const int32_t* blocks, size_t n, float* dst) override {
    if (!kv_resident_) return Status::Error("the KV cache is released");
    const size_t span = size_t(kv_.block_size) * config_.d_model;
    for (size_t i = 0; i < n; ++i) {
      for (const DeviceLayer& dl : layers_) {
        const size_t at = KvSpanOffset(blocks[i]);
        TM_CUDA_TRY(cudaMemcpy(dst, dl.k_cache.get() + at, span * sizeof(float),
                               cudaMemcpyDeviceToHost));
        TM_CUDA_TRY(cudaMemcpy(dst + span, dl.v_cache.get() + at,
                               span * sizeof(float), cudaMemcpyDeviceToHost));
        dst += 2 * span;
      }
    }
    return Status::Ok();
  }
  Status WriteKvBlocks(const int32_t* blocks, size_t n,
                       const float* src) override {
    if (!kv_resident_) return Status::Error("the KV cache is released");
    const size_t span = size_t(kv_.block_size) * config_.d_model;
    for (size_t i = 0; i < n; ++i) {
      for (const DeviceLayer& dl : layers_) {
        const size_t at = KvSpanOffset(blocks[i]);
        TM_CUDA_TRY(cudaMemcpy(dl.k_cache.get() + at, src, span * sizeof(float),
                               cudaMemcpyHostToDevice));
        TM_CUDA_TRY(cudaMemcpy(dl.v_cache.get() + at, src + span,
                               span * sizeof(float), cudaMemcpyHostToDevice));
        src += 2 * span;
      }
    }
    return Status::Ok();
  }
  Status ReleaseKvCache() override {
    TM_CUDA_TRY(cudaDeviceSynchronize());
    for (DeviceLayer& dl : layers_) {
      dl.k_cache.Free();
      dl.v_cache.Free();
    }
    kv_resident_ = false;
    return Status::Ok();
  }
  Status RestoreKvCache() override {
    if (kv_resident_) return Status::Ok();
    TM_RETURN_IF_ERROR(AllocateKvCache());
    kv_resident_ = true;
    return Status::Ok();
  }
  bool kv_cache_resident() const override { return kv_resident_; }

  void SetExpertCounting(bool on) override { count_experts_ = on; }

  Status TakeExpertCounts(uint64_t* counts) override {
    if (config_.moe_experts == 0) return Status::Ok();
    const size_t n = counts_h_.size();
    TM_CUDA_TRY(cudaMemcpy(counts_h_.data(), expert_counts_.get(),
                           n * sizeof(unsigned long long),
                           cudaMemcpyDeviceToHost));
    TM_CUDA_TRY(
        cudaMemset(expert_counts_.get(), 0, n * sizeof(unsigned long long)));
    for (size_t i = 0; i < n; ++i) counts[i] = uint64_t(counts_h_[i]);
    return Status::Ok();
  }

  Status LastRouting(std::vector<int32_t>* experts,
                     std::vector<float>* margin) override {
    experts->clear();
    margin->clear();
    if (config_.moe_experts == 0 || last_rows_ == 0) return Status::Ok();
    const size_t k = config_.moe_top_k, layers = config_.n_layers;
    experts->resize(layers * last_rows_ * k);
    margin->resize(layers * last_rows_);
    TM_CUDA_TRY(cudaMemcpy(experts->data(), moe_sel_.get(),
                           experts->size() * sizeof(int32_t),
                           cudaMemcpyDeviceToHost));
    TM_CUDA_TRY(cudaMemcpy(margin->data(), moe_margin_.get(),
                           margin->size() * sizeof(float),
                           cudaMemcpyDeviceToHost));
    return Status::Ok();
  }

  Status Forward(const std::vector<SeqChunk>& chunks, float* logits) override {
    const ModelConfig& c = config_;
    if (!kv_resident_) return Status::Error("the KV cache is released");
    const int d = int(c.d_model), ff = int(c.d_ff), hd = int(c.head_dim());
    // Host-side step description.
    int max_blocks = 1;
    size_t rows = 0;
    for (const SeqChunk& ch : chunks) {
      rows += ch.num_tokens;
      if (int(ch.num_blocks) > max_blocks) max_blocks = int(ch.num_blocks);
    }
    if (rows == 0) return Status::Ok();
    tokens_h_.clear();
    pos_h_.clear();
    seq_h_.clear();
    slots_h_.clear();
    logit_rows_h_.clear();
    lora_rows_h_.clear();
    bool any_lora = false;
    tables_h_.assign(chunks.size() * size_t(max_blocks), 0);
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const SeqChunk& ch = chunks[ci];
      if (ch.lora_slot < -1 || ch.lora_slot >= int32_t(lora_.slots)) {
        return Status::Error("chunk with a LoRA slot out of range");
      }
      any_lora |= ch.lora_slot >= 0;
      for (uint32_t b = 0; b < ch.num_blocks; ++b) {
        tables_h_[ci * size_t(max_blocks) + b] = ch.block_table[b];
      }
      for (uint32_t k = 0; k < ch.num_tokens; ++k) {
        const uint32_t p = ch.start_pos + k;
        if (p >= c.max_context || p / kv_.block_size >= ch.num_blocks) {
          return Status::Error("chunk outside its block table or context");
        }
        tokens_h_.push_back(ch.tokens[k]);
        pos_h_.push_back(int32_t(p));
        seq_h_.push_back(int32_t(ci));
        slots_h_.push_back(ch.block_table[p / kv_.block_size] *
                               int32_t(kv_.block_size) +
                           int32_t(p % kv_.block_size));
      }
      if (ch.want_logits) logit_rows_h_.push_back(int32_t(pos_h_.size() - 1));
    }
    const size_t n_logits = logit_rows_h_.size();
    if (any_lora) {
      for (const SeqChunk& ch : chunks) {
        lora_rows_h_.insert(lora_rows_h_.end(), ch.num_tokens, ch.lora_slot);
      }
      TM_RETURN_IF_ERROR(lora_rows_.Upload(lora_rows_h_));
      TM_RETURN_IF_ERROR(lora_u_.Reserve(rows * lora_.rank));
    }

    TM_RETURN_IF_ERROR(tokens_.Upload(tokens_h_));
    TM_RETURN_IF_ERROR(pos_.Upload(pos_h_));
    TM_RETURN_IF_ERROR(seq_.Upload(seq_h_));
    TM_RETURN_IF_ERROR(slots_.Upload(slots_h_));
    TM_RETURN_IF_ERROR(tables_.Upload(tables_h_));
    if (n_logits > 0) TM_RETURN_IF_ERROR(logit_rows_.Upload(logit_rows_h_));
    for (auto* a : {&x_, &h_, &q_, &k_, &v_, &att_}) {
      TM_RETURN_IF_ERROR(a->Reserve(rows * d));
    }
    TM_RETURN_IF_ERROR(a_.Reserve(rows * ff));
    TM_RETURN_IF_ERROR(b_.Reserve(rows * ff));
    const size_t top_k = c.moe_top_k;
    if (c.moe_experts > 0) {
      // The routing of every layer is kept (packed by this step's rows)
      // for LastRouting().
      TM_RETURN_IF_ERROR(moe_sel_.Reserve(c.n_layers * rows * top_k));
      TM_RETURN_IF_ERROR(moe_margin_.Reserve(c.n_layers * rows));
      TM_RETURN_IF_ERROR(moe_wt_.Reserve(rows * top_k));
      TM_RETURN_IF_ERROR(moe_out_.Reserve(rows * top_k * d));
    }
    const size_t out_rows = n_logits > 0 ? n_logits : 1;
    TM_RETURN_IF_ERROR(final_h_.Reserve(out_rows * d));
    TM_RETURN_IF_ERROR(logits_.Reserve(out_rows * c.vocab));

    const unsigned grid_rows = unsigned(rows);
    EmbedKernel<<<grid_rows, kThreads>>>(tokens_.get(), embed_.get(), x_.get(),
                                         d);
    const float scale = 1.0f / std::sqrt(float(hd));
    const int ctx = int(c.max_context);
    const size_t att_smem = (size_t(ctx) + kThreads) * sizeof(float);
    if (!attention_smem_set_ && att_smem > 48 * 1024) {
      TM_CUDA_TRY(cudaFuncSetAttribute(
          AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
          int(att_smem)));
    }
    attention_smem_set_ = true;
    for (size_t li = 0; li < layers_.size(); ++li) {
      DeviceLayer& l = layers_[li];
      RmsNormKernel<<<grid_rows, kThreads>>>(
          x_.get(), nullptr, l.attn_norm.get(), h_.get(), d, c.norm_eps);
      TM_RETURN_IF_ERROR(
          Gemm(h_.get(), rows, d, l.wq.get(), d, q_.get(), false));
      TM_RETURN_IF_ERROR(
          Gemm(h_.get(), rows, d, l.wk.get(), d, k_.get(), false));
      TM_RETURN_IF_ERROR(
          Gemm(h_.get(), rows, d, l.wv.get(), d, v_.get(), false));
      if (any_lora) ApplyLora(grid_rows, li);
      RopeKernel<<<grid_rows, kThreads>>>(q_.get(), k_.get(), pos_.get(),
                                          rope_cos_.get(), rope_sin_.get(),
                                          int(c.n_heads), hd);
      KvWriteKernel<<<grid_rows, kThreads>>>(k_.get(), v_.get(), slots_.get(),
                                             l.k_cache.get(), l.v_cache.get(),
                                             d);
      AttentionKernel<<<dim3(grid_rows, c.n_heads), kThreads, att_smem>>>(
          q_.get(), l.k_cache.get(), l.v_cache.get(), pos_.get(), seq_.get(),
          tables_.get(), max_blocks, int(kv_.block_size), d, hd, ctx, scale,
          att_.get());
      TM_RETURN_IF_ERROR(
          Gemm(att_.get(), rows, d, l.wo.get(), d, x_.get(), true));
      RmsNormKernel<<<grid_rows, kThreads>>>(
          x_.get(), nullptr, l.mlp_norm.get(), h_.get(), d, c.norm_eps);
      if (c.moe_experts > 0) {
        MoeMlp(grid_rows, li);
        continue;
      }
      TM_RETURN_IF_ERROR(
          Gemm(h_.get(), rows, d, l.w_gate.get(), ff, a_.get(), false));
      TM_RETURN_IF_ERROR(
          Gemm(h_.get(), rows, d, l.w_up.get(), ff, b_.get(), false));
      const size_t n = rows * size_t(ff);
      const unsigned blocks =
          unsigned((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
      SiluMulKernel<<<blocks, 256>>>(a_.get(), b_.get(), n);
      TM_RETURN_IF_ERROR(
          Gemm(a_.get(), rows, ff, l.w_down.get(), d, x_.get(), true));
    }
    TM_CUDA_TRY(cudaGetLastError());
    last_rows_ = rows;
    if (n_logits > 0) {
      RmsNormKernel<<<unsigned(n_logits), kThreads>>>(
          x_.get(), logit_rows_.get(), final_norm_.get(), final_h_.get(), d,
          c.norm_eps);
      TM_RETURN_IF_ERROR(Gemm(final_h_.get(), n_logits, d, lm_head_.get(),
                              int(c.vocab), logits_.get(), false));
      TM_CUDA_TRY(cudaMemcpy(logits, logits_.get(),
                             n_logits * c.vocab * sizeof(float),
                             cudaMemcpyDeviceToHost));
    }
    TM_CUDA_TRY(cudaDeviceSynchronize());
    return Status::Ok();
  }

 private:
  // Every layer's K and V cache, zeroed.
  Status AllocateKvCache() {
    const size_t n = size_t(kv_.num_blocks) * kv_.block_size * config_.d_model;
    for (DeviceLayer& dl : layers_) {
      TM_RETURN_IF_ERROR(dl.k_cache.Reserve(n));
      TM_RETURN_IF_ERROR(dl.v_cache.Reserve(n));
      TM_CUDA_TRY(cudaMemset(dl.k_cache.get(), 0, n * sizeof(float)));
      TM_CUDA_TRY(cudaMemset(dl.v_cache.get(), 0, n * sizeof(float)));
    }
    return Status::Ok();
  }
  // The first float of block b's span in one layer's K (or V) cache.
  size_t KvSpanOffset(int32_t b) const {
    if (b < 0 || uint32_t(b) >= kv_.num_blocks) std::abort();
    return size_t(b) * kv_.block_size * config_.d_model;
  }

  // q_ and v_ += the adapter deltas of layer l for the rows of h_ that have
  // a slot (lora_rows_).
  void ApplyLora(unsigned grid_rows, size_t l) {
    const int d = int(config_.d_model), rank = int(lora_.rank);
    const LoraOffsets o = LoraLayerOffsets(config_, lora_.rank, uint32_t(l));
    const std::pair<size_t, size_t> ab[] = {{o.a_q, o.b_q}, {o.a_v, o.b_v}};
    float* ys[] = {q_.get(), v_.get()};
    for (int p = 0; p < 2; ++p) {
      LoraShrinkKernel<<<grid_rows, kThreads>>>(
          h_.get(), lora_rows_.get(), lora_w_.get(), lora_floats_, ab[p].first,
          lora_scale_.get(), d, rank, lora_u_.get());
      LoraExpandKernel<<<grid_rows, kThreads>>>(lora_u_.get(), lora_rows_.get(),
                                                lora_w_.get(), lora_floats_,
                                                ab[p].second, d, rank, ys[p]);
    }
  }

  // x_ += the mixture of experts of layer l over h_: route and count,
  // dispatch, combine (kernels above).
  void MoeMlp(unsigned grid_rows, size_t l) {
    const int d = int(config_.d_model), e = int(config_.moe_experts);
    const int k = int(config_.moe_top_k), f = int(config_.moe_d_ff());
    const size_t rows = grid_rows;
    DeviceLayer& dl = layers_[l];
    unsigned long long* counts =
        count_experts_ ? expert_counts_.get() + l * size_t(e) : nullptr;
    MoeRouterKernel<<<grid_rows, kThreads, size_t(d + e) * sizeof(float)>>>(
        h_.get(), dl.router.get(), dl.router_bias.get(), d, e, k, counts,
        moe_sel_.get() + l * rows * k, moe_wt_.get(),
        moe_margin_.get() + l * rows);
    MoeExpertKernel<<<unsigned(rows * k), kThreads,
                      size_t(d + f) * sizeof(float)>>>(
        h_.get(), moe_sel_.get() + l * rows * k, dl.e_gate.get(), dl.e_up.get(),
        dl.e_down.get(), d, f, k, moe_out_.get());
    MoeCombineKernel<<<grid_rows, kThreads>>>(x_.get(), moe_out_.get(),
                                              moe_wt_.get(), d, k);
  }

  // y[rows x out] (+)= x[rows x in] * w[in x out], all row-major: in
  // cuBLAS's column-major terms y^T = w^T * x^T.
  Status Gemm(const float* x, size_t rows, int in, const float* w, int out,
              float* y, bool accumulate) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    TM_CUBLAS_TRY(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, out, int(rows),
                              in, &alpha, w, out, x, in, &beta, y, out));
    return Status::Ok();
  }

  const ModelConfig config_;
  const KvLayout kv_;
  const LoraLayout lora_;
  const size_t lora_floats_;  // one adapter
  cublasHandle_t cublas_ = nullptr;
  bool attention_smem_set_ = false;
  bool kv_resident_ = true;  // false: released (sleep)
  DeviceArray<float> embed_, final_norm_, lm_head_, rope_cos_, rope_sin_;
  std::vector<DeviceLayer> layers_;
  DeviceArray<float> lora_w_;      // [adapter slot][LoraAdapter weights]
  DeviceArray<float> lora_scale_;  // per adapter slot
  // Per-step inputs and activations, grown as needed.
  std::vector<int32_t> tokens_h_, pos_h_, seq_h_, slots_h_, tables_h_,
      logit_rows_h_, lora_rows_h_;
  DeviceArray<int32_t> tokens_, pos_, seq_, slots_, tables_, logit_rows_,
      lora_rows_;
  DeviceArray<float> x_, h_, q_, k_, v_, att_, a_, b_, final_h_, logits_,
      lora_u_;
  // MoE: counters [layer][expert] on the device (and a host copy for
  // TakeExpertCounts()), the last step's routing [layer][row][i] and
  // margins [layer][row], one layer's weights [row][i] and outputs
  // [row][i][d].
  bool count_experts_ = true;
  size_t last_rows_ = 0;
  DeviceArray<unsigned long long> expert_counts_;
  std::vector<unsigned long long> counts_h_;
  DeviceArray<int32_t> moe_sel_;
  DeviceArray<float> moe_margin_, moe_wt_, moe_out_;
};

}  // namespace

bool CudaBuilt() { return true; }

bool CudaDeviceAvailable(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = CudaError("cudaGetDeviceCount", e);
    cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  if (n == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

Status MakeCudaModel(const Weights& weights, const KvLayout& kv,
                     const LoraLayout& lora, std::unique_ptr<Model>* out) {
  std::string why;
  if (!CudaDeviceAvailable(&why)) return Status::Error(why);
  if (size_t(kv.num_blocks) * kv.block_size > size_t(INT32_MAX)) {
    return Status::Error("KV cache too large for 32-bit slot numbers");
  }
  if (lora.slots > 0 && (lora.rank < 1 || lora.rank > kMaxLoraRank)) {
    return Status::Error("LoRA rank must be 1.." +
                         std::to_string(kMaxLoraRank));
  }
  auto m = std::make_unique<CudaModel>(weights.config, kv, lora);
  TM_RETURN_IF_ERROR(m->Init(weights));
  *out = std::move(m);
  return Status::Ok();
}

}  // namespace tokenmeter::engine
