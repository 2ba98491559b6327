// The model: a small decoder-only transformer (Llama-style: RMSNorm, RoPE,
// multi-head attention over a paged KV cache, SwiGLU MLP, untied LM head)
// with seeded random weights, in fp32. Two backends compute the same
// function: a plain C++ CPU path and CUDA kernels with cuBLAS. Both can
// hold LoRA adapters (on the q and v projections) in a fixed number of
// slots and apply a chunk's adapter to its rows. With moe_experts > 0
// every layer's MLP is a mixture of experts instead (see MoE below), and
// both backends count the tokens each layer routes to each expert.
//
// C++17-clean: model_cuda.cu includes it through nvcc -std=c++17.
#ifndef TOKENMETER_ENGINE_MODEL_H_
#define TOKENMETER_ENGINE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"

namespace tokenmeter::engine {

struct ModelConfig {
  std::string size = "tiny";
  uint32_t vocab = 256;
  uint32_t d_model = 64;
  uint32_t n_layers = 2;
  uint32_t n_heads = 4;  // head_dim = d_model / n_heads, one of 16/32/64/128
  uint32_t d_ff = 192;
  uint32_t max_context = 2048;  // positions (RoPE table length)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  uint64_t seed = 1;
  // Mixture of experts (0: the dense SwiGLU MLP). Every layer's MLP
  // becomes moe_experts SwiGLU experts of hidden size moe_d_ff() behind a
  // linear router (d_model x moe_experts, plus a per-expert bias, as a
  // trained router's uneven preferences): each token goes to the
  // moe_top_k experts with the highest router scores (ties to the lower
  // expert number), and its output is their outputs weighted by the
  // softmax of those k scores (Mixtral's renormalized top-k).
  uint32_t moe_experts = 0;  // 0, or moe_top_k..kMaxMoeExperts
  uint32_t moe_top_k = 2;    // 1..kMaxMoeTopK
  uint32_t head_dim() const { return d_model / n_heads; }
  // Each expert's hidden size: d_ff / moe_top_k (at least 1), so that a
  // token costs about as many FLOPs as in the dense MLP.
  uint32_t moe_d_ff() const {
    const uint32_t f = d_ff / (moe_top_k > 0 ? moe_top_k : 1);
    return f > 0 ? f : 1;
  }
};

inline constexpr uint32_t kMaxMoeExperts = 1024;  // TM_MAX_MOE_EXPERTS
inline constexpr uint32_t kMaxMoeTopK = 16;
// The cap on the memory of the experts' weights (all layers).
inline constexpr uint64_t kMaxMoeBytes = uint64_t(4) << 30;
// Bytes of the experts' weights and routers of a configuration (0 when
// dense).
uint64_t MoeWeightBytes(const ModelConfig& c);

// The preset sizes, by --model-size name: tiny (CI: 0.14 M parameters),
// small (3.9 M), medium (31 M), large (271 M, for a GPU). Keeps out->seed.
// Returns false for an unknown name.
bool ModelConfigForSize(const std::string& size, ModelConfig* out);
// The preset names, comma-separated, for --help and errors.
const char* ModelSizeNames();

// Geometry of the paged KV cache the backend allocates: for each layer, K
// and V of num_blocks * block_size positions of d_model floats.
struct KvLayout {
  uint32_t num_blocks = 1024;
  uint32_t block_size = 16;
};

// LoRA adapter slots the backend allocates: `slots` adapters of rank
// `rank` can be resident at once (0 slots: no LoRA). Slot memory lives
// where the backend computes (host memory for the CPU, device memory for
// CUDA): slots x LoraAdapterFloats(config, rank) floats.
struct LoraLayout {
  uint32_t slots = 0;
  uint32_t rank = 0;  // 1..kMaxLoraRank when slots > 0
};
inline constexpr uint32_t kMaxLoraRank = 64;

// One sequence's share of a step: its next `num_tokens` tokens, at positions
// start_pos .. start_pos + num_tokens - 1. K/V of positions < start_pos are
// already in the cache, in the blocks of `block_table` (which covers every
// position up to start_pos + num_tokens - 1).
struct SeqChunk {
  const int32_t* tokens = nullptr;
  uint32_t num_tokens = 0;
  uint32_t start_pos = 0;
  const int32_t* block_table = nullptr;
  uint32_t num_blocks = 0;
  bool want_logits = false;  // logits after the chunk's last token
  // The LoRA adapter slot applied to every token of the chunk (loaded with
  // LoadLora()), or -1 for the base model.
  int32_t lora_slot = -1;
};

// A LoRA adapter on the attention's q and v projections: for each layer,
// q += (x A_q) B_q * scale and v += (x A_v) B_v * scale, with x the
// normalized input of the projections and scale = alpha / rank. `weights`
// holds, for each layer in turn, A_q (d x rank), B_q (rank x d), A_v,
// B_v, each row-major [in][out] like the base weights: LoraAdapterFloats()
// floats in all, one contiguous copy into a slot.
struct LoraAdapter {
  uint32_t rank = 0;
  float scale = 1.0f;
  std::vector<float> weights;
};
// Floats of one adapter of rank `rank`: 4 x n_layers x d_model x rank.
size_t LoraAdapterFloats(const ModelConfig& c, uint32_t rank);
// Offsets of layer l's matrices inside LoraAdapter::weights.
struct LoraOffsets {
  size_t a_q, b_q, a_v, b_v;
};
LoraOffsets LoraLayerOffsets(const ModelConfig& c, uint32_t rank, uint32_t l);
// Draws adapter `index` (0-based) of rank `rank` from c.seed and the index:
// A uniform with variance 1/d_model (as the base layers), B with a quarter
// of the base layers' amplitude (variance 1/(16 rank)), alpha = rank (scale
// 1). An adapter then moves q and v by about a quarter of their size.
// O(adapter size).
LoraAdapter MakeLoraAdapter(const ModelConfig& c, uint32_t rank,
                            uint32_t index);

class Model {
 public:
  virtual ~Model() = default;
  // "cpu" or "cuda".
  virtual const char* backend() const = 0;
  virtual const ModelConfig& config() const = 0;
  // Runs every chunk through the model: writes their K/V into the paged
  // cache and, for each chunk with want_logits, `vocab` floats to `logits`
  // (one row per such chunk, in chunk order). Chunks of one step must not
  // write the same cache slot. Synchronous. Fails only for a backend error
  // (CUDA); the cache is then unspecified.
  virtual Status Forward(const std::vector<SeqChunk>& chunks,
                         float* logits) = 0;
  // Copies `adapter` into `slot` (< LoraLayout.slots) of the backend's
  // memory, replacing what the slot held; a host-to-device copy on CUDA.
  // O(adapter size). Synchronous. Fails for a backend error, or a slot or
  // adapter that does not match the model's LoraLayout (an error, not an
  // abort: the adapter may come from outside the engine).
  virtual Status LoadLora(uint32_t slot, const LoraAdapter& adapter) = 0;

  // MoE only (config().moe_experts > 0; otherwise these do nothing).
  //
  // Whether Forward() counts routed tokens (on by default). Off, the
  // router kernel skips its counting entirely (what --expert-load-every 0
  // measures against).
  virtual void SetExpertCounting(bool on) = 0;
  // Writes the tokens each layer's router sent to each expert since the
  // previous call (or since construction) to counts[layer * moe_experts +
  // expert], n_layers x moe_experts entries, and zeroes the backend's
  // counters. Every token a layer processes adds moe_top_k. The counters
  // live where the backend computes: a device-to-host copy and a memset on
  // CUDA. Synchronous. Fails only for a backend error.
  virtual Status TakeExpertCounts(uint64_t* counts) = 0;
  // The routing of the last Forward() (for tests; O(layers x rows x k)):
  // experts[(layer * rows + row) * moe_top_k + i] is row's i-th expert
  // (highest score first), margin[layer * rows + row] the k-th highest
  // router score minus the (k+1)-th (+inf when k == moe_experts): how
  // near the choice was to a tie. Rows in chunk order, as in Forward().
  virtual Status LastRouting(std::vector<int32_t>* experts,
                             std::vector<float>* margin) = 0;

  // The KV cache's bytes, block by block (the disaggregated hand-over,
  // docs/engine.md "Disaggregated prefill and decode"). A block's record
  // is KvBlockBytes() bytes: for each layer in turn, its block_size x
  // d_model K floats, then its V floats (positions in block order). Read
  // copies the records of blocks[0..n) to dst in that order; Write copies
  // them from src into blocks[0..n) (each id < num_blocks; abort
  // otherwise), overwriting every position of those blocks. Synchronous;
  // device-to-host and host-to-device copies on CUDA. Fail for a backend
  // error, or while the cache is released.
  virtual Status ReadKvBlocks(const int32_t* blocks, size_t n, float* dst) = 0;
  virtual Status WriteKvBlocks(const int32_t* blocks, size_t n,
                               const float* src) = 0;
  // Sleep mode: frees the KV cache's memory (host or device), after which
  // Forward() and the block copies fail until RestoreKvCache() allocates
  // it again, zeroed. Weights and adapter slots stay resident. Both are
  // idempotent. O(cache size).
  virtual Status ReleaseKvCache() = 0;
  virtual Status RestoreKvCache() = 0;
  virtual bool kv_cache_resident() const = 0;
};

// Bytes of one KV block's record (Model::ReadKvBlocks): 2 x n_layers x
// block_size x d_model floats.
inline size_t KvBlockBytes(const ModelConfig& c, const KvLayout& kv) {
  return size_t(2) * c.n_layers * kv.block_size * c.d_model * sizeof(float);
}

// The seeded weights (host memory), shared by both backends so that they
// compute the same function.
struct LayerWeights {
  std::vector<float> attn_norm;     // d
  std::vector<float> wq, wk, wv;    // d x d, row-major [in][out]
  std::vector<float> wo;            // d x d
  std::vector<float> mlp_norm;      // d
  std::vector<float> w_gate, w_up;  // d x ff
  std::vector<float> w_down;        // ff x d
  // MoE (config.moe_experts = E > 0; then w_gate, w_up and w_down are
  // empty), with f = moe_d_ff(): expert e's matrices at e * d * f.
  std::vector<float> router;        // d x E
  std::vector<float> router_bias;   // E: some experts are hotter
  std::vector<float> e_gate, e_up;  // E x (d x f)
  std::vector<float> e_down;        // E x (f x d)
};
struct Weights {
  ModelConfig config;
  std::vector<float> embed;  // vocab x d
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // d
  std::vector<float> lm_head;     // d x vocab
  // RoPE tables, max_context x head_dim/2, computed in double.
  std::vector<float> rope_cos, rope_sin;
};

// Checks a configuration (head_dim, sizes, context, MoE sizes and the
// experts' memory) and a KV layout.
Status ValidateModel(const ModelConfig& c, const KvLayout& kv);
// Draws the weights from c.seed. O(parameters) time and memory.
std::unique_ptr<Weights> MakeWeights(const ModelConfig& c);

// The backends. `weights` is only read during construction. Without a
// LoraLayout the model has no adapter slots (every chunk must be base).
std::unique_ptr<Model> MakeCpuModel(const Weights& weights, const KvLayout& kv,
                                    const LoraLayout& lora);
inline std::unique_ptr<Model> MakeCpuModel(const Weights& weights,
                                           const KvLayout& kv) {
  return MakeCpuModel(weights, kv, LoraLayout{});
}
// True when this binary has the CUDA backend.
bool CudaBuilt();
// True when the CUDA runtime answers with at least one device. Any error
// (no driver, no device) means false, with the reason in *why.
bool CudaDeviceAvailable(std::string* why);
// Fails when CUDA is not built, there is no device, or memory runs out.
Status MakeCudaModel(const Weights& weights, const KvLayout& kv,
                     const LoraLayout& lora, std::unique_ptr<Model>* out);
inline Status MakeCudaModel(const Weights& weights, const KvLayout& kv,
                            std::unique_ptr<Model>* out) {
  return MakeCudaModel(weights, kv, LoraLayout{}, out);
}

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_MODEL_H_
