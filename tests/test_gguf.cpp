// GGUF files built here byte by byte: the container reader's checks (each malformed field an
// error naming the file and the field), the config and weight mapping's refusals, the
// tokenizer's, and a bounded fuzz run over a whole model file (the llama fixture's tensors
// under llama.cpp's names) that must load or fail cleanly. CI runs it under ASan+UBSan.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/gguf_config.h"
#include "model/gguf_tokenizer.h"
#include "model/gguf_weights.h"
#include "model/model.h"
#include "test_util.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;

// Writes GGUF version 3 as llama.cpp lays it out.
class GgufBuilder {
 public:
  template <class T>
  static std::string Bytes(T v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static std::string Str(const std::string& s) { return Bytes<uint64_t>(s.size()) + s; }

  GgufBuilder& Raw(const std::string& key, GgufType type, const std::string& value) {
    kv_ += Str(key) + Bytes<uint32_t>(static_cast<uint32_t>(type)) + value;
    ++kv_count_;
    return *this;
  }
  GgufBuilder& U32(const std::string& key, uint32_t v) { return Raw(key, GgufType::kU32, Bytes(v)); }
  GgufBuilder& F32(const std::string& key, float v) { return Raw(key, GgufType::kF32, Bytes(v)); }
  GgufBuilder& Bool(const std::string& key, bool v) { return Raw(key, GgufType::kBool, Bytes<uint8_t>(v)); }
  GgufBuilder& String(const std::string& key, const std::string& v) { return Raw(key, GgufType::kString, Str(v)); }
  GgufBuilder& Strings(const std::string& key, const std::vector<std::string>& v) {
    std::string a = Bytes<uint32_t>(static_cast<uint32_t>(GgufType::kString)) + Bytes<uint64_t>(v.size());
    for (const auto& s : v) a += Str(s);
    return Raw(key, GgufType::kArray, a);
  }
  GgufBuilder& Ints(const std::string& key, const std::vector<int32_t>& v) {
    std::string a = Bytes<uint32_t>(static_cast<uint32_t>(GgufType::kI32)) + Bytes<uint64_t>(v.size());
    for (int32_t x : v) a += Bytes(x);
    return Raw(key, GgufType::kArray, a);
  }
  GgufBuilder& Tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type, const std::string& data) {
    infos_ += Str(name) + Bytes<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) infos_ += Bytes(d);
    infos_ += Bytes<uint32_t>(static_cast<uint32_t>(type)) + Bytes<uint64_t>(data_.size());
    data_ += data;
    data_.append((32 - data_.size() % 32) % 32, '\0');
    ++tensor_count_;
    return *this;
  }
  std::string Build() const {
    std::string out = "GGUF" + Bytes<uint32_t>(3) + Bytes<uint64_t>(tensor_count_) + Bytes<uint64_t>(kv_count_) + kv_ + infos_;
    out.append((32 - out.size() % 32) % 32, '\0');
    return out + data_;
  }

 private:
  std::string kv_, infos_, data_;
  uint64_t kv_count_ = 0, tensor_count_ = 0;
};

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-gguf-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/model.gguf";
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& bytes) { std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes; }

  // The error of opening `bytes` as GGUF; it must name the file.
  std::string OpenError(const std::string& bytes) {
    Write(bytes);
    auto file = GgufFile::Open(path_);
    if (file.ok()) return "";
    EXPECT_NE(file.status().message().find(path_), std::string::npos) << file.status().message();
    return file.status().message();
  }

  // The llama fixture under llama.cpp's names and metadata (BF16 tensors as they are).
  static GgufBuilder LlamaModel() {
    GgufBuilder b;
    b.String("general.architecture", "llama").U32("llama.block_count", 4).U32("llama.context_length", 4096)
        .U32("llama.embedding_length", 64).U32("llama.feed_forward_length", 160).U32("llama.attention.head_count", 4)
        .U32("llama.attention.head_count_kv", 2).F32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
        .F32("llama.rope.freq_base", 10000.0f).U32("llama.vocab_size", 512).U32("tokenizer.ggml.eos_token_id", 2);
    SafetensorsFile st = test::Golden(test::ModelDir("llama") + "/model.safetensors");
    const std::map<std::string, std::string> names = {
        {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.o_proj.weight", "attn_output.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"}};
    for (const auto& [name, t] : st.tensors()) {
      std::string gguf_name;
      if (name == "model.embed_tokens.weight") gguf_name = "token_embd.weight";
      else if (name == "model.norm.weight") gguf_name = "output_norm.weight";
      else if (name == "lm_head.weight") gguf_name = "output.weight";
      else {
        const size_t dot = name.find('.', 13);
        gguf_name = "blk." + name.substr(13, dot - 13) + "." + names.at(name.substr(dot + 1));
      }
      std::vector<uint64_t> dims(t.shape().rbegin(), t.shape().rend());
      b.Tensor(gguf_name, dims, GgmlType::kBF16, std::string(static_cast<const char*>(t.raw()), t.nbytes()));
    }
    return b;
  }

  std::string LoadError(const std::string& bytes) {
    Write(bytes);
    CpuBackend backend;
    auto model = Model::Load(path_, backend);
    if (model.ok()) return "";
    EXPECT_NE(model.status().message().find(path_), std::string::npos) << model.status().message();
    return model.status().message();
  }

  std::string dir_, path_;
};

std::string Tiny() {
  return GgufBuilder().U32("a", 1).Tensor("w", {32, 2}, GgmlType::kQ8_0, std::string(2 * 34, '\1')).Build();
}

TEST_F(GgufTest, ReadsWhatItWasGiven) {
  Write(Tiny());
  auto file = GgufFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(*file->Unsigned("a"), 1u);
  ASSERT_EQ(file->tensors().size(), 1u);
  EXPECT_EQ(file->tensors()[0].nbytes, 68u);
  EXPECT_EQ(file->tensors()[0].dims, (std::vector<int64_t>{32, 2}));
  EXPECT_NE(file->String("a").status().message().find("metadata 'a' is UINT32, expected STRING"), std::string::npos);
  EXPECT_NE(file->Unsigned("b").status().message().find("missing metadata 'b'"), std::string::npos);
}

TEST_F(GgufTest, EveryTruncationFailsNamingTheFile) {
  const std::string full = Tiny();
  const size_t data_end = full.size() - (96 - 68);  // the tensor's 68 bytes, then padding to 32
  for (size_t n = 0; n < data_end; ++n) EXPECT_NE(OpenError(full.substr(0, n)), "") << n;
  EXPECT_EQ(OpenError(full.substr(0, data_end)), "");
}

TEST_F(GgufTest, MalformedHeadersFailNamingTheField) {
  std::string bytes = Tiny();
  EXPECT_NE(OpenError("GGUX" + bytes.substr(4)).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(OpenError("GGUF" + GgufBuilder::Bytes<uint32_t>(1) + bytes.substr(8)).find("version 1"), std::string::npos);
  std::string huge = bytes;
  const uint64_t big = ~0ull;
  std::memcpy(huge.data() + 8, &big, 8);  // tensor count
  EXPECT_NE(OpenError(huge).find("tensor count"), std::string::npos);
  std::memcpy(huge.data() + 8, bytes.data() + 8, 8);
  std::memcpy(huge.data() + 16, &big, 8);  // metadata count
  EXPECT_NE(OpenError(huge).find("metadata count"), std::string::npos);
  // A string claiming 2^63 bytes, an array count the file cannot hold, nesting too deep.
  EXPECT_NE(OpenError(GgufBuilder().Raw("s", GgufType::kString, GgufBuilder::Bytes<uint64_t>(1ull << 63)).Build()).find("metadata 's'"), std::string::npos);
  const std::string many = GgufBuilder::Bytes<uint32_t>(static_cast<uint32_t>(GgufType::kU64)) + GgufBuilder::Bytes<uint64_t>(1ull << 60);
  EXPECT_NE(OpenError(GgufBuilder().Raw("arr", GgufType::kArray, many).Build()).find("cannot fit"), std::string::npos);
  std::string nested = GgufBuilder::Bytes<uint32_t>(static_cast<uint32_t>(GgufType::kU8)) + GgufBuilder::Bytes<uint64_t>(0);
  for (int depth = 1; depth <= GgufFile::kMaxArrayNesting; ++depth) {
    const std::string wrapped = GgufBuilder::Bytes<uint32_t>(static_cast<uint32_t>(GgufType::kArray)) + GgufBuilder::Bytes<uint64_t>(1) + nested;
    EXPECT_EQ(OpenError(GgufBuilder().Raw("n", GgufType::kArray, nested).Build()), "") << depth;
    nested = wrapped;
  }
  EXPECT_NE(OpenError(GgufBuilder().Raw("n", GgufType::kArray, nested).Build()).find("nested deeper"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Raw("t", static_cast<GgufType>(13), "").Build()).find("unknown value type 13"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Raw("b", GgufType::kBool, "\2").Build()).find("neither 0 nor 1"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().U32("a", 1).U32("a", 2).Build()).find("appears twice"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().U32("general.alignment", 24).Build()).find("power of two"), std::string::npos);
}

TEST_F(GgufTest, MalformedTensorInfosFailNamingTheTensor) {
  const std::string block(34, '\0');
  EXPECT_NE(OpenError(GgufBuilder().Tensor("w", {16}, GgmlType::kQ8_0, block).Build()).find("tensor 'w': its first dimension 16"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Tensor("w", {32}, static_cast<GgmlType>(99), block).Build()).find("tensor type type 99"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Tensor("w", {1, 1, 1, 1, 1}, GgmlType::kF32, "1234").Build()).find("5 dimensions"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Tensor("w", {1ull << 62, 1ull << 62}, GgmlType::kF32, "").Build()).find("overflow"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Tensor("w", {64}, GgmlType::kQ8_0, block).Build()).find("run past the end"), std::string::npos);
  EXPECT_NE(OpenError(GgufBuilder().Tensor("w", {32}, GgmlType::kQ8_0, block).Tensor("w", {32}, GgmlType::kQ8_0, block).Build())
                .find("appears twice"), std::string::npos);
  // The second tensor's offset moved off the end of the first.
  std::string two = GgufBuilder().Tensor("a", {8}, GgmlType::kF32, std::string(32, '\0')).Tensor("b", {8}, GgmlType::kF32, std::string(32, '\0')).Build();
  const size_t at = two.find(std::string("\1\0\0\0\0\0\0\0b", 9)) + 9 + 4 + 8 + 4;
  const uint64_t off = 33;
  std::memcpy(two.data() + at, &off, 8);
  EXPECT_NE(OpenError(two).find("tensor 'b': data offset 33, expected 32"), std::string::npos);
}

TEST_F(GgufTest, FixtureLoadsAndItsRefusalsNameTheKeyOrTensor) {
  EXPECT_EQ(LoadError(LlamaModel().Build()), "");
  EXPECT_NE(LoadError(LlamaModel().U32("llama.attention.sliding_window", 8).Build())
                .find("metadata 'llama.attention.sliding_window' is not supported"), std::string::npos);
  EXPECT_NE(LoadError(LlamaModel().U32("split.count", 2).Build()).find("metadata 'split.count'"), std::string::npos);
  EXPECT_NE(LoadError(LlamaModel().Tensor("rope_freqs.weight", {8}, GgmlType::kF32, std::string(32, '\0')).Build())
                .find("rope_freqs.weight"), std::string::npos);
  EXPECT_NE(LoadError(LlamaModel().Tensor("blk.0.extra.weight", {8}, GgmlType::kF32, std::string(32, '\0')).Build())
                .find("tensor 'blk.0.extra.weight' is not used"), std::string::npos);
  GgufBuilder gemma;
  gemma.String("general.architecture", "gemma4");
  EXPECT_NE(LoadError(gemma.Build()).find("'general.architecture' is 'gemma4'"), std::string::npos);
}

// A one-layer Gemma 3 with llama.cpp's metadata and names, F32 tensors; norm i holds 1 + i/8
// plus a bit below f32's resolution at 1, as llama.cpp writes 1 + w.
GgufBuilder Gemma3Model() {
  GgufBuilder b;
  b.String("general.architecture", "gemma3").U32("gemma3.block_count", 1).U32("gemma3.context_length", 64)
      .U32("gemma3.embedding_length", 8).U32("gemma3.feed_forward_length", 8).U32("gemma3.attention.head_count", 1)
      .U32("gemma3.attention.head_count_kv", 1).U32("gemma3.attention.key_length", 256)
      .U32("gemma3.attention.value_length", 256).F32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f)
      .F32("gemma3.rope.freq_base", 1e6f).U32("gemma3.attention.sliding_window", 4).U32("gemma3.vocab_size", 16);
  auto f32 = [](size_t n, float base) {
    std::string out;
    for (size_t i = 0; i < n; ++i) out += GgufBuilder::Bytes(base + static_cast<float>(i) / 8 + 1e-7f);
    return out;
  };
  b.Tensor("token_embd.weight", {8, 16}, GgmlType::kF32, f32(128, 0.0f));
  b.Tensor("output_norm.weight", {8}, GgmlType::kF32, f32(8, 1.0f));
  for (const char* norm : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"}) {
    b.Tensor(std::string("blk.0.") + norm + ".weight", {8}, GgmlType::kF32, f32(8, 1.0f));
  }
  b.Tensor("blk.0.attn_q_norm.weight", {256}, GgmlType::kF32, f32(256, 1.0f));
  b.Tensor("blk.0.attn_k_norm.weight", {256}, GgmlType::kF32, f32(256, 1.0f));
  for (const char* proj : {"attn_q", "attn_k", "attn_v"}) {
    b.Tensor(std::string("blk.0.") + proj + ".weight", {8, 256}, GgmlType::kF32, f32(2048, 0.0f));
  }
  b.Tensor("blk.0.attn_output.weight", {256, 8}, GgmlType::kF32, f32(2048, 0.0f));
  for (const char* proj : {"ffn_gate", "ffn_up", "ffn_down"}) {
    b.Tensor(std::string("blk.0.") + proj + ".weight", {8, 8}, GgmlType::kF32, f32(64, 0.0f));
  }
  return b;
}

// transformers' GGUF conversion of Gemma 3: its config keys (rope_theta for full attention,
// the rest Gemma3TextConfig's defaults), and every *norm.weight minus 1 in f32.
TEST_F(GgufTest, Gemma3AsTransformersConvertsIt) {
  Write(Gemma3Model().Build());
  auto file = GgufFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto hf = GgufHfConfig(*file);
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ((*hf)["model_type"], "gemma3_text");
  EXPECT_EQ((*hf)["head_dim"], 256);
  EXPECT_EQ((*hf)["sliding_window"], 4);
  EXPECT_EQ((*hf)["rope_theta"], 1e6);
  EXPECT_EQ((*hf)["tie_word_embeddings"], true);
  EXPECT_FALSE(hf->contains("query_pre_attn_scalar"));  // transformers' default, 256
  auto config = GgufModelConfig(*file);
  ASSERT_TRUE(config.ok()) << config.status().message();
  CpuBackend backend;
  auto weights = LoadGgufWeights(*file, *config, backend);
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  const ModelWeights& w = *weights;
  const LayerWeights& l = w.layers[0];
  for (const Tensor* norm : std::initializer_list<const Tensor*>{&w.final_norm, &l.input_norm, &l.post_attention_norm, &l.pre_feedforward_norm,
                             &l.post_feedforward_norm, &l.q_norm, &l.k_norm}) {
    ASSERT_EQ(norm->dtype(), DType::kF32);
    for (int64_t i = 0; i < norm->numel(); ++i) {
      const float stored = 1.0f + static_cast<float>(i) / 8 + 1e-7f;
      ASSERT_EQ(norm->data<float>()[i], stored - 1.0f) << i;
    }
  }

  // What hsx and transformers would read differently is refused by name.
  EXPECT_NE(LoadError(Gemma3Model().String("gemma3.rope.scaling.type", "linear").F32("gemma3.rope.scaling.factor", 8).Build())
                .find("'gemma3.rope.scaling.type' is not supported"), std::string::npos);
  EXPECT_NE(LoadError(Gemma3Model().F32("gemma3.final_logit_softcapping", 30).Build())
                .find("'gemma3.final_logit_softcapping' is not supported"), std::string::npos);
  GgufBuilder head128;
  head128.String("general.architecture", "gemma3").U32("gemma3.block_count", 1).U32("gemma3.context_length", 64)
      .U32("gemma3.embedding_length", 8).U32("gemma3.feed_forward_length", 8).U32("gemma3.attention.head_count", 1)
      .U32("gemma3.attention.key_length", 128).F32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f)
      .U32("gemma3.attention.sliding_window", 4).U32("gemma3.vocab_size", 16);
  EXPECT_NE(LoadError(head128.Build()).find("'gemma3.attention.key_length') is 128"), std::string::npos);
}

// Gemma 3 stops on <end_of_turn> as well as EOS, as its generation_config.json's
// eos_token_id [1, 106] says: the token found by its text when the file names no EOT, and
// counted once when it does. Other architectures keep the stop tokens their file names.
TEST_F(GgufTest, Gemma3StopsOnEndOfTurnToo) {
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>"};
  for (int i = 4; i < 16; ++i) tokens.push_back("t" + std::to_string(i));
  tokens[9] = "<start_of_turn>";
  tokens[10] = "<end_of_turn>";
  auto stop_ids = [&](const GgufBuilder& b) {
    Write(b.Build());
    CpuBackend backend;
    auto model = Model::Load(path_, backend);  // the config generate and serve read
    EXPECT_TRUE(model.ok()) << model.status().message();
    return model.ok() ? (*model)->config().eos_token_ids : std::vector<int32_t>{-1};
  };
  const auto eos = [] { return Gemma3Model().U32("tokenizer.ggml.eos_token_id", 1); };
  EXPECT_EQ(stop_ids(eos().Strings("tokenizer.ggml.tokens", tokens)), (std::vector<int32_t>{1, 10}));
  EXPECT_EQ(stop_ids(eos().U32("tokenizer.ggml.eot_token_id", 10).Strings("tokenizer.ggml.tokens", tokens)),
            (std::vector<int32_t>{1, 10}));
  EXPECT_EQ(stop_ids(eos()), (std::vector<int32_t>{1}));  // no vocabulary in the file, nothing to find
  EXPECT_EQ(stop_ids(LlamaModel().Strings("tokenizer.ggml.tokens", tokens)), (std::vector<int32_t>{2}));
}

// The inverse of convert_hf_to_gguf.py's permute (each head's [first halves; second halves]
// rows written as interleaved pairs).
TEST(GgufWeights, UnpermuteUndoesLlamaCppsPermute) {
  const int64_t heads = 2, head_dim = 6, cols = 3;
  Tensor hf = Tensor::Host(DType::kF32, {heads * head_dim, cols});
  for (int64_t i = 0; i < hf.numel(); ++i) hf.data<float>()[i] = static_cast<float>(i);
  // permute: reshape(heads, 2, head_dim / 2, cols).swapaxes(1, 2)
  Tensor gguf = Tensor::Host(DType::kF32, hf.shape());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t half = 0; half < 2; ++half) {
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const int64_t src = h * head_dim + half * head_dim / 2 + i, dst = h * head_dim + i * 2 + half;
        std::memcpy(gguf.data<float>() + dst * cols, hf.data<float>() + src * cols, cols * 4);
      }
    }
  }
  UnpermuteLlamaRows(gguf, head_dim);
  EXPECT_EQ(std::memcmp(gguf.raw(), hf.raw(), hf.nbytes()), 0);
}

TEST_F(GgufTest, TokenizerFromMetadata) {
  // Byte-level BPE over "ab": 'a', 'b', 'Ġ' and the merge "a b".
  auto tokenizer_file = [&](const std::string& model, const std::string& pre, bool add_bos) {
    GgufBuilder b;
    b.String("tokenizer.ggml.model", model).String("tokenizer.ggml.pre", pre)
        .Strings("tokenizer.ggml.tokens", {"<s>", "a", "b", "ab", "Ġ", "<tool>"})
        .Ints("tokenizer.ggml.token_type", {3, 1, 1, 1, 1, 4})
        .Strings("tokenizer.ggml.merges", {"a b"}).U32("tokenizer.ggml.bos_token_id", 0).Bool("tokenizer.ggml.add_bos_token", add_bos);
    Write(b.Build());
    return LoadGgufTokenizer(path_);
  };
  auto t = tokenizer_file("gpt2", "gpt-2", true);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t->Encode("ab<tool>a b"), (std::vector<int32_t>{0, 3, 5, 1, 4, 2}));
  EXPECT_EQ(*t->Encode("ab", false), (std::vector<int32_t>{3}));
  EXPECT_EQ(*t->Decode({0, 3, 4, 2}), "<s>ab b");
  EXPECT_NE(tokenizer_file("t5", "default", false).status().message().find("'tokenizer.ggml.model' is 't5'"), std::string::npos);
  // Hostile metadata: each an error naming the key.
  auto error_of = [&](GgufBuilder b) {
    Write(b.Build());
    auto t = LoadGgufTokenizer(path_);
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  };
  auto base = [] {
    GgufBuilder b;
    b.String("tokenizer.ggml.model", "gpt2");
    return b;
  };
  EXPECT_NE(error_of(base().Strings("tokenizer.ggml.merges", {"a b"}).Strings("tokenizer.ggml.tokens", {"a", "b", "a"})).find("token 2 (\"a\") repeats token 0"), std::string::npos);
  EXPECT_NE(error_of(base().Strings("tokenizer.ggml.merges", {"a b"}).Strings("tokenizer.ggml.tokens", {"a", "b"}).Ints("tokenizer.ggml.token_type", {1}))
                .find("'tokenizer.ggml.token_type' has 1 entries for 2 tokens"), std::string::npos);
  EXPECT_NE(error_of(base().Strings("tokenizer.ggml.merges", {"a b"}).Strings("tokenizer.ggml.tokens", {"a", "b"}).U32("tokenizer.ggml.bos_token_id", 7))
                .find("'tokenizer.ggml.bos_token_id' is 7, past the 2-token vocabulary"), std::string::npos);
  EXPECT_NE(error_of(base().Strings("tokenizer.ggml.merges", {"a b"}).Strings("tokenizer.ggml.tokens", {"a", "b"}).Bool("tokenizer.ggml.add_bos_token", true))
                .find("names no bos token"), std::string::npos);
  EXPECT_NE(error_of(base().Strings("tokenizer.ggml.tokens", {"a", "b"}).Strings("tokenizer.ggml.merges", {"a c"}))
                .find("merges[0]"), std::string::npos);
  EXPECT_NE(tokenizer_file("gpt2", "mystery", false).status().message().find("'tokenizer.ggml.pre' is 'mystery'"), std::string::npos);
}

// Gemma's SentencePiece vocabulary as transformers' gemma_tokenizer builds it: merges ranked by
// vocabulary order, not by the file's scores (which here prefer "ba"); a token of spaces
// spelled with '▁' and merged like any other; no prefix space.
TEST_F(GgufTest, GemmaTokenizerFromMetadata) {
  GgufBuilder b;
  b.String("general.architecture", "gemma3").String("tokenizer.ggml.model", "llama")
      .Strings("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "\u2581", "ab", "ba", "  "})
      .Ints("tokenizer.ggml.token_type", {3, 3, 3, 3, 1, 1, 1, 1, 1, 4})
      .U32("tokenizer.ggml.bos_token_id", 2).U32("tokenizer.ggml.unknown_token_id", 3).Bool("tokenizer.ggml.add_bos_token", true);
  std::string scores = GgufBuilder::Bytes<uint32_t>(static_cast<uint32_t>(GgufType::kF32)) + GgufBuilder::Bytes<uint64_t>(10);
  for (float s : {0.f, 0.f, 0.f, 0.f, -1.f, -1.f, -1.f, -10.f, -2.f, -3.f}) scores += GgufBuilder::Bytes(s);
  b.Raw("tokenizer.ggml.scores", GgufType::kArray, scores);
  Write(b.Build());
  auto t = LoadGgufTokenizer(path_);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t->Encode("aba"), (std::vector<int32_t>{2, 7, 4}));
  EXPECT_EQ(*t->Encode("a  b", false), (std::vector<int32_t>{4, 9, 5}));
  EXPECT_EQ(*t->Encode(" a", false), (std::vector<int32_t>{6, 4}));
  EXPECT_EQ(*t->Decode({4, 9, 5}), "a  b");
}

// Mutations of a whole model file: bit flips in the header and tensor infos, truncations,
// 64-bit fields overwritten by extreme values. Each load succeeds or fails naming the file.
TEST_F(GgufTest, FuzzedModelFilesLoadOrFail) {
  const std::string original = LlamaModel().Build();
  const size_t header_end = original.find("token_embd.weight") + 200;  // past the metadata, into the tensor infos
  std::mt19937_64 rng(15);
  int loaded = 0;
  const int cases = 400;
  for (int k = 0; k < cases; ++k) {
    std::string bytes = original;
    switch (k % 4) {
      case 0:
        for (int f = 0; f < 1 + static_cast<int>(rng() % 3); ++f) bytes[rng() % header_end] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:
        bytes.resize(rng() % bytes.size());
        break;
      case 2: {
        static const uint64_t kExtremes[] = {0, 1, 3, 31, 33, 1ull << 31, 1ull << 32, 1ull << 62, ~0ull, ~0ull >> 1};
        const uint64_t v = kExtremes[rng() % 10];
        std::memcpy(bytes.data() + rng() % (header_end - 8), &v, 8);
        break;
      }
      case 3:
        for (int f = 0; f < 4; ++f) bytes[header_end + rng() % (bytes.size() - header_end)] ^= static_cast<char>(rng());
        break;
    }
    loaded += LoadError(bytes).empty();
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(loaded, 0);
  EXPECT_LT(loaded, cases);
}

}  // namespace
}  // namespace hsx
