// Runs requests to the end through an engine: the plain-against-speculative comparisons of
// the engine tests (speculative, draft length, token trees, gpt-oss EAGLE-3, CUDA trees),
// and the EAGLE-3 fixtures they load.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "model/eagle3_draft.h"
#include "model/model.h"
#include "test_util.h"

namespace hsx::test {

struct Generation {
  std::map<std::string, std::vector<int32_t>> tokens;  // by request id
  EngineStats stats;
  std::vector<int64_t> chosen_lengths;  // with adaptive draft lengths: request-steps by K
};

// Runs `requests` to the end through an engine of `config`.
inline Generation RunAll(Model& model, const EngineConfig& config, std::vector<Request> requests) {
  Engine engine(model, config);
  for (Request& r : requests) EXPECT_TRUE(engine.Add(std::move(r)).ok());
  Generation run;
  while (engine.has_work())
    for (auto& seq : engine.Step()) run.tokens[seq->id()] = seq->generated();
  run.stats = engine.stats();
  if (engine.drafter() != nullptr && engine.drafter()->adaptive()) run.chosen_lengths = engine.drafter()->chosen_lengths();
  return run;
}

// `prompts` batched (ids p0, p1, ...), each to max_new_tokens or the model's EOS.
inline Generation Generate(Model& model, const std::vector<std::vector<int32_t>>& prompts, const EngineConfig& config,
                           int max_new_tokens) {
  std::vector<Request> requests;
  for (size_t k = 0; k < prompts.size(); ++k) {
    Request r;
    r.id = "p" + std::to_string(k);
    r.prompt = prompts[k];
    r.max_new_tokens = max_new_tokens;
    r.stop_token_ids = model.config().eos_token_ids;
    requests.push_back(std::move(r));
  }
  return RunAll(model, config, std::move(requests));
}

// An EAGLE-3 fixture on `backend`: the draft eagle3/<variant> over its target
// (Eagle3Target); a null draft when either fails to load (the failure reported).
struct Eagle3Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Eagle3Draft> draft;
};
inline Eagle3Fixture LoadEagle3(Backend& backend, const std::string& variant) {
  Eagle3Fixture f;
  auto model = Model::Load(ModelDir(Eagle3Target(variant)), backend);
  if (!model.ok()) {
    ADD_FAILURE() << model.status().message();
    return f;
  }
  f.model = std::move(*model);
  auto draft = Eagle3Draft::Load(DataPath("eagle3/" + variant), *f.model, backend);
  if (!draft.ok()) {
    ADD_FAILURE() << draft.status().message();
    return f;
  }
  f.draft = std::move(*draft);
  return f;
}

}  // namespace hsx::test
