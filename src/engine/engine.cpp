#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/sampler.h"
#include "util/thread_pool.h"

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int ResolveNumBlocks(const Model& model, const EngineConfig& c) {
  if (c.num_blocks > 0) return c.num_blocks;
  const size_t per_block = KVCache::BytesPerToken(model.config(), model.backend().compute_dtype()) * c.block_size;
  return static_cast<int>(std::max<size_t>(1, c.kv_cache_bytes / per_block));
}

}  // namespace

Engine::Engine(Model& model, EngineConfig config)
    : model_(model),
      config_(std::move(config)),
      cache_(model.config(), model.backend(), ResolveNumBlocks(model, config_), config_.block_size),
      blocks_(cache_.num_blocks(), config_.block_size),
      scheduler_(config_.scheduler, blocks_) {
  if (config_.max_model_len <= 0) config_.max_model_len = model.config().max_position_embeddings;
}

Engine::~Engine() {
  if (profile_) {
    std::fprintf(stderr, "hsx profile: engine forward %.2f s, capture download %.2f s, capture store %.2f s, %lu steps\n",
                 profile_seconds_[0], profile_seconds_[1], profile_seconds_[2], static_cast<unsigned long>(stats_.steps));
  }
}

Status Engine::Add(Request request) {
  const std::string who = "request '" + request.id + "'";
  if (request.prompt.empty()) return Error(who + ": empty prompt (expected at least one token)");
  const int vocab = model_.config().vocab_size;
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t t = request.prompt[i];
    if (t < 0 || t >= vocab) {
      return Error(who + ": token id " + std::to_string(t) + " at position " + std::to_string(i) +
                   " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  const int total = static_cast<int>(request.prompt.size()) + request.max_new_tokens;
  if (total > config_.max_model_len) {
    return Error(who + ": " + std::to_string(request.prompt.size()) + " prompt tokens + " +
                 std::to_string(request.max_new_tokens) + " new tokens exceed max_model_len " +
                 std::to_string(config_.max_model_len));
  }
  if (BlockManager::BlocksFor(total, config_.block_size) > blocks_.num_blocks()) {
    return Error(who + ": " + std::to_string(total) + " tokens do not fit the KV cache (" +
                 std::to_string(blocks_.num_blocks() * config_.block_size) + " token slots)");
  }
  auto seq = std::make_unique<Sequence>(std::move(request));
  if (seq->request().capture && !config_.capture_layers.empty()) {
    const int64_t layers = static_cast<int64_t>(config_.capture_layers.size());
    seq->hidden_states = Tensor::Host(config_.capture_dtype, {seq->prompt_len(), layers, model_.config().hidden_size});
  }
  scheduler_.Add(std::move(seq));
  return {};
}

ForwardBatch Engine::BuildBatch(const std::vector<ScheduledChunk>& chunks) const {
  ForwardBatch batch;
  const int bs = config_.block_size;
  for (const auto& [seq, n] : chunks) {
    SequenceSlice slice;
    slice.q_start = static_cast<int32_t>(batch.token_ids.size());
    slice.q_len = n;
    slice.ctx_len = seq->num_computed + n;
    slice.block_table = seq->block_table;
    for (int p = seq->num_computed; p < slice.ctx_len; ++p) {
      batch.token_ids.push_back(seq->tokens()[p]);
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(seq->block_table[p / bs] * bs + p % bs);
    }
    // Sample only where this chunk completes the sequence's known tokens.
    if (slice.ctx_len == seq->num_tokens() && seq->wants_more_tokens()) {
      batch.logit_rows.push_back(slice.q_start + n - 1);
    }
    batch.seqs.push_back(std::move(slice));
  }
  return batch;
}

// Copies each chunk's prompt rows out of the step's [L, T, H] capture into its
// sequence's [prompt_len, L, H] buffer, converting to the output dtype; rows in parallel.
void Engine::StoreCaptured(const std::vector<ScheduledChunk>& chunks, const Tensor& captured) {
  const int64_t layers = captured.size(0), total = captured.size(1), h = captured.size(2);
  const size_t in_size = DTypeSize(captured.dtype());
  struct Row { Sequence* seq; int64_t pos; };
  std::vector<Row> rows;
  for (const auto& [seq, n] : chunks)
    for (int i = 0; i < n; ++i) rows.push_back({seq, seq->num_computed + i});
  ThreadPool::Global().ParallelFor(total, [&](int64_t b, int64_t e) {
    std::vector<float> f32(static_cast<size_t>(h));
    for (int64_t r = b; r < e; ++r) {
      const auto [seq, pos] = rows[r];
      Tensor& dst = seq->hidden_states;
      if (!dst.defined() || pos >= seq->prompt_len()) continue;
      const size_t out_size = DTypeSize(dst.dtype());
      for (int64_t l = 0; l < layers; ++l) {
        const char* src = captured.data<char>() + (l * total + r) * h * in_size;
        char* out = dst.data<char>() + (pos * layers + l) * h * out_size;
        if (captured.dtype() == dst.dtype()) {
          std::memcpy(out, src, h * in_size);
        } else {
          ConvertToF32(captured.dtype(), src, f32.data(), f32.size());
          ConvertFromF32(f32.data(), dst.dtype(), out, f32.size());
        }
      }
    }
  });
}

// The step's capture lands in one pinned host buffer, grown when a step needs more.
const Tensor& Engine::DownloadCaptured(const Tensor& captured) {
  if (captured_host_.nbytes() < captured.nbytes()) {
    captured_host_ = model_.backend().HostBuffer(captured.dtype(), {static_cast<int64_t>(captured.nbytes())});
  }
  captured_view_ = Tensor(captured_host_.raw(), captured.dtype(), captured.shape(), Device::kCPU, nullptr);
  model_.backend().DownloadTo(captured, captured_view_);
  return captured_view_;
}

std::vector<std::unique_ptr<Sequence>> Engine::Step() {
  std::vector<std::unique_ptr<Sequence>> finished;
  const std::vector<ScheduledChunk> chunks = scheduler_.Schedule();
  if (chunks.empty()) return finished;
  const ForwardBatch batch = BuildBatch(chunks);
  const auto t0 = Clock::now();
  ForwardOutput out = model_.Forward(batch, cache_, config_.capture_layers);
  if (profile_) model_.backend().Synchronize();
  const auto t1 = Clock::now();
  if (!config_.capture_layers.empty()) {
    const Tensor& host = DownloadCaptured(out.captured);
    const auto t2 = Clock::now();
    StoreCaptured(chunks, host);
    profile_seconds_[1] += Seconds(t1, t2);
    profile_seconds_[2] += Seconds(t2, Clock::now());
  }
  profile_seconds_[0] += Seconds(t0, t1);
  std::vector<int32_t> sampled;
  if (out.logits.defined()) sampled = GreedySample(model_.backend().Download(out.logits));

  ++stats_.steps;
  stats_.tokens_computed += batch.token_ids.size();
  size_t next_sample = 0;
  for (const auto& [seq, n] : chunks) {
    seq->num_computed += n;
    if (seq->num_computed == seq->num_tokens() && seq->wants_more_tokens()) {
      const int32_t token = sampled[next_sample++];
      seq->Append(token);
      const auto& stops = seq->request().stop_token_ids;
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) seq->Stop();
    }
    if (seq->num_computed >= seq->prompt_len() && !seq->wants_more_tokens()) finished.push_back(scheduler_.Finish(seq));
  }
  return finished;
}

}  // namespace hsx
