// A decoder-only transformer written once against the Backend ops; architectures
// differ only through ModelConfig. Forward runs one packed batch (many sequences'
// new tokens, no padding), writes their KV, taps requested layers and computes logits
// for the rows that sample.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace hsx {

struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> slot_mapping;  // [T] KV cache slot each token writes
  std::vector<SequenceSlice> seqs;
  std::vector<int32_t> logit_rows;    // rows whose logits are wanted
};

// The same batch on the backend's device: what the forward reads. A runner may fill one
// in place (CUDA graphs replay on fixed buffers) instead of uploading a ForwardBatch.
struct DeviceBatch {
  Tensor token_ids, positions, slot_mapping;  // int32 [T]; a negative slot stores no KV
  AttentionBatch attention;
  std::vector<int32_t> logit_rows;  // host: rows whose logits are wanted
};

// Uploads a batch for a forward (the target's or a draft's).
DeviceBatch UploadBatch(Backend& backend, const ForwardBatch& batch);

struct ForwardOutput {
  Tensor logits;    // [logit_rows, V] f32 on the backend's device
  Tensor captured;  // [L, T, H] in compute dtype: the requested layer ids, ascending
  Tensor final_hidden;  // [logit_rows, H] in compute dtype: the final-normed rows the logits come from
};

// With a communicator, one rank of a tensor-parallel model (model/tensor_parallel.h):
// weights holds its slices; each attention and MLP output is all-reduced, so the residual
// stream, the captured rows and the logits are whole and the same on every rank.
class Model {
 public:
  Model(ModelConfig config, ModelWeights weights, Backend& backend, Communicator* comm = nullptr);
  static Result<std::unique_ptr<Model>> Load(const std::string& model_dir, Backend& backend,
                                             Communicator* comm = nullptr);

  const ModelConfig& config() const { return config_; }
  // What this rank computes (its heads, KV heads, intermediate sizes); config() without
  // tensor parallelism. Its KV cache is built from this.
  const ModelConfig& rank_config() const { return rank_config_; }
  Shard shard() const { return comm_ ? Shard{comm_->rank(), comm_->size()} : Shard{}; }
  Backend& backend() const { return backend_; }
  // Read access for drafts that share the target's embedding or LM head (EAGLE-3).
  const ModelWeights& weights() const { return weights_; }
  // --quantization fp8 (model/fp8_quantization.h), once, before the first forward.
  Status QuantizeWeightsFp8();

  // capture_layers: ascending, unique ids in [0, num_layers] (vLLM's convention: id i < N
  // is the input of decoder layer i, id N the last layer's output before the final norm).
  ForwardOutput Forward(const ForwardBatch& batch, KVCache& cache, const std::vector<int>& capture_layers);
  // The forward proper; reads nothing from the host but logit_rows and the attention
  // batch's host fields, so a CUDA graph can record it (logit rows 0..T-1 in order gather nothing).
  ForwardOutput Forward(const DeviceBatch& batch, KVCache& cache, const std::vector<int>& capture_layers);

 private:
  Tensor PerLayerInputs(const Tensor& ids, const Tensor& embeds);
  void AllReduce(Tensor& partial_sums);
  Tensor Logits(const Tensor& rows);

  ModelConfig config_;
  ModelConfig rank_config_;
  Communicator* comm_;
  ModelWeights weights_;
  Backend& backend_;
  std::vector<RopeTable> rope_;  // per layer
};

}  // namespace hsx
