// hsx inspect: architecture, layer types, sizes, dtypes and parameter count.
#include <filesystem>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/gguf_config.h"
#include "tensor/safetensors.h"

namespace hsx::cli {
namespace {

// A checkpoint is loaded to validate every tensor against the config; dummy weights have
// nothing to validate (and a 31B model would not fit in host memory as f32).
Result<ModelConfig> InspectedConfig(const ModelOptions& o) {
  if (o.load_format == "dummy") return LoadConfig(o);
  CpuBackend backend;
  HSX_ASSIGN_OR_RETURN(auto model, LoadModel(o, backend));
  return model->config();
}

int RunInspect(const ModelOptions& o) {
  auto config = InspectedConfig(o);
  if (!config.ok()) return Fail("inspect", config.status());
  const ModelConfig& c = *config;
  std::printf("architecture      %s\n", c.architecture.c_str());
  std::printf("parameters        %.3fB (%ld)\n", CountParameters(c) / 1e9, static_cast<long>(CountParameters(c)));
  std::printf("hidden_size       %d\nlayers            %d\nattention heads   %d\nvocab_size        %d\n", c.hidden_size,
              c.num_layers, c.num_heads, c.vocab_size);
  if (c.num_experts > 0) {
    std::printf("experts           %d (top %d, intermediate %d)\n", c.num_experts, c.experts_per_token, c.moe_intermediate_size);
  } else {
    std::printf("intermediate_size %d\n", c.intermediate_size);
  }
  std::printf("capture layer ids 0..%d (0 = embeddings, %d = last layer output before the final norm)\n", c.num_layers,
              c.num_layers);
  std::map<std::string, int64_t> dtypes;
  if (std::filesystem::is_directory(o.model) && o.load_format != "dummy") {
    for (const auto& entry : std::filesystem::directory_iterator(o.model)) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() != ".safetensors" || name.rfind("model", 0) != 0) continue;
      auto file = SafetensorsFile::Open(entry.path());
      if (!file.ok()) continue;
      for (const auto& [name, t] : file->tensors()) dtypes[std::string(DTypeName(t.dtype()))] += t.numel();
    }
  } else if (IsGgufPath(o.model)) {
    auto file = GgufFile::Open(o.model);
    if (!file.ok()) return Fail("inspect", file.status());
    for (const GgufTensorInfo& t : file->tensors()) {
      int64_t n = 1;
      for (int64_t d : t.dims) n *= d;
      dtypes[GgmlTypeName(static_cast<uint32_t>(t.type)) + " (GGUF)"] += n;
    }
  } else {
    dtypes[std::string(DTypeName(c.dtype)) + " (dummy)"] = CountParameters(c);
  }
  for (const auto& [name, n] : dtypes) std::printf("weights dtype     %s: %ld elements\n", name.c_str(), static_cast<long>(n));
  std::printf("layers:\n");
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerSpec& l = c.layers[i];
    std::printf("  %3d %-8s head_dim %-4d kv_heads %-3d%s%s%s\n", i, l.sliding ? "sliding" : "full", l.head_dim,
                l.num_kv_heads, l.moe ? " moe" : "", l.k_eq_v ? " k=v" : "",
                l.kv_source != i ? (" kv-shared-from " + std::to_string(l.kv_source)).c_str() : "");
  }
  return 0;
}

}  // namespace

void RegisterInspect(CLI::App& root) {
  auto o = std::make_shared<ModelOptions>();
  CLI::App* app = root.add_subcommand("inspect", "Describe a model: architecture, layers, sizes, dtypes");
  o->Register(*app);
  app->callback([o] { ExitCode() = RunInspect(*o); });
}

}  // namespace hsx::cli
