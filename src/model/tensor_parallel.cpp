#include "model/tensor_parallel.h"

#include <string>

namespace hsx {
namespace {

Status NotDivisible(int size, const std::string& field, int64_t value, const char* why) {
  return Error("--tensor-parallel-size " + std::to_string(size) + ": config.json's " + field + " (" +
               std::to_string(value) + ") " + why);
}

}  // namespace

Status CheckTensorParallel(const ModelConfig& c, int size) {
  if (size < 1) return Error("--tensor-parallel-size " + std::to_string(size) + ": must be at least 1");
  if (size == 1) return Status();
  if (c.num_heads % size != 0) {
    return NotDivisible(size, "num_attention_heads", c.num_heads,
                        "is not a multiple of it: each rank needs whole heads");
  }
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const int kvh = c.layers[i].num_kv_heads;
    if (kvh % size != 0 && size % kvh != 0) {
      return NotDivisible(size, "num_key_value_heads of layer " + std::to_string(i), kvh,
                          "neither divides it nor is a multiple of it: KV heads split evenly or replicate evenly");
    }
  }
  if (c.intermediate_size % size != 0) {
    return NotDivisible(size, "intermediate_size", c.intermediate_size, "is not a multiple of it");
  }
  if (c.moe_biases || c.attention_sinks) {  // gpt-oss: biases, sinks and stacked experts have no rank split yet
    return Error("--tensor-parallel-size " + std::to_string(size) + ": " + c.architecture +
                 " runs on one GPU only for now (its sinks, biases and stacked experts are not split across ranks)");
  }
  if (c.num_experts > 0 && c.moe_intermediate_size % size != 0) {
    return NotDivisible(size, "moe_intermediate_size", c.moe_intermediate_size, "is not a multiple of it");
  }
  return Status();
}

ModelConfig RankConfig(const ModelConfig& config, Shard shard) {
  ModelConfig c = config;
  c.num_heads /= shard.size;
  c.intermediate_size /= shard.size;
  c.moe_intermediate_size /= shard.size;
  for (LayerSpec& l : c.layers) l.num_kv_heads = l.num_kv_heads >= shard.size ? l.num_kv_heads / shard.size : 1;
  return c;
}

int64_t FirstKvHead(const ModelConfig& config, int layer, Shard shard) {
  const int kvh = config.layers[layer].num_kv_heads;
  // Replicated: ranks size/kvh at a time share a KV head, the one their query heads use.
  if (kvh < shard.size) return shard.rank / (shard.size / kvh);
  return static_cast<int64_t>(shard.rank) * (kvh / shard.size);
}

bool VocabParallel(const ModelConfig& config, int size) { return size > 1 && config.vocab_size % size == 0; }

}  // namespace hsx
