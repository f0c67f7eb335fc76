// Op conformance: one table of cases, each running a Backend op on the CPU backend (the
// f32 reference) and on a target backend from the same seeded inputs, every output of the
// target poisoned (NaN) before the op, compared by value; a failure names the op, the case,
// the target and the worst element. The targets are the CUDA backend as made by default, in
// batch-invariant mode, and with each HSX_* switch that sends an op down another kernel
// (CudaBackendOps.*, skipped without a device). On the CPU the table's cheaper cases run
// against the batch-invariant CPU backend and against themselves with one output value
// perturbed, so the cases and the comparator are checked where there is no GPU
// (BackendOps.*). Ops a plain call cannot set up (paged attention, MoE experts, draft
// verification) have case builders, not exceptions. Not in the table: FillUniform (each
// backend has its own generator), Record/graphs and peak memory (test_cuda_*.cpp).
//
// Tolerances come from bf16 rounding. Inputs are bf16-exact, so both backends start from
// the same values; each rounding of a value to bf16 on the device path costs at most u/2 of
// that value (u = 2^-8, bf16's relative spacing). A case allows (R + 1) u of error relative
// to the largest reference magnitude in each output row, where R counts the roundings on the
// device path to that output (twice the first-order bound), and the extra u covers the f32
// summation order and the device's fast math. R = 0 with no summation is exact (copies,
// gathers, integer results, FP8 codes from the same rule). FP8 values quantized from values
// that differ by a bf16 rounding may land one E4M3 step apart (2^-3 of the row's largest).
// Attention and MoE keep the 2% the hand-written tests measured (R = 5): their outputs
// average many terms (P rounded to bf16 times V; expert outputs), so an output row is far
// smaller than the terms whose rounding it carries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "model/config.h"
#include "tensor/float8.h"

namespace hsx {
namespace {

constexpr double kBf16Unit = 1.0 / 256;  // u = 2^-8

// How an output is compared: within `relative` of each row's largest reference magnitude,
// within `absolute`, or exactly (both zero).
struct Tolerance {
  double relative = 0, absolute = 0;
  static Tolerance Exact() { return {}; }
  static Tolerance Roundings(int r) { return {(r + 1) * kBf16Unit, 0}; }
  static Tolerance Fp8() { return {0.125 + 2 * kBf16Unit, 0}; }
  static Tolerance Absolute(double a) { return {0, a}; }
  bool exact() const { return relative == 0 && absolute == 0; }
};

// One output of a case, on the host as f32 (ints exactly; |v| < 2^24).
struct Output {
  std::string name;
  std::vector<float> values;
  int64_t row = 1;  // elements per row: the unit a relative tolerance is measured against
  Tolerance tol;
};

// A case's view of one backend: inputs drawn from the case's seed in a fixed order (the same
// values on both backends), outputs poisoned, results collected.
class OpEnv {
 public:
  OpEnv(Backend& b, uint64_t seed, bool padding) : b(b), padding(padding), rng_(seed) {}
  Backend& b;
  // Whether attention batches keep their padding sequences (no context: a CUDA graph's
  // padded batch), which only the split-KV decode kernel takes. They are a device contract:
  // the CPU runs the live sequences into zeros, which is what a padding row must hold.
  const bool padding;
  bool on_device() const { return b.device() != Device::kCPU; }
  std::vector<Output> outputs;

  std::mt19937& rng() { return rng_; }
  // Host f32 values that bf16 holds exactly.
  Tensor HostRandom(const Shape& shape, float scale = 1.0f) {
    Tensor t = Tensor::Host(DType::kF32, shape);
    std::normal_distribution<float> dist(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = BF16ToF32(F32ToBF16(dist(rng_)));
    return t;
  }
  // A host f32 tensor on the device in the compute dtype.
  Tensor Activation(const Tensor& host) {
    if (b.compute_dtype() == DType::kF32) return b.Upload(host);
    Tensor h = Tensor::Host(b.compute_dtype(), host.shape());
    ConvertFromF32(host.data<float>(), h.dtype(), h.raw(), static_cast<size_t>(host.numel()));
    return b.Upload(h);
  }
  Tensor Random(const Shape& shape, float scale = 1.0f) { return Activation(HostRandom(shape, scale)); }
  Tensor RandomF32(const Shape& shape, float scale = 1.0f) { return b.Upload(HostRandom(shape, scale)); }
  Tensor Weight(const Shape& shape, float scale) { return b.UploadWeight(HostRandom(shape, scale)); }
  Tensor Ints(const std::vector<int32_t>& v) {
    Tensor t = Tensor::Host(DType::kI32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return b.Upload(t);
  }
  // An output buffer of all-ones bytes (NaN in every float dtype, -1 in int32), so a
  // kernel that skips part of its output cannot pass on what memory held before.
  Tensor Poison(DType dtype, const Shape& shape) {
    Tensor host = Tensor::Host(dtype, shape);
    std::memset(host.raw(), 0xff, host.nbytes());
    return b.Upload(host);
  }
  Tensor PoisonAct(const Shape& shape) { return Poison(b.compute_dtype(), shape); }

  void Add(const std::string& name, const Tensor& t, Tolerance tol, int64_t row = 0) {
    const Tensor host = b.Download(t);
    Output o{name, {}, row > 0 ? row : (t.dim() > 0 ? t.size(-1) : 1), tol};
    o.values.resize(static_cast<size_t>(host.numel()));
    if (host.dtype() == DType::kI32) {
      for (int64_t i = 0; i < host.numel(); ++i) o.values[i] = static_cast<float>(host.data<int32_t>()[i]);
    } else if (host.dtype() == DType::kF8E4M3) {
      // Exact: codes and scales apart (bit for bit); otherwise the values they stand for.
      const std::vector<float> scales = Floats(b.Download(*t.row_scales()));
      const int64_t cols = host.numel() / host.size(0);
      for (int64_t i = 0; i < host.numel(); ++i) {
        o.values[i] = F8E4M3ToF32(host.data<uint8_t>()[i]) * (tol.exact() ? 1.0f : scales[i / cols]);
      }
      if (tol.exact()) outputs.push_back({name + " scales", scales, 1, tol});
    } else {
      o.values = Floats(host);
    }
    outputs.push_back(std::move(o));
  }
  void AddHost(const std::string& name, std::vector<float> values, int64_t row, Tolerance tol) {
    outputs.push_back({name, std::move(values), row, tol});
  }
  static std::vector<float> Floats(const Tensor& host) {
    std::vector<float> v(static_cast<size_t>(host.numel()));
    ConvertToF32(host.dtype(), host.raw(), v.data(), v.size());
    return v;
  }

 private:
  std::mt19937 rng_;
};

struct OpCase {
  std::string op, shape;  // the Backend op, and what this case varies
  std::function<void(OpEnv&)> run;
  bool large = false;  // seconds of CPU work: run against CUDA only, not in the CPU self-checks
};

// Reference magnitudes at or past this are sentinels (the lowest float of a masked logit),
// compared exactly and left out of a row's scale.
bool Special(float v) { return !std::isfinite(v) || std::abs(v) >= 1e30f; }

// Where `got` breaks `want`'s tolerance: the worst element (index, row, values, error), or
// nullopt. A NaN in the reference is poison no op wrote, and must be poison in got too.
std::optional<std::string> Compare(const Output& want, const Output& got) {
  if (want.values.size() != got.values.size())
    return want.name + ": " + std::to_string(got.values.size()) + " values, want " + std::to_string(want.values.size());
  const Tolerance& tol = want.tol;
  double worst = 0;  // error over allowed error; > 1 fails
  size_t worst_i = 0;
  std::string why;
  const size_t row = static_cast<size_t>(std::max<int64_t>(want.row, 1));
  for (size_t r0 = 0; r0 < want.values.size(); r0 += row) {
    const size_t r1 = std::min(r0 + row, want.values.size());
    double scale = 0;
    for (size_t i = r0; i < r1; ++i)
      if (!Special(want.values[i])) scale = std::max(scale, static_cast<double>(std::abs(want.values[i])));
    const double allowed = tol.absolute + tol.relative * scale;
    for (size_t i = r0; i < r1; ++i) {
      const float w = want.values[i], g = got.values[i];
      double e = 0;
      if (std::isnan(w)) {
        e = std::isnan(g) ? 0 : std::numeric_limits<double>::infinity();
      } else if (Special(w) || tol.exact() || Special(g)) {
        e = g == w ? 0 : std::numeric_limits<double>::infinity();
      } else {
        const double d = std::abs(static_cast<double>(g) - w);
        e = d == 0 ? 0 : (allowed > 0 ? d / allowed : std::numeric_limits<double>::infinity());
      }
      if (e > worst) {
        worst = e;
        worst_i = i;
        std::ostringstream s;
        s << "worst element " << i << " (row " << i / row << "): got " << g << ", want " << w << ", error "
          << std::abs(static_cast<double>(g) - w) << " allowed " << (tol.exact() ? 0.0 : allowed);
        why = s.str();
      }
    }
  }
  (void)worst_i;
  if (worst <= 1) return std::nullopt;
  return want.name + ": " + why;
}

// Every output of `got` against `want`'s; one message per output that fails.
std::vector<std::string> CompareAll(const std::vector<Output>& want, const std::vector<Output>& got) {
  if (want.size() != got.size()) return {"the runs gave different numbers of outputs"};
  std::vector<std::string> failures;
  for (size_t i = 0; i < want.size(); ++i) {
    if (auto f = Compare(want[i], got[i])) failures.push_back(*f);
  }
  return failures;
}

std::vector<Output> RunOn(const OpCase& c, Backend& b, uint64_t seed, bool padding = true) {
  OpEnv env(b, seed, padding);
  c.run(env);
  b.Synchronize();
  return std::move(env.outputs);
}

std::vector<std::string> RunCase(const OpCase& c, Backend& reference, Backend& target, uint64_t seed) {
  return CompareAll(RunOn(c, reference, seed), RunOn(c, target, seed));
}

// ---- Case builders ----

RopeTable MakeRope(OpEnv& env, int64_t d, bool partial) {
  RopeSpec spec;
  if (partial) {
    spec.type = RopeSpec::Type::kProportional;  // Gemma 4: a quarter of the pairs rotate
    spec.partial_rotary_factor = 0.25;
  }
  spec.theta = 1e6;
  RopeTable table;
  const std::vector<float> f = RopeInverseFrequencies(spec, static_cast<int>(d), &table.rotary_dims);
  Tensor host = Tensor::Host(DType::kF32, {static_cast<int64_t>(f.size())});
  std::copy(f.begin(), f.end(), host.data<float>());
  table.inv_freq = env.b.Upload(host);
  return table;
}

std::vector<int32_t> Positions(int64_t t, int32_t stride) {
  std::vector<int32_t> p(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) p[i] = static_cast<int32_t>(i * stride % 4000);
  return p;
}

// A paged batch: sequence i has contexts[i] tokens and its last q_lens[i] new (1 if none
// given; a context of 0 is a padding row of one query and no keys, as a CUDA graph's padded
// batch has); blocks shuffled across sequences.
struct PagedBatch {
  std::vector<SequenceSlice> seqs, live;  // live: the sequences with keys
  int64_t rows = 0, num_slots = 0;
  std::vector<int32_t> slots, positions;  // each new row's
};
constexpr int kBlock = 16;

PagedBatch MakePaged(std::mt19937& rng, std::vector<int> contexts, std::vector<int> q_lens, bool padding) {
  if (!padding) {
    for (size_t i = contexts.size(); i-- > 0;) {
      if (contexts[i] != 0) continue;
      contexts.erase(contexts.begin() + static_cast<std::ptrdiff_t>(i));
      if (i < q_lens.size()) q_lens.erase(q_lens.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  int64_t num_blocks = 0;
  for (int ctx : contexts) num_blocks += (ctx + kBlock - 1) / kBlock;
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  PagedBatch p;
  size_t next = 0;
  for (size_t i = 0; i < contexts.size(); ++i) {
    SequenceSlice s;
    s.q_start = static_cast<int32_t>(p.rows);
    s.ctx_len = contexts[i];
    s.q_len = s.ctx_len == 0 || q_lens.empty() ? 1 : std::min(s.ctx_len, q_lens[i % q_lens.size()]);
    for (int b = 0; b < (s.ctx_len + kBlock - 1) / kBlock; ++b) s.block_table.push_back(blocks[next++]);
    for (int j = 0; j < s.q_len; ++j) {
      const int pos = s.ctx_len == 0 ? 0 : s.ctx_len - s.q_len + j;
      p.slots.push_back(s.ctx_len == 0 ? -1 : static_cast<int32_t>(SlotOf(s.block_table, pos, kBlock)));
      p.positions.push_back(pos);
    }
    p.seqs.push_back(s);
    if (s.ctx_len > 0) p.live.push_back(s);
    p.rows += s.q_len;
  }
  p.num_slots = std::max<int64_t>(num_blocks, 1) * kBlock;
  return p;
}

// Cache slots past each context in its last block hold NaN: no output may read them.
void PoisonPastContexts(const PagedBatch& p, int64_t slot_elems, Tensor& cache) {
  for (const SequenceSlice& s : p.seqs) {
    if (s.block_table.empty() || s.ctx_len % kBlock == 0) continue;
    const int64_t first = int64_t{s.block_table.back()} * kBlock + s.ctx_len % kBlock;
    std::fill(cache.data<float>() + first * slot_elems, cache.data<float>() + (first + kBlock - s.ctx_len % kBlock) * slot_elems,
              std::numeric_limits<float>::quiet_NaN());
  }
}

struct AttentionCase {
  int64_t d, heads, kv_heads;
  int window = 0;
  float softcap = 0;
  bool sinks = false;
  std::vector<int> contexts, q_lens;
};

std::string Describe(const AttentionCase& a) {
  std::ostringstream s;
  s << "d" << a.d << "_h" << a.heads << "_kv" << a.kv_heads << "_w" << a.window << "_cap" << a.softcap
    << (a.sinks ? "_sinks" : "") << "_seqs" << a.contexts.size() << "_ctxmax"
    << *std::max_element(a.contexts.begin(), a.contexts.end()) << "_qmax"
    << (a.q_lens.empty() ? 1 : *std::max_element(a.q_lens.begin(), a.q_lens.end()));
  return s.str();
}

// Long contexts and many sequences: seconds on the CPU.
bool Large(const AttentionCase& a) {
  return *std::max_element(a.contexts.begin(), a.contexts.end()) > 4099 || a.contexts.size() > 100 ||
         a.heads * a.d > 2048;
}

AttentionParams Params(const AttentionCase& a, const Tensor* sinks) {
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(a.d));
  p.sliding_window = a.window;
  p.softcap = a.softcap;
  p.block_size = kBlock;
  p.sinks = sinks;
  return p;
}

// A device writes into poison; the CPU into zeros (OpEnv::padding).
Tensor AttentionOut(OpEnv& env, const Shape& shape) {
  return env.on_device() ? env.PoisonAct(shape) : env.Activation(Tensor::Host(DType::kF32, shape));
}

void RunAttention(OpEnv& env, const AttentionCase& a) {
  const PagedBatch p = MakePaged(env.rng(), a.contexts, a.q_lens, env.padding);
  const Tensor q = env.Random({p.rows, a.heads, a.d});
  Tensor kc = env.HostRandom({p.num_slots, a.kv_heads, a.d}), vc = env.HostRandom({p.num_slots, a.kv_heads, a.d});
  PoisonPastContexts(p, a.kv_heads * a.d, kc);
  PoisonPastContexts(p, a.kv_heads * a.d, vc);
  const Tensor sinks = env.RandomF32({a.heads}, 4.0f);  // large enough to take most of some rows
  Tensor out = AttentionOut(env, {p.rows, a.heads, a.d});
  env.b.Attention(q, env.Activation(kc), env.Activation(vc), MakeAttentionBatch(env.b, env.on_device() ? p.seqs : p.live),
                  Params(a, a.sinks ? &sinks : nullptr), out);
  env.Add("out", out, Tolerance::Roundings(5), a.d);
}

struct QkvCase {
  AttentionCase a;
  int norms;  // 0 none, 1 q/k, 2 q/k with 1 + weight, 3 q/k and v
  bool values_are_keys, partial;
};

HeadNorms MakeNorms(const QkvCase& c, const Tensor& qw, const Tensor& kw) {
  HeadNorms n;
  if (c.norms != 0) {
    n.q = &qw;
    n.k = &kw;
  }
  n.v = c.norms == 3;
  n.eps = 1e-6f;
  n.one_plus_weight = c.norms == 2;
  return n;
}

// QkvAttention over a decode or verification step; the first multi-query sequence's first
// row pads (slot -1: its key is the cache's); the step's own slots start as NaN.
void RunQkvAttention(OpEnv& env, const QkvCase& c) {
  const AttentionCase& a = c.a;
  PagedBatch p = MakePaged(env.rng(), a.contexts, a.q_lens, env.padding);
  for (const SequenceSlice& s : p.seqs) {
    if (s.q_len > 1) {
      p.slots[static_cast<size_t>(s.q_start)] = -1;
      break;
    }
  }
  const int64_t width = (a.heads + (c.values_are_keys ? 1 : 2) * a.kv_heads) * a.d;
  const Tensor qkv = env.Random({p.rows, width});
  Tensor kc = env.HostRandom({p.num_slots, a.kv_heads, a.d}), vc = env.HostRandom({p.num_slots, a.kv_heads, a.d});
  for (int32_t slot : p.slots) {
    if (slot < 0) continue;
    for (Tensor* cache : {&kc, &vc})
      std::fill_n(cache->data<float>() + slot * a.kv_heads * a.d, a.kv_heads * a.d, std::numeric_limits<float>::quiet_NaN());
  }
  const Tensor qw = env.Weight({a.d}, 0.2f), kw = env.Weight({a.d}, 0.2f);
  const RopeTable rope = MakeRope(env, a.d, c.partial);
  Tensor k_cache = env.Activation(kc), v_cache = env.Activation(vc);
  Tensor out = AttentionOut(env, {p.rows, a.heads, a.d});
  env.b.QkvAttention(qkv, c.values_are_keys, MakeNorms(c, qw, kw), env.Ints(p.positions), rope, env.Ints(p.slots),
                     k_cache, v_cache, MakeAttentionBatch(env.b, env.on_device() ? p.seqs : p.live), Params(a, nullptr),
                     out);
  env.Add("out", out, Tolerance::Roundings(5), a.d);
  env.Add("k_cache", k_cache, Tolerance::Roundings(2), a.d);
  env.Add("v_cache", v_cache, Tolerance::Roundings(2), a.d);
}

// ---- Token trees (SequenceSlice::tree_base / tree_mask) ----

// One sequence of a tree case. kind 0: a decode row over `committed` keys (no tree).
// kind 1: a target's verification, `extra` causal rows before the root, then the root at
// tree_base = committed + extra and every node at tree_base + 1 + i (position root +
// depth). kind 2: a draft's tree step at depth `extra`: tree_base = committed, the rows
// the depth's nodes in place (node i at tree_base + i, position tree_base + depth - 1),
// nodes before them that no row descends from poisoned (NaN K and V), as the draft's
// unwritten or sibling slots may be. widths: nodes per depth; parents drawn from the case's
// seed, in vLLM's order (a depth's nodes together, children of earlier parents first).
struct TreeSeq {
  int committed, kind, extra;
  std::vector<int> widths;
};

struct TreeCase {
  AttentionCase a;  // its contexts / q_lens unused
  std::vector<TreeSeq> seqs;
};

std::string Describe(const TreeCase& c) {
  std::ostringstream s;
  int most = 0;
  for (const TreeSeq& t : c.seqs) {
    int n = 0;
    for (int w : t.widths) n += w;
    most = std::max(most, n);
  }
  s << "tree_d" << c.a.d << "_h" << c.a.heads << "_kv" << c.a.kv_heads << "_w" << c.a.window << "_cap" << c.a.softcap
    << (c.a.sinks ? "_sinks" : "") << "_seqs" << c.seqs.size() << "_nodesmax" << most;
  for (const TreeSeq& t : c.seqs) s << "_k" << t.kind;
  return s.str();
}

// The tree batch; hidden: per sequence, the slots whose K and V hold NaN.
struct TreeBatch {
  PagedBatch p;
  std::vector<int64_t> hidden;
};

TreeBatch MakeTreeBatch(std::mt19937& rng, const std::vector<TreeSeq>& specs) {
  struct Shape {
    int ctx, q_len, base;
    std::vector<int32_t> parent, depth;
    std::vector<uint64_t> ancestors;
  };
  std::vector<Shape> shapes;
  for (const TreeSeq& t : specs) {
    Shape sh;
    std::vector<int> previous = {-1};
    for (size_t d = 0; d < t.widths.size(); ++d) {
      std::vector<int> ps;
      for (int i = 0; i < t.widths[d]; ++i) ps.push_back(previous[rng() % previous.size()]);
      std::sort(ps.begin(), ps.end());
      previous.clear();
      for (int parent : ps) {
        previous.push_back(static_cast<int>(sh.parent.size()));
        sh.parent.push_back(parent);
        sh.depth.push_back(static_cast<int32_t>(d) + 1);
        sh.ancestors.push_back((uint64_t{1} << (sh.parent.size() - 1)) | (parent >= 0 ? sh.ancestors[parent] : 0));
      }
    }
    const int n = static_cast<int>(sh.parent.size());
    if (t.kind == 0) {
      sh.ctx = t.committed, sh.q_len = 1, sh.base = -1;
    } else if (t.kind == 1) {
      sh.base = t.committed + t.extra, sh.ctx = sh.base + 1 + n, sh.q_len = t.extra + 1 + n;
    } else {
      int first = n, last = -1;
      for (int i = 0; i < n; ++i) {
        if (sh.depth[i] == t.extra) first = std::min(first, i), last = i;
      }
      sh.base = t.committed, sh.ctx = t.committed + last + 1, sh.q_len = last - first + 1;
    }
    shapes.push_back(std::move(sh));
  }
  int64_t num_blocks = 0;
  for (const Shape& sh : shapes) num_blocks += (sh.ctx + kBlock - 1) / kBlock;
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  TreeBatch out;
  PagedBatch& p = out.p;
  size_t next = 0;
  for (size_t k = 0; k < specs.size(); ++k) {
    const TreeSeq& t = specs[k];
    const Shape& sh = shapes[k];
    SequenceSlice s;
    s.q_start = static_cast<int32_t>(p.rows);
    s.ctx_len = sh.ctx;
    s.q_len = sh.q_len;
    s.tree_base = sh.base;
    for (int b = 0; b < (s.ctx_len + kBlock - 1) / kBlock; ++b) s.block_table.push_back(blocks[next++]);
    uint64_t seen = 0;
    for (int j = 0; j < s.q_len; ++j) {
      const int at = s.ctx_len - s.q_len + j;  // the row's place: its KV slot
      int pos = at;
      if (t.kind == 1 && at >= sh.base) {
        const int i = at - sh.base - 1;  // node i, or the root (-1)
        s.tree_mask.push_back(i < 0 ? 1 : sh.ancestors[i] << 1 | 1);
        pos = i < 0 ? sh.base : sh.base + sh.depth[i];
      } else if (t.kind == 2) {
        const int i = at - sh.base;
        s.tree_mask.push_back(sh.ancestors[i]);
        pos = sh.base + t.extra - 1;
      } else if (t.kind == 1) {
        s.tree_mask.push_back(0);
      }
      if (!s.tree_mask.empty()) seen |= s.tree_mask.back();
      p.slots.push_back(static_cast<int32_t>(SlotOf(s.block_table, at, kBlock)));
      p.positions.push_back(pos);
    }
    if (t.kind == 2) {
      for (int i = 0; i < sh.ctx - sh.base; ++i) {
        if (!(seen >> i & 1)) out.hidden.push_back(SlotOf(s.block_table, sh.base + i, kBlock));
      }
    }
    p.seqs.push_back(s);
    p.live.push_back(s);
    p.rows += s.q_len;
  }
  p.num_slots = std::max<int64_t>(num_blocks, 1) * kBlock;
  return out;
}

void PoisonSlots(const std::vector<int64_t>& slots, int64_t slot_elems, Tensor& cache) {
  for (int64_t slot : slots)
    std::fill_n(cache.data<float>() + slot * slot_elems, slot_elems, std::numeric_limits<float>::quiet_NaN());
}

void RunTreeAttention(OpEnv& env, const TreeCase& c) {
  const AttentionCase& a = c.a;
  const TreeBatch t = MakeTreeBatch(env.rng(), c.seqs);
  const PagedBatch& p = t.p;
  const Tensor q = env.Random({p.rows, a.heads, a.d});
  Tensor kc = env.HostRandom({p.num_slots, a.kv_heads, a.d}), vc = env.HostRandom({p.num_slots, a.kv_heads, a.d});
  for (Tensor* cache : {&kc, &vc}) {
    PoisonPastContexts(p, a.kv_heads * a.d, *cache);
    PoisonSlots(t.hidden, a.kv_heads * a.d, *cache);
  }
  const Tensor sinks = env.RandomF32({a.heads}, 4.0f);
  Tensor out = AttentionOut(env, {p.rows, a.heads, a.d});
  env.b.Attention(q, env.Activation(kc), env.Activation(vc), MakeAttentionBatch(env.b, p.seqs),
                  Params(a, a.sinks ? &sinks : nullptr), out);
  env.Add("out", out, Tolerance::Roundings(5), a.d);
}

// QkvAttention of a tree step: the step's own slots start as NaN, the rows' positions are
// their tree positions (root + depth), not their places.
void RunTreeQkvAttention(OpEnv& env, const TreeCase& c, int norms, bool partial) {
  const AttentionCase& a = c.a;
  const QkvCase qc{a, norms, false, partial};
  const TreeBatch t = MakeTreeBatch(env.rng(), c.seqs);
  const PagedBatch& p = t.p;
  const int64_t width = (a.heads + 2 * a.kv_heads) * a.d;
  const Tensor qkv = env.Random({p.rows, width});
  Tensor kc = env.HostRandom({p.num_slots, a.kv_heads, a.d}), vc = env.HostRandom({p.num_slots, a.kv_heads, a.d});
  std::vector<int64_t> own(p.slots.begin(), p.slots.end());
  for (Tensor* cache : {&kc, &vc}) {
    PoisonPastContexts(p, a.kv_heads * a.d, *cache);
    PoisonSlots(t.hidden, a.kv_heads * a.d, *cache);
    PoisonSlots(own, a.kv_heads * a.d, *cache);
  }
  const Tensor qw = env.Weight({a.d}, 0.2f), kw = env.Weight({a.d}, 0.2f);
  const RopeTable rope = MakeRope(env, a.d, partial);
  Tensor k_cache = env.Activation(kc), v_cache = env.Activation(vc);
  Tensor out = AttentionOut(env, {p.rows, a.heads, a.d});
  env.b.QkvAttention(qkv, false, MakeNorms(qc, qw, kw), env.Ints(p.positions), rope, env.Ints(p.slots), k_cache,
                     v_cache, MakeAttentionBatch(env.b, p.seqs), Params(a, nullptr), out);
  env.Add("out", out, Tolerance::Roundings(5), a.d);
  env.Add("k_cache", k_cache, Tolerance::Roundings(2), a.d);
  env.Add("v_cache", v_cache, Tolerance::Roundings(2), a.d);
}

// NormRopeStoreKV on t rows, distinct slots in reverse order, row 2 padding (slot -1);
// caches poisoned, so slots no row names must stay poison.
void RunNormRopeStoreKV(OpEnv& env, int64_t t, const QkvCase& c) {
  const AttentionCase& a = c.a;
  const int64_t num_slots = 2 * t + 10;
  std::vector<int32_t> slots;
  for (int64_t i = 0; i < t; ++i) slots.push_back(i == 2 ? -1 : static_cast<int32_t>(num_slots - 1 - 2 * i));
  const int64_t width = (a.heads + (c.values_are_keys ? 1 : 2) * a.kv_heads) * a.d;
  const Tensor qkv = env.Random({t, width});
  const Tensor qw = env.Weight({a.d}, 0.2f), kw = env.Weight({a.d}, 0.2f);
  const RopeTable rope = MakeRope(env, a.d, c.partial);
  Tensor kc = env.PoisonAct({num_slots, a.kv_heads, a.d}), vc = env.PoisonAct({num_slots, a.kv_heads, a.d});
  Tensor q = env.PoisonAct({t, a.heads, a.d});
  env.b.NormRopeStoreKV(qkv, c.values_are_keys, MakeNorms(c, qw, kw), env.Ints(Positions(t, 1231)), rope,
                        env.Ints(slots), kc, vc, q);
  env.Add("q", q, Tolerance::Roundings(2), a.d);
  env.Add("k_cache", kc, Tolerance::Roundings(2), a.d);
  env.Add("v_cache", vc, Tolerance::Roundings(2), a.d);
  env.Add("qkv (unchanged)", qkv, Tolerance::Exact());
}

void RunMoe(OpEnv& env, int64_t tokens, int experts, int top_k, bool gpt_oss) {
  const int64_t hidden = 64, inter = 48;
  const Tensor x = env.Random({tokens, hidden}, gpt_oss ? 8.0f : 1.0f);  // gpt-oss: so the clamp cuts
  const Tensor logits = env.RandomF32({tokens, experts});
  MoeWeights w;
  for (int e = 0; e < experts; ++e) {
    w.gate.push_back(env.Weight({inter, hidden}, 0.15f));
    w.up.push_back(env.Weight({inter, hidden}, 0.15f));
    w.down.push_back(env.Weight({hidden, inter}, 0.15f));
  }
  MoeSpec spec;
  spec.top_k = top_k;
  spec.renormalize = true;
  if (gpt_oss) {
    spec.swiglu_limit = 7.0f;
    spec.swiglu_alpha = 1.702f;
    w.gate_bias = env.Weight({experts, inter}, 0.5f);
    w.up_bias = env.Weight({experts, inter}, 0.5f);
    w.down_bias = env.Weight({experts, hidden}, 0.5f);
  }
  Tensor out = env.PoisonAct({tokens, hidden});
  env.b.MoeMlp(x, logits, w, spec, out);
  env.Add("out", out, Tolerance::Roundings(5));
}

std::string Dims(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (auto [name, v] : dims) s += (s.empty() ? "" : "_") + std::string(name) + std::to_string(v);
  return s;
}

// ---- The table ----

std::vector<OpCase> Table() {
  std::vector<OpCase> t;
  const auto add = [&](std::string op, std::string shape, std::function<void(OpEnv&)> run, bool large = false) {
    t.push_back({std::move(op), std::move(shape), std::move(run), large});
  };
  const Activation acts[] = {Activation::kSilu, Activation::kGeluTanh};
  const char* act_names[] = {"silu", "gelu"};

  // Linear: the GEMV (m <= 8), cuBLASLt past it, odd k (no vector loads), wide rows; bf16
  // or f32 output; with and without a bias (added after the product: one more rounding).
  struct Mnk { int64_t m, n, k; };
  for (const Mnk s : {Mnk{1, 64, 64}, Mnk{3, 300, 100}, Mnk{3, 300, 4100}, Mnk{3, 300, 256}, Mnk{8, 1000, 4096},
                      Mnk{9, 777, 2056}, Mnk{37, 96, 200}, Mnk{513, 1000, 136}, Mnk{1, 4097, 1024}}) {
    for (const DType out : {DType::kBF16, DType::kF32}) {
      for (const bool bias : {false, true}) {
        add("Linear", Dims({{"m", s.m}, {"n", s.n}, {"k", s.k}}) + (out == DType::kF32 ? "_f32out" : "_actout") +
                          (bias ? "_bias" : ""),
            [=](OpEnv& env) {
              const Tensor x = env.Random({s.m, s.k}), w = env.Weight({s.n, s.k}, 0.1f), b = env.Weight({s.n}, 1.0f);
              Tensor y = out == DType::kF32 ? env.Poison(DType::kF32, {s.m, s.n}) : env.PoisonAct({s.m, s.n});
              env.b.Linear(x, w, bias ? &b : nullptr, y);
              env.Add("y", y, Tolerance::Roundings((out == DType::kF32 ? 0 : 1) + (bias ? 1 : 0)));
            });
      }
    }
  }
  // FP8: weights and x quantized by one rule on both backends, so the products are of the
  // same codes; a zero row takes scale 1.
  for (const int64_t k : {208, 4096, 12288, 28672, 32784}) {  // 2-16 register chunks, and past them
    add("QuantizeRowsFp8", Dims({{"rows", 300}, {"k", k}}), [=](OpEnv& env) {
      Tensor w = env.HostRandom({300, k}, 0.05f);
      std::fill(w.data<float>() + k, w.data<float>() + 2 * k, 0.0f);
      env.Add("codes", env.b.QuantizeRowsFp8(env.b.UploadWeight(w)), Tolerance::Exact());
    }, k > 12288);
  }
  for (const Mnk s : {Mnk{1, 64, 64}, Mnk{7, 1024, 4096}, Mnk{33, 96, 208}, Mnk{300, 4096, 4096}}) {
    add("LinearFp8", Dims({{"m", s.m}, {"n", s.n}, {"k", s.k}}), [=](OpEnv& env) {
      const Tensor x = env.Random({s.m, s.k}), w = env.Weight({s.n, s.k}, 0.05f), b = env.Weight({s.n}, 1.0f);
      Tensor y = env.PoisonAct({s.m, s.n});
      env.b.Linear(x, env.b.QuantizeRowsFp8(w), &b, y);
      env.Add("y", y, Tolerance::Roundings(2));
    }, s.m * s.n * s.k > 1e9);
  }

  // Norms: widths of one warp to many register chunks a thread, rows not a multiple of a
  // block's, in place, without a weight, 1 + weight.
  for (const int64_t d : {16, 32, 64, 100, 128, 256, 512, 1000, 4096, 5376, 12288}) {
    for (const int64_t rows : {1, 37, 301}) {
      for (const int w : {0, 1, 2}) {  // no weight, weight, 1 + weight
        add("RmsNorm", Dims({{"rows", rows}, {"d", d}, {"weight", w}}), [=](OpEnv& env) {
          const Tensor x = env.Random({rows, d}), wt = env.Weight({d}, 0.2f);
          Tensor y = env.PoisonAct({rows, d});
          env.b.RmsNorm(x, w ? &wt : nullptr, 1e-6f, w == 2, y);
          env.Add("y", y, Tolerance::Roundings(1));
        });
        add("AddRmsNorm", Dims({{"rows", rows}, {"d", d}, {"weight", w}}), [=](OpEnv& env) {
          Tensor residual = env.Random({rows, d});
          const Tensor branch = env.Random({rows, d}), wt = env.Weight({d}, 0.2f);
          Tensor y = env.PoisonAct({rows, d});
          env.b.AddRmsNorm(residual, branch, w ? &wt : nullptr, 1e-6f, w == 2, y);
          env.Add("residual", residual, Tolerance::Roundings(1));
          env.Add("y", y, Tolerance::Roundings(2));  // the device norms the rounded residual
        });
        if (d % 16 != 0) continue;  // FP8 rows are a multiple of 16 bytes (the device refuses others)
        add("RmsNormFp8", Dims({{"rows", rows}, {"d", d}, {"weight", w}}), [=](OpEnv& env) {
          Tensor x = env.Random({rows, d}, 3.0f);
          const Tensor branch = env.Random({rows, d}), wt = env.Weight({d}, 0.5f);
          const Tensor* b = rows == 37 ? nullptr : &branch;  // 37 rows: RmsNorm's, the others AddRmsNorm's
          env.Add("normed", env.b.RmsNormFp8(x, b, w ? &wt : nullptr, 1e-6f, w == 2), Tolerance::Fp8());
          env.Add("residual", x, Tolerance::Roundings(1));
        });
      }
    }
    add("RmsNorm", Dims({{"rows", 29}, {"d", d}}) + "_in_place", [=](OpEnv& env) {
      Tensor x = env.Random({29, 3, d});
      const Tensor wt = env.Weight({d}, 0.2f);
      env.b.RmsNorm(x, &wt, 1e-6f, true, x);
      env.Add("x", x, Tolerance::Roundings(1));
    });
  }
  for (const int64_t d : {16, 32, 128, 256, 512}) {
    for (const bool partial : {false, true}) {
      add("Rope", Dims({{"t", 29}, {"heads", 3}, {"d", d}}) + (partial ? "_partial" : ""), [=](OpEnv& env) {
        Tensor x = env.Random({29, 3, d});
        env.b.Rope(x, env.Ints(Positions(29, 97)), MakeRope(env, d, partial));
        env.Add("x", x, Tolerance::Roundings(2));
      });
      add("RmsNormRope", Dims({{"t", 29}, {"heads", 3}, {"d", d}}) + (partial ? "_partial" : ""), [=](OpEnv& env) {
        Tensor x = env.Random({29, 3, d});
        const Tensor w = env.Weight({d}, 0.2f);
        env.b.RmsNormRope(x, w, 1e-6f, false, env.Ints(Positions(29, 97)), MakeRope(env, d, partial));
        env.Add("x", x, Tolerance::Roundings(2));
      });
    }
  }

  // Elementwise, on sizes with and without a vector tail.
  for (const int64_t n : {1, 7, 300, 4099}) {
    const Shape shape{3, n};
    add("Add", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      Tensor acc = env.Random(shape);
      env.b.Add(acc, env.Random(shape));
      env.Add("acc", acc, Tolerance::Roundings(1));
    });
    add("Multiply", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      Tensor acc = env.Random(shape);
      env.b.Multiply(acc, env.Random(shape));
      env.Add("acc", acc, Tolerance::Roundings(1));
    });
    add("Scale", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      Tensor x = env.Random(shape);
      env.b.Scale(x, 0.37f);
      env.Add("x", x, Tolerance::Roundings(1));
    });
    add("ScaleByTensor", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      Tensor x = env.Random(shape);
      env.b.ScaleByTensor(x, env.Weight({1}, 1.0f));  // a layer scalar: a weight
      env.Add("x", x, Tolerance::Roundings(1));
    });
    add("Softcap", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      Tensor x = env.Random(shape, 30.0f);
      env.b.Softcap(x, 30.0f);
      env.Add("x", x, Tolerance::Roundings(2));
    });
    for (int a = 0; a < 2; ++a) {
      add("Activate", Dims({{"rows", 3}, {"cols", n}}) + "_" + act_names[a], [=](OpEnv& env) {
        Tensor x = env.Random(shape, 3.0f);
        env.b.Activate(x, acts[a]);
        env.Add("x", x, Tolerance::Roundings(2));
      });
    }
    add("Copy", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      const Tensor x = env.Random(shape);
      Tensor y = env.PoisonAct(shape);
      env.b.Copy(x, y);
      env.Add("y", y, Tolerance::Exact());
    });
  }

  // Gated activations: vectorized (a multiple of 8 columns) and not; 1-16 register chunks.
  for (const int64_t cols : {16, 208, 300, 301, 3072, 12288}) {
    for (int a = 0; a < 2; ++a) {
      add("GatedActivation", Dims({{"rows", 7}, {"cols", cols}}) + "_" + act_names[a], [=](OpEnv& env) {
        const Tensor gate_up = env.Random({7, 2 * cols}, 2.0f);
        Tensor out = env.PoisonAct({7, cols});
        env.b.GatedActivation(gate_up, acts[a], out);
        env.Add("out", out, Tolerance::Roundings(2));
      });
      if (cols % 16 != 0) continue;  // FP8 rows are a multiple of 16 bytes
      add("GatedActivationFp8", Dims({{"rows", 37}, {"cols", cols}}) + "_" + act_names[a], [=](OpEnv& env) {
        const Tensor gate_up = env.Random({37, 2 * cols}, 2.0f);
        env.Add("out", env.b.GatedActivationFp8(gate_up, acts[a]), Tolerance::Fp8());
      });
    }
  }
  // GatedLinear: the gated GEMV (m <= 8), past it, prefill sizes; odd n, short rows.
  for (const Mnk s : {Mnk{1, 1001, 4096}, Mnk{5, 3, 8}, Mnk{8, 37, 200}, Mnk{9, 777, 2056}, Mnk{128, 300, 512}}) {
    for (int a = 0; a < 2; ++a) {
      add("GatedLinear", Dims({{"m", s.m}, {"n", s.n}, {"k", s.k}}) + "_" + act_names[a], [=](OpEnv& env) {
        const Tensor x = env.Random({s.m, s.k}), w = env.Weight({2 * s.n, s.k}, 0.1f);
        Tensor out = env.PoisonAct({s.m, s.n});
        env.b.GatedLinear(x, w, acts[a], out);
        env.Add("out", out, Tolerance::Roundings(3));  // gate and up products, then the output
      });
    }
  }

  // Rows and columns.
  for (const int64_t h : {16, 1000, 4096}) {
    for (const bool scaled : {false, true}) {  // scale 1 copies rows; Gemma's sqrt(h) rounds once
      add("Embed", Dims({{"t", 9}, {"h", h}}) + (scaled ? "_scaled" : ""), [=](OpEnv& env) {
        const Tensor table = env.Weight({50, h}, 1.0f);
        std::vector<int32_t> ids;
        for (int i = 0; i < 9; ++i) ids.push_back(static_cast<int32_t>((i * 17) % 50));
        Tensor out = env.PoisonAct({9, h});
        env.b.Embed(table, env.Ints(ids), scaled ? std::sqrt(static_cast<float>(h)) : 1.0f, out);
        env.Add("out", out, scaled ? Tolerance::Roundings(1) : Tolerance::Exact());
      });
    }
  }
  for (const int64_t cols : {7, 300, 4096}) {
    add("GatherRows", Dims({{"rows", 5}, {"cols", cols}}), [=](OpEnv& env) {
      const Tensor x = env.Random({40, cols});
      Tensor out = env.PoisonAct({5, cols});
      env.b.GatherRows(x, {39, 0, 17, 17, 3}, out);
      env.Add("out", out, Tolerance::Exact());
    });
    add("GatherRowsAt", Dims({{"rows", 6}, {"cols", cols}}), [=](OpEnv& env) {
      const Tensor x = env.Random({40, cols});
      Tensor out = env.PoisonAct({6, cols});
      env.b.GatherRowsAt(x, env.Ints({2, 39, 0, 17, 17, 3}), out);
      env.Add("out", out, Tolerance::Exact());
    });
    add("SliceColumns", Dims({{"rows", 37}, {"cols", cols}}), [=](OpEnv& env) {
      const Tensor x = env.Random({37, cols + 9});
      Tensor out = env.PoisonAct({37, cols});
      env.b.SliceColumns(x, 5, out);
      env.Add("out", out, Tolerance::Exact());
    });
  }
  for (const bool f32 : {false, true}) {
    // Two writes tile columns [64, 300); [0, 64) must stay poison.
    add("WriteColumns", std::string("rows37_cols300") + (f32 ? "_f32" : "_act"), [=](OpEnv& env) {
      Tensor out = f32 ? env.Poison(DType::kF32, {37, 300}) : env.PoisonAct({37, 300});
      for (auto [begin, width] : {std::pair<int64_t, int64_t>{64, 128}, {192, 108}}) {
        const Tensor x = f32 ? env.RandomF32({37, width}) : env.Random({37, width});
        env.b.WriteColumns(x, begin, out);
      }
      env.Add("out", out, Tolerance::Exact());
    });
  }

  // KV storage: distinct slots, one padding row (slot -1), caches poisoned.
  for (const int64_t d : {64, 128}) {
    add("StoreKV", Dims({{"t", 9}, {"kv_heads", 2}, {"d", d}}), [=](OpEnv& env) {
      const Tensor k = env.Random({9, 2, d}), v = env.Random({9, 2, d});
      Tensor kc = env.PoisonAct({30, 2, d}), vc = env.PoisonAct({30, 2, d});
      env.b.StoreKV(k, v, env.Ints({29, 0, -1, 5, 6, 22, 13, 1, 2}), kc, vc);
      env.Add("k_cache", kc, Tolerance::Exact());
      env.Add("v_cache", vc, Tolerance::Exact());
    });
  }
  struct NrsShape { int64_t heads, kv_heads, d; };
  for (const int64_t rows : {7, 300}) {
    for (const NrsShape s : {NrsShape{32, 8, 128}, NrsShape{4, 2, 16}, NrsShape{8, 1, 512}, NrsShape{6, 3, 256}}) {
      for (int norms = 0; norms < 4; ++norms) {
        for (const bool vk : {false, true}) {
          const QkvCase c{{s.d, s.heads, s.kv_heads, 0, 0, false, {}, {}}, norms, vk, norms % 2 == 1};
          add("NormRopeStoreKV",
              Dims({{"t", rows}, {"h", s.heads}, {"kv", s.kv_heads}, {"d", s.d}, {"norms", norms}}) +
                  (vk ? "_v_is_k" : "") + (c.partial ? "_partial" : ""),
              [=](OpEnv& env) { RunNormRopeStoreKV(env, rows, c); });
        }
      }
    }
  }

  // Attention (case builder: paged caches, shuffled blocks, NaN past each context).
  const std::vector<int> mixed = {1, 0, 15, 16, 17, 100, 1000, 0, 4099, 33000, 2, 513};
  std::mt19937 shapes_rng(6);
  std::vector<int> many(200);
  for (int& c : many) c = std::uniform_int_distribution<int>(0, 300)(shapes_rng);
  const std::vector<int> prefill = {1, 17, 300, 777, 200, 2000}, prefill_q = {1, 17, 5, 1, 130, 300};
  const std::vector<int> verify = {1, 0, 15, 16, 17, 100, 1000, 4099, 33000, 2, 513, 8},
                         verify_q = {4, 1, 8, 2, 5, 3, 7, 6};
  std::vector<AttentionCase> attention = {
      // prefill and chunked prefill, every head dim, GQA groups 1-8, windows, softcap
      {16, 8, 2, 0, 0, false, prefill, prefill_q},     {32, 4, 2, 16, 0, false, prefill, prefill_q},
      {64, 8, 2, 0, 30, false, prefill, prefill_q},    {128, 8, 2, 0, 0, false, prefill, prefill_q},
      {128, 4, 4, 100, 0, false, prefill, prefill_q},  {128, 16, 2, 0, 0, false, prefill, prefill_q},
      {128, 6, 2, 0, 0, false, prefill, prefill_q},    {128, 32, 8, 0, 50, false, prefill, prefill_q},
      {128, 2, 1, 300, 0, false, prefill, prefill_q},  {256, 8, 2, 0, 0, false, prefill, prefill_q},
      {256, 8, 4, 100, 0, false, prefill, prefill_q},  {256, 4, 1, 0, 30, false, prefill, prefill_q},
      {512, 8, 2, 0, 0, false, prefill, prefill_q},    {512, 8, 1, 100, 0, false, prefill, prefill_q},
      // decode: padding rows, contexts off the block size, 1 to 33k (the most splits)
      {16, 4, 2, 0, 0, false, mixed, {}},              {32, 4, 1, 100, 0, false, mixed, {}},
      {64, 8, 8, 0, 0, false, mixed, {}},              {64, 8, 4, 0, 30, false, mixed, {}},
      {128, 16, 4, 0, 0, false, mixed, {}},            {128, 16, 2, 1000, 0, false, mixed, {}},
      {128, 40, 2, 0, 0, false, mixed, {}},            {128, 32, 8, 0, 0, false, many, {}},
      {128, 16, 2, 0, 0, false, {1, 32768}, {}},       {256, 8, 2, 0, 50, false, mixed, {}},
      {256, 2, 2, 4096, 0, false, mixed, {}},          {512, 8, 1, 0, 0, false, mixed, {}},
      {512, 4, 1, 300, 20, false, {32768, 1}, {}},
      // verification: 1-8 queries a sequence
      {64, 8, 8, 0, 0, false, verify, verify_q},       {64, 8, 4, 0, 30, false, verify, verify_q},
      {128, 32, 8, 0, 0, false, verify, verify_q},     {128, 16, 2, 1000, 0, false, verify, verify_q},
      {128, 4, 1, 5, 0, false, verify, verify_q},      {128, 40, 2, 0, 0, false, verify, verify_q},
      {256, 8, 2, 0, 50, false, verify, verify_q},     {512, 4, 1, 300, 20, false, verify, verify_q},
      // contexts past half of H200's L2 (the wgmma kernel's KV-head sections)
      {128, 8, 8, 0, 0, false, {60000, 700}, {40, 300}}, {128, 16, 8, 5000, 0, false, {60000, 700}, {40, 300}},
      {256, 4, 2, 0, 0, false, {60000, 700}, {40, 300}},
  };
  // gpt-oss's sinks (large enough to take most of some rows' probability), windows
  // included: prefill and chunked prefill, decode over few blocks (the cluster merge) and
  // many (the merge kernel), verification rows.
  std::vector<int> many_short(200);
  for (int& c : many_short) c = std::uniform_int_distribution<int>(1, 300)(shapes_rng);
  for (auto [d, heads, kv_heads, window] : std::vector<std::tuple<int64_t, int64_t, int64_t, int>>{
           {64, 8, 2, 16}, {64, 64, 8, 128}, {128, 8, 2, 0}, {128, 16, 2, 100}, {256, 4, 2, 0}, {512, 4, 1, 0}}) {
    attention.push_back({d, heads, kv_heads, window, 0, true, {1, 17, 300, 200, 700}, {1, 17, 5, 130, 700}});
    attention.push_back({d, heads, kv_heads, window, 0, true, {1, 32768}, {}});
    attention.push_back({d, heads, kv_heads, window, 0, true, many_short, {}});
    attention.push_back({d, heads, kv_heads, window, 0, true, {5000, 40}, {3, 8}});
  }
  for (const AttentionCase& a : attention) {
    add("Attention", Describe(a), [=](OpEnv& env) { RunAttention(env, a); }, Large(a));
  }
  const std::vector<QkvCase> qkv_cases = {
      {{128, 32, 8, 0, 0, false, {512}, {1}}, 1, false, false},
      {{128, 32, 8, 0, 0, false, {259}, {8}}, 1, false, false},
      {{128, 32, 8, 0, 0, false, {1, 0, 33, 4099, 100, 17, 2000, 64}, {1, 1, 3, 8, 2, 5, 8, 7}}, 1, false, false},
      {{64, 8, 8, 0, 0, false, {5, 300, 1000}, {1, 8, 2}}, 0, false, false},
      {{16, 4, 2, 0, 0, false, {9, 40}, {2, 1}}, 1, false, true},
      {{256, 8, 2, 1000, 30, false, {3000, 20, 1}, {1, 6, 1}}, 2, true, true},
      {{512, 4, 1, 300, 20, false, {32768, 9, 600}, {1, 3, 8}}, 3, true, true},
      {{256, 16, 16, 0, 0, false, {128, 129}, {8, 8}}, 3, false, false},
  };
  for (const QkvCase& c : qkv_cases) {
    add("QkvAttention", Describe(c.a) + "_norms" + std::to_string(c.norms) + (c.values_are_keys ? "_v_is_k" : "") +
                            (c.partial ? "_partial" : ""),
        [=](OpEnv& env) { RunQkvAttention(env, c); }, Large(c.a));
  }

  // Token trees: verification steps small enough for the split-KV kernel (8 rows) and
  // larger (the mma.sync kernels; 63 nodes, every bit of the mask), a draft's tree steps at
  // each depth with unseen nodes poisoned, beside plain decode rows; windows shorter than
  // the tree (a row's window runs from its tree position, not its place), softcap, sinks.
  const std::vector<TreeSeq> small_trees = {{40, 1, 0, {2, 3, 2}}, {7, 0, 0, {}}, {300, 1, 0, {3, 1}},
                                            {17, 2, 2, {3, 4, 2}}, {100, 2, 1, {4, 2}}};
  const std::vector<TreeSeq> large_trees = {{130, 1, 2, {4, 8, 8, 6}}, {33, 0, 0, {}}, {500, 1, 0, {8, 16, 20, 19}},
                                            {61, 2, 3, {4, 8, 9, 5}}, {2000, 2, 2, {6, 10, 3}}};
  std::vector<TreeCase> tree_cases;
  for (const auto& [d, heads, kv_heads, window, softcap, sinks] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int, float, bool>>{{64, 8, 2, 0, 0, false},
                                                                            {128, 16, 4, 0, 0, false},
                                                                            {128, 8, 2, 20, 0, false},
                                                                            {128, 8, 8, 0, 30, true},
                                                                            {256, 8, 2, 10, 0, false},
                                                                            {512, 4, 1, 0, 20, false},
                                                                            {16, 4, 2, 7, 0, true}}) {
    for (const auto* seqs : {&small_trees, &large_trees}) {
      tree_cases.push_back({{d, heads, kv_heads, window, softcap, sinks, {1}, {}}, *seqs});
    }
  }
  for (const TreeCase& c : tree_cases) {
    add("Attention", Describe(c), [=](OpEnv& env) { RunTreeAttention(env, c); }, false);
  }
  for (size_t i = 0; i < tree_cases.size(); ++i) {
    const TreeCase& c = tree_cases[i];
    if (c.a.sinks) continue;  // QkvAttention takes no sinks
    const int norms = static_cast<int>(i % 3);
    add("QkvAttention", Describe(c) + "_norms" + std::to_string(norms) + (i % 2 ? "_partial" : ""),
        [=](OpEnv& env) { RunTreeQkvAttention(env, c, norms, i % 2 == 1); }, false);
  }
  // A tree's accepted KV moved onto its path: chains where a destination is another move's
  // source, and more moves than shared memory stages (the scratch path).
  for (const int64_t n : {3, 63, 9000}) {
    add("MoveRows", Dims({{"n", n}}), [=](OpEnv& env) {
      const int64_t slots = 2 * n + 20;
      Tensor x = env.Random({slots, 2, 64});
      std::vector<int32_t> order(static_cast<size_t>(slots));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), env.rng());
      // Sources: the first n of a shuffle; destinations: n distinct slots that overlap them.
      std::vector<int32_t> moves(order.begin(), order.begin() + n);
      moves.insert(moves.end(), order.begin() + n / 2, order.begin() + n / 2 + n);
      env.b.MoveRows(x, env.Ints(moves));
      env.Add("x", x, Tolerance::Exact());
    });
  }

  // EAGLE-3's draft input: norm widths of each thread count, one off a multiple of 8.
  for (const int64_t h : {16, 1000, 1024, 4096, 5120}) {
    for (const bool normed_residual : {false, true}) {
      add("DraftLayerInput", Dims({{"rows", 7}, {"h", h}}) + (normed_residual ? "_normed_residual" : ""),
          [=](OpEnv& env) {
            const Tensor table = env.Weight({50, h}, 2.0f), hidden = env.Random({7, h}, 3.0f);
            const Tensor embed_norm = env.Weight({h}, 0.5f), hidden_norm = env.Weight({h}, 0.5f);
            std::vector<int32_t> ids;
            for (int i = 0; i < 7; ++i) ids.push_back(static_cast<int32_t>(env.rng()() % 50));
            Tensor out = env.PoisonAct({7, 2 * h}), residual = env.PoisonAct({7, h});
            env.b.DraftLayerInput(table, env.Ints(ids), hidden, embed_norm, hidden_norm, 1e-6f, normed_residual, out,
                                  residual);
            env.Add("out", out, Tolerance::Roundings(2), h);  // each half against its own largest
            env.Add("residual", residual, Tolerance::Roundings(2));
          });
    }
  }

  // MoE: routing, grouping, the experts' GEMMs; gpt-oss's biases and clamped SwiGLU. On
  // CUDA up to 256 tokens run the host-free grouped GEMVs (the no_moe_gemv target: the
  // host-sized grouped GEMMs), more tokens (300) the GEMMs: decode sizes with 8, 32 (gpt-oss
  // 20b) and 128 (120b, Qwen3-30B-A3B) experts, from 1 expert used to all of them, several
  // rows an expert (100 tokens) where the GEMVs loop over row groups.
  std::vector<std::tuple<int64_t, int, int>> moe_shapes = {{1, 8, 2}, {77, 8, 2}, {300, 16, 4}};
  for (int64_t tokens : {1, 4, 32, 100}) {
    for (int experts : {8, 32, 128}) moe_shapes.emplace_back(tokens, experts, 4);
  }
  for (auto [tokens, experts, top_k] : moe_shapes) {
    for (const bool gpt_oss : {false, true}) {
      add("MoeMlp", Dims({{"tokens", tokens}, {"experts", experts}, {"top", top_k}}) + (gpt_oss ? "_gpt_oss" : ""),
          [=](OpEnv& env) { RunMoe(env, tokens, experts, top_k, gpt_oss); });
    }
  }

  // Gemma 4 MTP's centroid-masked head: the fixture's shape, E2B's (2048 centroids, top 32,
  // 262144 tokens), odd ones; ties (halves) and a NaN among the centroid scores. The logits
  // are f32 sums of the same bf16 products on both sides.
  for (auto [rows, hidden, clusters, vocab, top_k] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>>{
           {1, 32, 16, 512, 4}, {3, 256, 2048, 262144, 32}, {7, 40, 5, 35, 5}, {2, 72, 300, 600, 256}}) {
    add("CentroidMaskedLogits", Dims({{"rows", rows}, {"h", hidden}, {"clusters", clusters}, {"vocab", vocab}, {"top", top_k}}),
        [=](OpEnv& env) {
          const Tensor x = env.Random({rows, hidden});
          Tensor centroids = env.HostRandom({rows, clusters});
          for (int64_t i = 0; i < centroids.numel(); ++i)
            centroids.data<float>()[i] = std::round(centroids.data<float>()[i] * 2.0f) / 2.0f;
          centroids.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
          std::vector<int32_t> order(static_cast<size_t>(vocab));
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), env.rng());
          Tensor ordering = Tensor::Host(DType::kI32, {clusters, vocab / clusters});
          std::copy(order.begin(), order.end(), ordering.data<int32_t>());
          const Tensor lm_head = env.Weight({vocab, hidden}, 1.0f);
          Tensor logits = env.Poison(DType::kF32, {rows, vocab});
          env.b.CentroidMaskedLogits(x, env.b.Upload(centroids), env.b.Upload(ordering), lm_head, top_k, logits);
          env.Add("logits", logits, Tolerance::Roundings(0));
        }, vocab > 100000);
  }

  // Non-finite rows: inf, -inf or NaN first, last, in a vector tail or not; every third row.
  for (const int64_t cols : {64, 37, 4096}) {
    add("FlagNonFiniteRows", Dims({{"rows", 301}, {"cols", cols}}), [=](OpEnv& env) {
      Tensor x = env.HostRandom({301, cols}, 1e3f);
      const float bad[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
      for (int64_t r = 0; r < 301; r += 3) {
        const int64_t c = r % 9 == 0 ? 0 : r % 9 == 3 ? cols - 1 : (r * 7919) % cols;
        x.data<float>()[r * cols + c] = bad[(r / 3) % 3];
      }
      Tensor flags = env.Poison(DType::kI32, {301});
      env.b.FlagNonFiniteRows(env.Activation(x), flags);
      env.Add("flags", flags, Tolerance::Exact());
    });
  }

  // Greedy tokens on the device at a real vocabulary, ties to the lowest id, with and
  // without an offset map (EAGLE-3's d2t); Sample's greedy rows with penalties, bans and
  // logprobs (seeded draws: tests/test_cuda_sampling.cpp).
  for (const bool mapped : {false, true}) {
    add("GreedyTokens", std::string("rows37_vocab151936") + (mapped ? "_offsets" : ""), [=](OpEnv& env) {
      const int64_t rows = 37, vocab = 151936;
      Tensor logits = env.HostRandom({rows, vocab}, 3.0f);
      for (int64_t r = 0; r < rows; r += 3) {
        float* row = logits.data<float>() + r * vocab;
        const float top = *std::max_element(row, row + vocab);
        row[vocab - 1 - r] = top;
        row[r * 1000 + 5] = top;
      }
      std::vector<int32_t> offsets(static_cast<size_t>(vocab));
      for (int64_t i = 0; i < vocab; ++i) offsets[i] = static_cast<int32_t>(i % 11) - 5;
      const Tensor device_offsets = env.Ints(offsets);
      Tensor tokens = env.Poison(DType::kI32, {rows});
      env.b.GreedyTokens(env.b.Upload(logits), mapped ? &device_offsets : nullptr, tokens);
      env.Add("tokens", tokens, Tolerance::Exact());
    });
  }
  // Each row's k highest (a token tree's children), ties among them included: rows whose
  // best three share a value, and rows with a tie at rank 3.
  add("GreedyTokens", "rows19_vocab32000_top4_offsets", [=](OpEnv& env) {
    const int64_t rows = 19, vocab = 32000, k = 4;
    Tensor logits = env.HostRandom({rows, vocab}, 3.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.data<float>() + r * vocab;
      const float top = *std::max_element(row, row + vocab) + 1.0f;
      if (r % 2 == 0) {
        for (int64_t c : {vocab - 1 - r, r * 100 + 7, r * 1500 + 3}) row[c] = top;
      } else {
        row[r * 10] = top + 1.0f;
        row[vocab - 2 - r] = top;
        row[r * 900 + 1] = top - 0.5f;
        row[r * 1300 + 2] = top - 0.5f;
      }
    }
    std::vector<int32_t> offsets(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) offsets[i] = static_cast<int32_t>(i % 13) * 7;
    const Tensor device_offsets = env.Ints(offsets);
    Tensor tokens = env.Poison(DType::kI32, {rows, k});
    env.b.GreedyTokens(env.b.Upload(logits), &device_offsets, tokens);
    env.Add("tokens", tokens, Tolerance::Exact());
  });
  // Dynamic trees (backend/draft_tree.h): each row's top 4 with logprobs (ties among them,
  // a NaN row: none), then a round's expansions and its trees over states drawn here.
  add("TopLogprobs", "rows19_vocab32000_top4_offsets", [=](OpEnv& env) {
    const int64_t rows = 19, vocab = 32000, k = 4;
    Tensor logits = env.HostRandom({rows, vocab}, 3.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits.data<float>() + r * vocab;
      const float top = *std::max_element(row, row + vocab) + 1.0f;
      for (int64_t c : {vocab - 1 - r, r * 100 + 7}) row[c] = top;
      if (r == 5) std::fill_n(row, vocab, NAN);
    }
    std::vector<int32_t> offsets(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) offsets[i] = static_cast<int32_t>(i % 13) * 7;
    const Tensor device_offsets = env.Ints(offsets);
    Tensor ids = env.Poison(DType::kI32, {rows, k}), logprobs = env.Poison(DType::kF32, {rows, k});
    env.b.TopLogprobs(env.b.Upload(logits), &device_offsets, ids, logprobs);
    env.Add("ids", ids, Tolerance::Exact());
    env.Add("logprobs", logprobs, Tolerance::Absolute(1e-4));
  });
  // A state of 5 slots at top 3 after depth 1, expanded into depth 2 (ties, tokens -1), then
  // into depth 3 without next inputs; each slot's tree under its own limits.
  add("ExpandDraftTrees", "slots5_top3_depths2and3", [=](OpEnv& env) {
    const int k = 3, slots = 5;
    const int64_t places = DraftTreePlaces(k, 3);
    auto ints = [&](int64_t n, int lo, int hi) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      std::uniform_int_distribution<int> d(lo, hi);
      for (auto& x : v) x = d(env.rng());
      return v;
    };
    auto floats = [&](int64_t n) {  // logprobs on a coarse grid: ties
      std::vector<float> v(static_cast<size_t>(n));
      std::uniform_int_distribution<int> d(-12, 0);
      for (auto& x : v) x = d(env.rng()) * 0.25f;
      return v;
    };
    auto upload = [&](const std::vector<float>& v, const Shape& shape) {
      Tensor h = Tensor::Host(DType::kF32, shape);
      std::copy(v.begin(), v.end(), h.data<float>());
      return env.b.Upload(h);
    };
    DraftTreeState state{k, env.Ints(ints(slots * places, 0, 999)).View({slots, places}),
                         upload(floats(slots * places), {slots, places}),
                         env.Ints(ints(slots * places, -1, 2)).View({slots, places}), env.Ints(ints(slots * k, 0, k - 1)).View({slots, k}),
                         env.Ints(ints(slots * 2 * k, 0, 1 << 20)).View({slots, 2 * k})};
    std::vector<int32_t> ids = ints(slots * k * k, -1, 500);
    ids[4] = -1;
    const Tensor d_ids = env.Ints(ids).View({slots * k, k});
    const Tensor d_lps = upload(floats(slots * k * k), {slots * k, k});
    Tensor next_ids = env.Poison(DType::kI32, {slots * k}), next_rows = env.Poison(DType::kI32, {slots * k}),
           next_masks = env.Poison(DType::kI32, {slots * 2 * k});
    env.b.ExpandDraftTrees(d_ids, d_lps, 2, state, &next_ids, &next_rows, &next_masks);
    env.Add("next_ids", next_ids, Tolerance::Exact());
    env.Add("next_rows", next_rows, Tolerance::Exact());
    env.Add("next_masks", next_masks, Tolerance::Exact());
    env.b.ExpandDraftTrees(env.Ints(ints(slots * k * k, 0, 500)).View({slots * k, k}), upload(floats(slots * k * k), {slots * k, k}),
                           3, state, nullptr, nullptr, nullptr);
    env.Add("tokens", state.tokens, Tolerance::Exact());
    env.Add("scores", state.scores, Tolerance::Exact());
    env.Add("parents", state.parents, Tolerance::Exact());
    env.Add("frontier", state.frontier, Tolerance::Exact());
    env.Add("masks", state.masks, Tolerance::Exact());
  });
  add("SelectDraftTrees", "slots6_top2_depth4", [=](OpEnv& env) {
    const int k = 2, slots = 6, n = 9;
    const int64_t places = DraftTreePlaces(k, 4);
    // Trees as rounds make them: each place's parent a place of the depth before, its score
    // its parent's plus a logprob on a coarse grid (ties), some tokens -1.
    std::vector<int32_t> tokens(slots * places), parents(slots * places);
    std::vector<float> scores(slots * places);
    std::uniform_int_distribution<int> lp(-6, 0), tok(-1, 50);
    for (int s = 0; s < slots; ++s) {
      for (int64_t p = 0; p < places; ++p) {
        const int d = p < k ? 1 : 2 + static_cast<int>((p - k) / (k * k));
        const int64_t i = s * places + p;
        tokens[i] = tok(env.rng());
        parents[i] = d == 1 ? -1 : static_cast<int32_t>(DraftDepthStart(k, d - 1) + (p - DraftDepthStart(k, d)) % (d == 2 ? k : k * k));
        scores[i] = (d == 1 ? 0.0f : scores[s * places + parents[i]]) + lp(env.rng()) * 0.5f;
      }
    }
    Tensor h = Tensor::Host(DType::kF32, {slots, places});
    std::copy(scores.begin(), scores.end(), h.data<float>());
    const DraftTreeState state{k, env.Ints(tokens).View({slots, places}), env.b.Upload(h),
                               env.Ints(parents).View({slots, places}), env.Ints(std::vector<int32_t>(slots * k, 0)),
                               env.Ints(std::vector<int32_t>(slots * 2 * k, 0))};
    const Tensor limits = env.Ints({static_cast<int32_t>(places), 9, static_cast<int32_t>(places), 3, 2, 9,
                                    static_cast<int32_t>(DraftTreePlaces(k, 2)), 5, 0, 0, static_cast<int32_t>(places), 20})
                              .View({slots, 2});
    Tensor out = env.Poison(DType::kI32, {slots, 2 * n});
    env.b.SelectDraftTrees(state, limits, out);
    env.Add("trees", out, Tolerance::Exact());
  });
  for (const int64_t vocab : {10, 1000, 151936}) {
    add("Sample", Dims({{"rows", 9}, {"vocab", vocab}}) + "_greedy", [=](OpEnv& env) {
      const Tensor logits = env.HostRandom({9, vocab}, 3.0f);
      SamplingBatch batch;
      batch.max_logprobs = 4;
      for (int r = 0; r < 9; ++r) {
        SamplingRow row;
        row.num_logprobs = r % 5;
        row.repetition_penalty = r % 3 == 1 ? 1.3f : 1.0f;
        row.frequency_penalty = r % 3 == 1 ? 0.5f : 0.0f;
        row.adjust_begin = static_cast<int32_t>(batch.adjust.size());
        if (r % 3 == 1) {
          for (int a = 0; a < 5; ++a)
            batch.adjust.push_back({static_cast<int32_t>((r * 131 + a * 977) % vocab), a % 3,
                                    a == 0 ? TokenAdjust::kBanned : a % 2});
        }
        row.adjust_end = static_cast<int32_t>(batch.adjust.size());
        batch.rows.push_back(row);
      }
      const SampledTokens s = env.b.Sample(env.b.Upload(logits), batch);
      std::vector<float> tokens(s.tokens.begin(), s.tokens.end()), ids(s.top_ids.begin(), s.top_ids.end());
      env.AddHost("tokens", tokens, 1, Tolerance::Exact());
      env.AddHost("top_ids", ids, 1, Tolerance::Exact());
      env.AddHost("logprobs", s.logprobs, 1, Tolerance::Absolute(1e-4));
      env.AddHost("top_logprobs", s.top_logprobs, 1, Tolerance::Absolute(1e-4));
    });
  }
  // Greedy verification of one-hot drafts: requests of 0 to 5 drafts, each accepting a
  // known prefix (drafts equal to the rows' arg max, then a wrong one, or all right: the
  // bonus token); logprobs as Sample reports them. (Seeded rows, draft probabilities and
  // forced acceptance: tests/test_cuda_verification.cpp.)
  for (const int64_t vocab : {10, 1000, 151936}) {
    add("VerifyDrafts", Dims({{"requests", 5}, {"vocab", vocab}}) + "_greedy", [=](OpEnv& env) {
      const std::vector<int32_t> num_drafts = {0, 1, 3, 5, 2}, right = {0, 1, 1, 5, 0};
      int64_t rows = 0;
      for (int32_t k : num_drafts) rows += k + 1;
      const Tensor logits = env.HostRandom({rows, vocab}, 3.0f);
      VerificationBatch batch;
      batch.num_drafts = num_drafts;
      batch.sampling.max_logprobs = 3;
      for (size_t r = 0, row = 0; r < num_drafts.size(); ++r) {
        for (int32_t j = 0; j <= num_drafts[r]; ++j, ++row) {
          const float* l = logits.data<float>() + row * vocab;
          const auto top = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
          if (j < num_drafts[r]) batch.drafts.push_back(j < right[r] ? top : (top + 1) % static_cast<int32_t>(vocab));
          SamplingRow s;
          s.num_logprobs = static_cast<int32_t>(row % 4);
          batch.sampling.rows.push_back(s);
        }
      }
      const VerifiedTokens v = env.b.VerifyDrafts(env.b.Upload(logits), nullptr, batch, nullptr);
      const SampledTokens& e = v.emitted;
      env.AddHost("num_accepted", std::vector<float>(v.num_accepted.begin(), v.num_accepted.end()), 1,
                  Tolerance::Exact());
      env.AddHost("tokens", std::vector<float>(e.tokens.begin(), e.tokens.end()), 1, Tolerance::Exact());
      env.AddHost("top_ids", std::vector<float>(e.top_ids.begin(), e.top_ids.end()), 1, Tolerance::Exact());
      env.AddHost("logprobs", e.logprobs, 1, Tolerance::Absolute(1e-4));
      env.AddHost("top_logprobs", e.top_logprobs, 1, Tolerance::Absolute(1e-4));
    });
  }

  // Token trees of one-hot drafts, sampled (seeded rows at temperatures 0 to 1.2, top-k,
  // top-p; children among their parent row's best tokens, a repeated and an invalid one),
  // and under forced acceptance: the tree kernels against the host's rules.
  for (const int64_t vocab : {1000, 151936}) {
    for (const float forced : {-1.0f, 0.6f}) {
      add("VerifyDrafts", Dims({{"trees", 4}, {"vocab", vocab}}) + (forced < 0 ? "_sampled" : "_forced"), [=](OpEnv& env) {
        const std::vector<std::vector<int32_t>> parents = {{-1, -1, 0}, {-1, -1, 0, 0, 1, 3}, {}, {-1, 0, 1, 2, -1}};
        int64_t rows = 0;
        for (const auto& p : parents) rows += static_cast<int64_t>(p.size()) + 1;
        const Tensor logits = env.HostRandom({rows, vocab}, 3.0f);
        VerificationBatch batch;
        batch.forced_accept_rate = forced;
        batch.sampling.max_logprobs = 2;
        std::uniform_int_distribution<int> rank(0, 2);
        for (size_t r = 0, begin = 0; r < parents.size(); begin += parents[r].size() + 1, ++r) {
          batch.num_drafts.push_back(static_cast<int32_t>(parents[r].size()));
          for (size_t i = 0; i < parents[r].size(); ++i) {
            // A child: one of its parent row's three best tokens.
            const float* l = logits.data<float>() + (begin + 1 + parents[r][i]) * vocab;
            std::vector<int32_t> order(static_cast<size_t>(vocab));
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + 3, order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
            int32_t token = order[rank(env.rng())];
            if (r == 1 && i == 3) token = batch.drafts.back();  // a sibling with the same token
            if (r == 3 && i == 4) token = -1;                   // no token
            batch.drafts.push_back(token);
            batch.parents.push_back(parents[r][i]);
          }
          for (size_t j = 0; j <= parents[r].size(); ++j) {
            SamplingRow s;
            s.temperature = r == 3 && j == 1 ? 0.0f : 0.6f + 0.2f * static_cast<float>(j % 4);
            s.top_k = r == 1 ? 20 : 0;
            s.top_p = r == 0 ? 0.9f : 1.0f;
            s.seed_lo = 77 + static_cast<uint32_t>(r);
            s.draw = static_cast<uint32_t>(j);
            s.num_logprobs = 1 + static_cast<int32_t>(j % 2);
            batch.sampling.rows.push_back(s);
          }
        }
        const VerifiedTokens v = env.b.VerifyDrafts(env.b.Upload(logits), nullptr, batch, nullptr);
        const SampledTokens& e = v.emitted;
        env.AddHost("num_accepted", std::vector<float>(v.num_accepted.begin(), v.num_accepted.end()), 1,
                    Tolerance::Exact());
        env.AddHost("path", std::vector<float>(v.path.begin(), v.path.end()), 1, Tolerance::Exact());
        env.AddHost("tokens", std::vector<float>(e.tokens.begin(), e.tokens.end()), 1, Tolerance::Exact());
        env.AddHost("top_ids", std::vector<float>(e.top_ids.begin(), e.top_ids.end()), 1, Tolerance::Exact());
        env.AddHost("logprobs", e.logprobs, 1, Tolerance::Absolute(1e-4));
        env.AddHost("top_logprobs", e.top_logprobs, 1, Tolerance::Absolute(1e-4));
      });
    }
  }

  // The copies between host and device the engine uses (pinned buffers, async download).
  for (const int64_t n : {1, 4099}) {
    add("Transfers", Dims({{"rows", 3}, {"cols", n}}), [=](OpEnv& env) {
      const Tensor x = env.Random({3, n});
      Tensor pinned = env.b.HostBuffer(env.b.compute_dtype(), {3, n});
      env.b.DownloadTo(x, pinned);
      Tensor y = env.PoisonAct({3, n});
      env.b.UploadTo(pinned, y);
      Tensor back = env.b.HostBuffer(env.b.compute_dtype(), {3, n});
      env.b.DownloadAsync(y, back)->Wait();
      env.AddHost("downloaded", OpEnv::Floats(back), n, Tolerance::Exact());
    });
  }
  return t;
}

const std::vector<OpCase>& Cases() {
  static const std::vector<OpCase> cases = Table();
  return cases;
}

std::string CaseName(size_t i) {
  std::string s = Cases()[i].op + "_" + Cases()[i].shape;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

uint64_t CaseSeed(size_t i) { return 1000 + i; }

std::string Failures(const std::vector<std::string>& failures) {
  std::string s;
  for (const std::string& f : failures) s += "\n  " + f;
  return s;
}

// ---- The CUDA backend against the reference, one test per case ----

// The CUDA backend as made by default, and with a switch that sends some ops down another
// path (a backend reads its switches when made): each path is held to the same reference.
struct Target {
  std::string name;
  const char* var = nullptr;  // the environment switch set while the backend is made
  const char* value = nullptr;
  bool batch_invariant = false;
  std::vector<std::string> ops;  // the cases it runs; empty: all
  bool padding = true;  // its attention takes padding sequences (runs the split-KV decode kernel)
  std::vector<std::string> skip = {};  // cases it does not run (what the mode refuses)
};

const std::vector<Target>& Targets() {
  static const std::vector<Target> targets = {
      {"default"},
      // Batch-invariant runs use bf16 GEMMs only (--quantization fp8 is refused with it).
      {"batch_invariant", nullptr, nullptr, true, {}, false, {"LinearFp8", "RmsNormFp8", "GatedActivationFp8"}},
      {"mma_attention", "HSX_ATTENTION", "mma", false, {"Attention", "QkvAttention"}},
      {"no_decode_kernel", "HSX_DECODE_ATTENTION", "0", false, {"Attention", "QkvAttention"}, false},
      {"no_verify_kernel", "HSX_VERIFY_ATTENTION", "0", false, {"Attention", "QkvAttention"}, false},
      {"no_decode_cluster", "HSX_DECODE_CLUSTER", "0", false, {"Attention", "QkvAttention"}},
      {"unfused_attention_inputs", "HSX_FUSE_ATTENTION_INPUTS", "0", false, {"QkvAttention"}},
      {"no_norm_rope_store", "HSX_NORM_ROPE_STORE", "0", false, {"NormRopeStoreKV", "QkvAttention"}},
      {"no_gemv", "HSX_GEMV", "0", false, {"Linear", "GatedLinear"}},
      {"no_gated_gemv", "HSX_GATED_GEMV", "0", false, {"GatedLinear"}},
      {"no_moe_gemv", "HSX_MOE_GEMV", "0", false, {"MoeMlp"}},
      {"unfused_fp8_inputs", "HSX_FP8_FUSED_INPUTS", "0", false, {"RmsNormFp8", "GatedActivationFp8"}},
  };
  return targets;
}

// (target, case) pairs: every case on the default backend, then each switch's cases.
std::vector<std::pair<size_t, size_t>> TargetCases() {
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t t = 0; t < Targets().size(); ++t) {
    const std::vector<std::string>& ops = Targets()[t].ops;
    for (size_t c = 0; c < Cases().size(); ++c) {
      const std::string& op = Cases()[c].op;
      const std::vector<std::string>& skip = Targets()[t].skip;
      if ((ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end()) &&
          std::find(skip.begin(), skip.end(), op) == skip.end())
        pairs.emplace_back(t, c);
    }
  }
  return pairs;
}

class CudaBackendOps : public ::testing::TestWithParam<std::pair<size_t, size_t>> {
 protected:
  static void TearDownTestSuite() {
    targets_.clear();
    references_.clear();
  }
  // The target's backend, made on first use; null without a device.
  static Backend* TargetBackend(size_t t) {
    auto it = targets_.find(t);
    if (it != targets_.end()) return it->second.get();
    const Target& target = Targets()[t];
    if (target.var != nullptr) setenv(target.var, target.value, 1);
    auto b = MakeBackend("cuda", target.batch_invariant);
    if (target.var != nullptr) unsetenv(target.var);
    return (targets_[t] = b.ok() ? std::move(b).value() : nullptr).get();
  }
  // The CPU's outputs of a case, computed once for every target.
  static const std::vector<Output>& Reference(size_t c, bool padding) {
    auto it = references_.find({c, padding});
    if (it != references_.end()) return it->second;
    CpuBackend cpu;
    return references_[{c, padding}] = RunOn(Cases()[c], cpu, CaseSeed(c), padding);
  }
  static std::map<size_t, std::unique_ptr<Backend>> targets_;
  static std::map<std::pair<size_t, bool>, std::vector<Output>> references_;
};
std::map<size_t, std::unique_ptr<Backend>> CudaBackendOps::targets_;
std::map<std::pair<size_t, bool>, std::vector<Output>> CudaBackendOps::references_;

TEST_P(CudaBackendOps, MatchesTheCpuReference) {
  const auto [t, c] = GetParam();
  Backend* target = TargetBackend(t);
  if (target == nullptr) GTEST_SKIP() << "no CUDA device";
  const bool padding = Targets()[t].padding;
  const std::vector<std::string> failures =
      CompareAll(Reference(c, padding), RunOn(Cases()[c], *target, CaseSeed(c), padding));
  EXPECT_TRUE(failures.empty()) << Cases()[c].op << " " << Cases()[c].shape << " on the " << Targets()[t].name
                                << " backend" << Failures(failures);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaBackendOps, ::testing::ValuesIn(TargetCases()), [](const auto& info) {
  return Targets()[info.param.first].name + "__" + CaseName(info.param.second);
});

// ---- The table and comparator on the CPU ----

// Every op of the Backend interface that computes is in the table (a new op must be added).
TEST(BackendOpsTable, CoversEveryComputeOp) {
  std::vector<std::string> ops;
  for (const OpCase& c : Cases()) ops.push_back(c.op);
  for (const char* op : {"Embed", "Linear", "QuantizeRowsFp8", "LinearFp8", "RmsNorm", "Add", "AddRmsNorm",
                         "RmsNormFp8", "Multiply", "Scale", "ScaleByTensor", "Softcap", "Activate", "GatedActivation",
                         "GatedActivationFp8", "GatedLinear", "Rope", "RmsNormRope", "NormRopeStoreKV", "StoreKV",
                         "Attention", "QkvAttention", "GatherRows", "GatherRowsAt", "MoveRows", "SliceColumns", "WriteColumns", "DraftLayerInput",
                         "MoeMlp", "CentroidMaskedLogits", "FlagNonFiniteRows", "Sample", "GreedyTokens", "TopLogprobs",
                         "ExpandDraftTrees", "SelectDraftTrees", "VerifyDrafts",
                         "Copy", "Transfers"}) {
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op << " has no case";
  }
}

// GoogleTest needs each parameter's name once.
TEST(BackendOpsTable, CaseNamesAreUnique) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < Cases().size(); ++i) {
    const auto [it, added] = seen.emplace(CaseName(i), i);
    EXPECT_TRUE(added) << CaseName(i) << ": cases " << it->second << " and " << i;
  }
}

class BackendOps : public ::testing::TestWithParam<size_t> {};

// The reference side of the case writes a finite value into every output (a case whose
// output stays poison compares nothing), and the CPU against itself passes.
TEST_P(BackendOps, ComparesSomethingAndPassesAgainstItself) {
  const size_t i = GetParam();
  CpuBackend cpu;
  const std::vector<Output> outputs = RunOn(Cases()[i], cpu, CaseSeed(i));
  ASSERT_FALSE(outputs.empty());
  for (const Output& o : outputs) {
    EXPECT_TRUE(std::any_of(o.values.begin(), o.values.end(), [](float v) { return std::isfinite(v); }))
        << o.name << " holds no finite value";
  }
  const std::vector<std::string> failures = CompareAll(outputs, RunOn(Cases()[i], cpu, CaseSeed(i)));
  EXPECT_TRUE(failures.empty()) << Failures(failures);
}

// The comparator sees one changed value in every output of the case: its largest ordinary
// element moved to twice its tolerance, or left as poison (NaN), fails that output and only
// that one.
TEST_P(BackendOps, ComparatorFailsOnOnePerturbedValue) {
  const size_t i = GetParam();
  CpuBackend cpu;
  const std::vector<Output> want = RunOn(Cases()[i], cpu, CaseSeed(i));
  for (size_t o = 0; o < want.size(); ++o) {
    const std::vector<float>& values = want[o].values;
    size_t at = values.size();
    for (size_t k = 0; k < values.size(); ++k) {
      if (!Special(values[k]) && (at == values.size() || std::abs(values[k]) > std::abs(values[at]))) at = k;
    }
    ASSERT_LT(at, values.size()) << want[o].name;
    const Tolerance& tol = want[o].tol;
    const float v = values[at];
    const float moved = tol.exact() ? v + std::max(1.0f, std::abs(v) * 1e-3f)
                                    : v + static_cast<float>(2 * (tol.absolute + tol.relative * std::abs(v)));
    for (const float changed : {moved, std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<Output> got = want;
      got[o].values[at] = changed;
      const std::vector<std::string> failures = CompareAll(want, got);
      EXPECT_EQ(failures.size(), 1u) << want[o].name << " element " << at << ": " << v << " -> " << changed
                                     << Failures(failures);
    }
  }
}

// The batch-invariant CPU backend (other kernels: row-wise attention, fixed-order sums)
// against the reference.
TEST_P(BackendOps, BatchInvariantCpuMatchesTheReference) {
  const size_t i = GetParam();
  CpuBackend cpu, invariant(true);
  const std::vector<std::string> failures = RunCase(Cases()[i], cpu, invariant, CaseSeed(i));
  EXPECT_TRUE(failures.empty()) << Failures(failures);
}

// The cases cheap on the CPU (the large ones differ in size only, not in what they check here).
std::vector<size_t> CpuCases() {
  std::vector<size_t> cases;
  for (size_t i = 0; i < Cases().size(); ++i)
    if (!Cases()[i].large) cases.push_back(i);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, ::testing::ValuesIn(CpuCases()),
                         [](const auto& info) { return CaseName(info.param); });

}  // namespace
}  // namespace hsx
