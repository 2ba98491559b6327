// The CPU backend: the model's math in plain C++ loops, fp32, one thread.
// Every row (token) is computed with the same sequence of operations
// whatever the batch around it, so a request's logits do not depend on what
// it was batched with, on chunking, or on prefix-cache reuse. LoRA adapters
// live in host-memory slots; a chunk with a slot adds the adapter's delta to
// its rows' q and v, chunk by chunk, with the same per-row operations. An
// MoE layer routes every row alone (router scores, top k), gathers each
// expert's rows, runs each expert's SwiGLU over its rows with the same
// MatMul, and adds each row's k outputs in its own order (highest score
// first): again the same operations per row whatever the batch.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "engine/model.h"

namespace tokenmeter::engine {
namespace {

// y[T x out] (+)= x[T x in] * w[in x out], row-major. Tiles of four rows
// share each streamed row of w; the inner loop is a plain axpy that the
// compiler vectorizes without reordering any sum.
void MatMul(const float* x, size_t rows, size_t in, const float* w, size_t out,
            float* __restrict y, bool accumulate) {
  constexpr size_t kTile = 4;
  for (size_t t0 = 0; t0 < rows; t0 += kTile) {
    const size_t tn = std::min(kTile, rows - t0);
    if (!accumulate) std::fill(y + t0 * out, y + (t0 + tn) * out, 0.0f);
    for (size_t i = 0; i < in; ++i) {
      const float* __restrict wr = w + i * out;
      for (size_t tt = 0; tt < tn; ++tt) {
        const float a = x[(t0 + tt) * in + i];
        float* __restrict yr = y + (t0 + tt) * out;
        for (size_t j = 0; j < out; ++j) yr[j] += a * wr[j];
      }
    }
  }
}

void RmsNorm(const float* x, const float* gain, size_t d, float eps,
             float* out) {
  float ss = 0;
  for (size_t i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(d) + eps);
  for (size_t i = 0; i < d; ++i) out[i] = x[i] * inv * gain[i];
}

// Rotates pairs (2i, 2i+1) of every head by position-dependent angles.
void Rope(float* v, uint32_t n_heads, uint32_t head_dim, const float* cos_row,
          const float* sin_row) {
  const uint32_t half = head_dim / 2;
  for (uint32_t h = 0; h < n_heads; ++h) {
    float* p = v + size_t(h) * head_dim;
    for (uint32_t i = 0; i < half; ++i) {
      const float a = p[2 * i], b = p[2 * i + 1];
      p[2 * i] = a * cos_row[i] - b * sin_row[i];
      p[2 * i + 1] = a * sin_row[i] + b * cos_row[i];
    }
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

class CpuModel final : public Model {
 public:
  CpuModel(const Weights& w, const KvLayout& kv, const LoraLayout& lora)
      : w_(w),
        kv_(kv),
        lora_(lora),
        lora_floats_(LoraAdapterFloats(w.config, lora.rank)),
        slots_(size_t(kv.num_blocks) * kv.block_size),
        k_cache_(size_t(w.config.n_layers) * slots_ * w.config.d_model),
        v_cache_(k_cache_.size()),
        lora_weights_(size_t(lora.slots) * lora_floats_),
        lora_scale_(lora.slots, 0.0f),
        expert_counts_(size_t(w.config.n_layers) * w.config.moe_experts, 0),
        expert_rows_(w.config.moe_experts + 1, 0) {}

  const char* backend() const override { return "cpu"; }
  const ModelConfig& config() const override { return w_.config; }

  void SetExpertCounting(bool on) override { count_experts_ = on; }

  Status TakeExpertCounts(uint64_t* counts) override {
    std::copy(expert_counts_.begin(), expert_counts_.end(), counts);
    std::fill(expert_counts_.begin(), expert_counts_.end(), 0);
    return Status::Ok();
  }

  Status LastRouting(std::vector<int32_t>* experts,
                     std::vector<float>* margin) override {
    const size_t per_layer = last_rows_ * w_.config.moe_top_k;
    experts->clear();
    margin->clear();
    if (w_.config.moe_experts == 0) return Status::Ok();
    for (uint32_t l = 0; l < w_.config.n_layers; ++l) {
      const size_t base = size_t(l) * moe_sel_stride_;
      experts->insert(experts->end(), moe_sel_.begin() + ptrdiff_t(base),
                      moe_sel_.begin() + ptrdiff_t(base + per_layer));
      const size_t mb = size_t(l) * moe_margin_stride_;
      margin->insert(margin->end(), moe_margin_.begin() + ptrdiff_t(mb),
                     moe_margin_.begin() + ptrdiff_t(mb + last_rows_));
    }
    return Status::Ok();
  }

  Status LoadLora(uint32_t slot, const LoraAdapter& a) override {
    if (slot >= lora_.slots) return Status::Error("LoRA slot out of range");
    if (a.rank != lora_.rank || a.weights.size() != lora_floats_) {
      return Status::Error("LoRA adapter does not match the slots' rank");
    }
    std::copy(a.weights.begin(), a.weights.end(),
              lora_weights_.begin() + ptrdiff_t(slot * lora_floats_));
    lora_scale_[slot] = a.scale;
    return Status::Ok();
  }

  Status ReadKvBlocks(const int32_t* blocks, size_t n, float* dst) override {
    if (!kv_resident_) return Status::Error("the KV cache is released");
    const size_t span = size_t(kv_.block_size) * w_.config.d_model;
    ForEachKvSpan(blocks, n, [&](float* k, float* v) {
      dst = std::copy_n(v, span, std::copy_n(k, span, dst));
    });
    return Status::Ok();
  }
  Status WriteKvBlocks(const int32_t* blocks, size_t n,
                       const float* src) override {
    if (!kv_resident_) return Status::Error("the KV cache is released");
    const size_t span = size_t(kv_.block_size) * w_.config.d_model;
    ForEachKvSpan(blocks, n, [&](float* k, float* v) {
      std::copy_n(src, span, k);
      std::copy_n(src + span, span, v);
      src += 2 * span;
    });
    return Status::Ok();
  }
  Status ReleaseKvCache() override {
    // swap with empty vectors: the memory goes back to the allocator now.
    std::vector<float>().swap(k_cache_);
    std::vector<float>().swap(v_cache_);
    kv_resident_ = false;
    return Status::Ok();
  }
  Status RestoreKvCache() override {
    if (kv_resident_) return Status::Ok();
    k_cache_.assign(size_t(w_.config.n_layers) * slots_ * w_.config.d_model,
                    0.0f);
    v_cache_.assign(k_cache_.size(), 0.0f);
    kv_resident_ = true;
    return Status::Ok();
  }
  bool kv_cache_resident() const override { return kv_resident_; }

  Status Forward(const std::vector<SeqChunk>& chunks, float* logits) override {
    const ModelConfig& c = w_.config;
    const size_t d = c.d_model, ff = c.d_ff, hd = c.head_dim();
    if (!kv_resident_) return Status::Error("the KV cache is released");
    size_t rows = 0;
    for (const SeqChunk& ch : chunks) rows += ch.num_tokens;
    if (rows == 0) return Status::Ok();
    Resize(rows);

    // Per-row position, chunk and cache slot.
    size_t t = 0;
    bool any_lora = false;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const SeqChunk& ch = chunks[ci];
      if (ch.lora_slot < -1 || ch.lora_slot >= int32_t(lora_.slots)) {
        std::abort();
      }
      any_lora |= ch.lora_slot >= 0;
      for (uint32_t k = 0; k < ch.num_tokens; ++k, ++t) {
        const uint32_t pos = ch.start_pos + k;
        if (pos >= c.max_context || pos / kv_.block_size >= ch.num_blocks) {
          std::abort();
        }
        pos_[t] = pos;
        chunk_of_[t] = uint32_t(ci);
        slot_[t] =
            size_t(ch.block_table[pos / kv_.block_size]) * kv_.block_size +
            pos % kv_.block_size;
        const int32_t tok = ch.tokens[k];
        if (tok < 0 || uint32_t(tok) >= c.vocab) std::abort();
        std::copy_n(&w_.embed[size_t(tok) * d], d, &x_[t * d]);
      }
    }

    const float scale = 1.0f / std::sqrt(float(hd));
    for (uint32_t l = 0; l < c.n_layers; ++l) {
      const LayerWeights& lw = w_.layers[l];
      float* kc = &k_cache_[size_t(l) * slots_ * d];
      float* vc = &v_cache_[size_t(l) * slots_ * d];
      for (size_t r = 0; r < rows; ++r) {
        RmsNorm(&x_[r * d], lw.attn_norm.data(), d, c.norm_eps, &h_[r * d]);
      }
      MatMul(h_.data(), rows, d, lw.wq.data(), d, q_.data(), false);
      MatMul(h_.data(), rows, d, lw.wk.data(), d, k_.data(), false);
      MatMul(h_.data(), rows, d, lw.wv.data(), d, v_.data(), false);
      if (any_lora) ApplyLora(chunks, l);
      const size_t half = hd / 2;
      for (size_t r = 0; r < rows; ++r) {
        const float* cs = &w_.rope_cos[pos_[r] * half];
        const float* sn = &w_.rope_sin[pos_[r] * half];
        Rope(&q_[r * d], c.n_heads, uint32_t(hd), cs, sn);
        Rope(&k_[r * d], c.n_heads, uint32_t(hd), cs, sn);
        std::copy_n(&k_[r * d], d, kc + slot_[r] * d);
        std::copy_n(&v_[r * d], d, vc + slot_[r] * d);
      }
      for (size_t r = 0; r < rows; ++r) {
        Attend(chunks[chunk_of_[r]], pos_[r], &q_[r * d], kc, vc, scale,
               &att_[r * d]);
      }
      MatMul(att_.data(), rows, d, lw.wo.data(), d, x_.data(), true);

      for (size_t r = 0; r < rows; ++r) {
        RmsNorm(&x_[r * d], lw.mlp_norm.data(), d, c.norm_eps, &h_[r * d]);
      }
      if (c.moe_experts > 0) {
        MoeMlp(l, rows);
        continue;
      }
      MatMul(h_.data(), rows, d, lw.w_gate.data(), ff, a_.data(), false);
      MatMul(h_.data(), rows, d, lw.w_up.data(), ff, b_.data(), false);
      for (size_t i = 0; i < rows * ff; ++i) a_[i] = Silu(a_[i]) * b_[i];
      MatMul(a_.data(), rows, ff, lw.w_down.data(), d, x_.data(), true);
    }
    last_rows_ = rows;

    // Logits of each wanted chunk's last row.
    size_t out_row = 0;
    t = 0;
    for (const SeqChunk& ch : chunks) {
      t += ch.num_tokens;
      if (!ch.want_logits) continue;
      RmsNorm(&x_[(t - 1) * d], w_.final_norm.data(), d, c.norm_eps, h_.data());
      MatMul(h_.data(), 1, d, w_.lm_head.data(), c.vocab,
             logits + out_row * c.vocab, false);
      ++out_row;
    }
    return Status::Ok();
  }

 private:
  void Resize(size_t rows) {
    const size_t d = w_.config.d_model, ff = w_.config.d_ff;
    if (pos_.size() >= rows) return;
    pos_.resize(rows);
    chunk_of_.resize(rows);
    slot_.resize(rows);
    for (auto* v : {&x_, &h_, &q_, &k_, &v_, &att_}) v->resize(rows * d);
    a_.resize(rows * ff);
    b_.resize(rows * ff);
    scores_.resize(w_.config.max_context);
  }

  // q += (h A_q) B_q * scale and v += (h A_v) B_v * scale for the rows of
  // every chunk with an adapter slot. Out of line, and its scratch sized
  // here: LoRA code inlined into Forward() (even one more resize in
  // Resize()) cost the dense path's attention loop a register, a spill and
  // a reload per iteration (+1.1% instructions, measured with callgrind).
  [[gnu::noinline]] void ApplyLora(const std::vector<SeqChunk>& chunks,
                                   uint32_t l) {
    const size_t d = w_.config.d_model, rank = lora_.rank;
    const LoraOffsets o = LoraLayerOffsets(w_.config, lora_.rank, l);
    const size_t need = h_.size() / d * rank;  // every row Resize() made
    if (lora_u_.size() < need) lora_u_.resize(need);
    size_t t0 = 0;
    for (const SeqChunk& ch : chunks) {
      const size_t n = ch.num_tokens;
      if (ch.lora_slot >= 0) {
        const float* w = &lora_weights_[size_t(ch.lora_slot) * lora_floats_];
        const float scale = lora_scale_[size_t(ch.lora_slot)];
        const float* h = &h_[t0 * d];
        auto delta = [&](size_t a, size_t b, float* y) {
          MatMul(h, n, d, w + a, rank, lora_u_.data(), false);
          for (size_t i = 0; i < n * rank; ++i) lora_u_[i] *= scale;
          MatMul(lora_u_.data(), n, rank, w + b, d, y + t0 * d, true);
        };
        delta(o.a_q, o.b_q, q_.data());
        delta(o.a_v, o.b_v, v_.data());
      }
      t0 += n;
    }
  }

  // x_ += the mixture of experts of layer l over h_ (rows rows). Out of
  // line with its own scratch, like ApplyLora(), so that the dense path's
  // code stays as it was.
  [[gnu::noinline]] void MoeMlp(uint32_t l, size_t rows) {
    const ModelConfig& c = w_.config;
    const LayerWeights& lw = w_.layers[l];
    const size_t d = c.d_model, e_n = c.moe_experts, k_n = c.moe_top_k;
    const size_t f = c.moe_d_ff(), assigned = rows * k_n;
    if (moe_sel_stride_ < assigned) {
      moe_sel_stride_ = assigned;
      moe_sel_.resize(size_t(c.n_layers) * assigned);
      moe_margin_stride_ = rows;
      moe_margin_.resize(size_t(c.n_layers) * rows);
      moe_wt_.resize(assigned);
      moe_slot_.resize(assigned);
      moe_in_.resize(assigned * d);
      moe_out_.resize(assigned * d);
      moe_a_.resize(assigned * f);
      moe_b_.resize(assigned * f);
    }
    if (moe_scores_.size() < rows * e_n) moe_scores_.resize(rows * e_n);
    // Router scores, then each row's top k (kept sorted, highest first;
    // a later expert must score strictly higher to pass an earlier one).
    MatMul(h_.data(), rows, d, lw.router.data(), e_n, moe_scores_.data(),
           false);
    int32_t* sel = &moe_sel_[size_t(l) * moe_sel_stride_];
    float* margin = &moe_margin_[size_t(l) * moe_margin_stride_];
    uint64_t* counts = &expert_counts_[size_t(l) * e_n];
    std::fill(expert_rows_.begin(), expert_rows_.end(), 0);
    for (size_t r = 0; r < rows; ++r) {
      float* s = &moe_scores_[r * e_n];
      int32_t best[kMaxMoeTopK + 1];
      float best_s[kMaxMoeTopK + 1];
      size_t have = 0;
      const size_t keep = std::min(k_n + 1, e_n);
      for (size_t e = 0; e < e_n; ++e) {
        const float v = s[e] + lw.router_bias[e];
        if (have == keep && !(v > best_s[have - 1])) continue;
        size_t i = have < keep ? have++ : have - 1;
        for (; i > 0 && v > best_s[i - 1]; --i) {
          best[i] = best[i - 1];
          best_s[i] = best_s[i - 1];
        }
        best[i] = int32_t(e);
        best_s[i] = v;
      }
      margin[r] = keep > k_n ? best_s[k_n - 1] - best_s[k_n]
                             : std::numeric_limits<float>::infinity();
      // Softmax over the chosen k scores.
      float sum = 0;
      for (size_t i = 0; i < k_n; ++i) {
        moe_wt_[r * k_n + i] = std::exp(best_s[i] - best_s[0]);
        sum += moe_wt_[r * k_n + i];
      }
      for (size_t i = 0; i < k_n; ++i) {
        moe_wt_[r * k_n + i] /= sum;
        sel[r * k_n + i] = best[i];
        ++expert_rows_[size_t(best[i]) + 1];
      }
    }
    if (count_experts_) {
      for (size_t e = 0; e < e_n; ++e) counts[e] += expert_rows_[e + 1];
    }
    // Dispatch: each expert's rows together, in row order.
    for (size_t e = 0; e < e_n; ++e) expert_rows_[e + 1] += expert_rows_[e];
    for (size_t a = 0; a < assigned; ++a) {
      const size_t slot = expert_rows_[size_t(sel[a])]++;
      moe_slot_[a] = slot;
      std::copy_n(&h_[(a / k_n) * d], d, &moe_in_[slot * d]);
    }
    // expert_rows_[e] is now the end of expert e's rows (the start of
    // e + 1's).
    size_t begin = 0;
    for (size_t e = 0; e < e_n; ++e) {
      const size_t end = expert_rows_[e], n = end - begin;
      if (n > 0) {
        const size_t off = e * d * f;
        MatMul(&moe_in_[begin * d], n, d, &lw.e_gate[off], f,
               &moe_a_[begin * f], false);
        MatMul(&moe_in_[begin * d], n, d, &lw.e_up[off], f, &moe_b_[begin * f],
               false);
        for (size_t i = begin * f; i < end * f; ++i) {
          moe_a_[i] = Silu(moe_a_[i]) * moe_b_[i];
        }
        MatMul(&moe_a_[begin * f], n, f, &lw.e_down[off], d,
               &moe_out_[begin * d], false);
      }
      begin = end;
    }
    // Combine: each row adds its k weighted outputs, highest score first.
    for (size_t r = 0; r < rows; ++r) {
      float* x = &x_[r * d];
      for (size_t i = 0; i < k_n; ++i) {
        const float wt = moe_wt_[r * k_n + i];
        const float* y = &moe_out_[moe_slot_[r * k_n + i] * d];
        for (size_t j = 0; j < d; ++j) x[j] += wt * y[j];
      }
    }
  }

  // Causal attention of one row (at position `pos`) over positions 0..pos
  // of its sequence, read through the block table.
  void Attend(const SeqChunk& ch, size_t pos, const float* q, const float* kc,
              const float* vc, float scale, float* out) {
    const ModelConfig& c = w_.config;
    const size_t d = c.d_model, hd = c.head_dim(), bs = kv_.block_size;
    for (size_t h = 0; h < c.n_heads; ++h) {
      const float* qh = q + h * hd;
      float mx = -INFINITY;
      for (size_t j = 0; j <= pos; ++j) {
        const size_t slot = size_t(ch.block_table[j / bs]) * bs + j % bs;
        const float* kh = kc + slot * d + h * hd;
        float s = 0;
        for (size_t i = 0; i < hd; ++i) s += qh[i] * kh[i];
        s *= scale;
        scores_[j] = s;
        mx = std::max(mx, s);
      }
      float sum = 0;
      for (size_t j = 0; j <= pos; ++j) {
        scores_[j] = std::exp(scores_[j] - mx);
        sum += scores_[j];
      }
      float* oh = out + h * hd;
      std::fill(oh, oh + hd, 0.0f);
      for (size_t j = 0; j <= pos; ++j) {
        const size_t slot = size_t(ch.block_table[j / bs]) * bs + j % bs;
        const float* vh = vc + slot * d + h * hd;
        const float p = scores_[j];
        for (size_t i = 0; i < hd; ++i) oh[i] += p * vh[i];
      }
      const float inv = 1.0f / sum;
      for (size_t i = 0; i < hd; ++i) oh[i] *= inv;
    }
  }

  // Calls f(k, v) with the first K and V float of each block's span of
  // block_size x d_model floats, for blocks[0..n) and, within each, every
  // layer in turn: the order of a block record (Model::ReadKvBlocks).
  template <typename F>
  void ForEachKvSpan(const int32_t* blocks, size_t n, F f) {
    const size_t d = w_.config.d_model, bs = kv_.block_size;
    for (size_t i = 0; i < n; ++i) {
      if (blocks[i] < 0 || uint32_t(blocks[i]) >= kv_.num_blocks) std::abort();
      const size_t first = size_t(blocks[i]) * bs;
      for (uint32_t l = 0; l < w_.config.n_layers; ++l) {
        f(&k_cache_[(size_t(l) * slots_ + first) * d],
          &v_cache_[(size_t(l) * slots_ + first) * d]);
      }
    }
  }

  const Weights w_;
  const KvLayout kv_;
  const LoraLayout lora_;
  const size_t lora_floats_;  // one adapter
  const size_t slots_;
  std::vector<float> k_cache_, v_cache_;  // [layer][slot][d]
  bool kv_resident_ = true;               // false: released (sleep)
  std::vector<float> lora_weights_;       // [adapter slot][LoraAdapter]
  std::vector<float> lora_scale_;         // per adapter slot
  std::vector<size_t> pos_, slot_;
  std::vector<uint32_t> chunk_of_;
  std::vector<float> x_, h_, q_, k_, v_, att_, a_, b_, scores_, lora_u_;
  // MoE: counters [layer][expert]; per Forward the rows per expert (then
  // their offsets), the routing [layer][row][i] and margins [layer][row]
  // (strides: the most rows seen), and per layer the weights and the
  // gathered rows of every (row, i) assignment.
  bool count_experts_ = true;
  std::vector<uint64_t> expert_counts_;
  std::vector<size_t> expert_rows_;
  size_t last_rows_ = 0, moe_sel_stride_ = 0, moe_margin_stride_ = 0;
  std::vector<int32_t> moe_sel_;
  std::vector<size_t> moe_slot_;
  std::vector<float> moe_margin_, moe_scores_, moe_wt_, moe_in_, moe_out_,
      moe_a_, moe_b_;
};

}  // namespace

std::unique_ptr<Model> MakeCpuModel(const Weights& weights, const KvLayout& kv,
                                    const LoraLayout& lora) {
  return std::make_unique<CpuModel>(weights, kv, lora);
}

}  // namespace tokenmeter::engine
