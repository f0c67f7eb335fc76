// Draft length per request per step ("draft_length": "adaptive" in --speculative-config):
// each decoding request gets K in 0..K_max from its running acceptance and a cost model of
// the step at the current batch size. K = 0 makes it a plain decode row in the same batch.
// Lossless: K only changes how many drafts are proposed; verification is unchanged.
//
// The choice maximizes the step's expected tokens per second. A request with per-draft
// acceptance a and K drafts emits E(a, K) = 1 + a + ... + a^K tokens (drafts accepted in a
// row, then one more); the step costs target(rows) + draft(drafting requests, max K), rows =
// the batch's requests plus their drafts. The search: for m = the m requests of highest
// acceptance and a common K = c (every (m, c), which escapes the draft round's fixed cost),
// then each drafting request's K lowered while that pays. Ties go to fewer drafts, so equal
// measurements give equal choices.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace hsx {

// How the runner runs a decode or verification step: the rows it computes (a graph's
// padding included) and whether it replays a graph.
struct StepShape {
  int rows = 0;
  bool graph = true;
};

// What the step costs, in seconds: measured (Observe*) and interpolated, or injected.
// Target steps are kept by the shape the runner runs them in: graph steps by their padded
// rows, eager ones (mixed draft counts past the padded graphs' rows) as the graph step of
// their rows plus a measured penalty, the launches a graph saves (H200, batch 128: 0.5-1 ms
// of a 10 ms step). Without graph figures (a backend that never records) eager steps are
// interpolated among themselves.
class DraftCostModel {
 public:
  // The runner's rule: a step of `seqs` sequences, at most q rows each and `rows` in all
  // (seqs * q when every sequence runs q), runs in this shape.
  using ShapeRule = std::function<StepShape(int seqs, int q, int rows)>;

  // Until a kind of step is measured: a target step costs 1 whatever its rows, a draft
  // round draft_step_ratio per draft step (a relative prior; any measurement replaces it).
  // Without a rule every step runs on a graph of its own rows.
  static constexpr double kDraftStepPrior = 0.1;
  explicit DraftCostModel(double draft_step_ratio = kDraftStepPrior, ShapeRule rule = nullptr)
      : ratio_(draft_step_ratio), rule_(std::move(rule)) {}

  // A target step of `rows` computed rows (decode and verification rows; no prefill) took
  // seconds. The first of each size is skipped (GEMM plans); the caller leaves out steps
  // that recorded a graph.
  void ObserveTarget(int rows, double seconds, bool graph = true);
  // A draft round over `seqs` requests of k drafts took seconds (the first of each skipped).
  void ObserveDraft(int seqs, int k, double seconds);
  // Graph steps of `rows` rows were recorded when the engine started (their GEMMs planned,
  // their graph made): the first served step of those rows is a measurement, not skipped.
  void MarkWarm(int rows) { target_warm_.insert({true, rows}); }
  // Fixed figures (tests, or a start-up measurement): each replaces what was measured there.
  void SetTarget(int rows, double seconds, bool graph = true) { (graph ? graph_ : eager_)[rows] = seconds; }
  void SetDraft(int seqs, int k, double seconds) { draft_[{seqs, k}] = seconds; }
  void SetEagerPenalty(double seconds) { penalty_ = seconds; penalty_seen_ = true; }

  // A step of `seqs` sequences, at most q rows each and `rows` in all, in the rule's shape.
  double StepSeconds(int seqs, int q, int rows) const;
  double TargetSeconds(int rows, bool graph = true) const;
  double DraftSeconds(int seqs, int k) const;  // 0 when k == 0 or seqs == 0
  static constexpr double kMaxDraftStepRatio = 0.3;  // a draft step's cost at most, in plain steps
  // The figures as they stand (what bench reports beside its tok/s).
  const std::map<int, double>& target_figures() const { return graph_; }
  const std::map<int, double>& eager_figures() const { return eager_; }
  double eager_penalty() const { return penalty_; }
  const std::map<std::pair<int, int>, double>& draft_figures() const { return draft_; }

 private:
  double ratio_;
  ShapeRule rule_;
  double weight_ = 0.2;  // a higher observation moves its figure this far toward it
  std::map<int, double> graph_, eager_;            // target steps by computed rows
  double penalty_ = 0;                             // an eager step over the graph step of its rows
  bool penalty_seen_ = false;
  std::map<std::pair<int, int>, double> draft_;    // by (requests, k)
  std::set<std::pair<bool, int>> target_warm_;     // (graph, rows) whose first step has run
  std::set<std::pair<int, int>> draft_warm_;
};

// A request's acceptance, as the policy keeps it (on its Sequence).
struct DraftHistory {
  double accepted = 0;   // discounted drafts accepted
  double observed = 0;   // discounted drafts accepted + rejections (a geometric run's trials)
  int idle_steps = 0;    // consecutive steps it decoded without drafts
  int failed_probes = 0; // probes in a row that had no draft accepted (each doubles the wait)
};

struct DraftLengthConfig {
  int k_max = 0;
  double prior_acceptance = 0.6;  // a request's acceptance before it has drafted
  double prior_weight = 2.0;      // in trials
  double discount = 0.9;          // per verification: older outcomes weigh less
  // After probe_interval steps without drafts a request probes: it drafts with the prior's
  // acceptance (at most probe_drafts when > 0). A probe that has none accepted doubles the
  // wait before the next, up to max_probe_interval, so a useless draft costs ever less; an
  // accepted one restarts the request's history from the prior. Probes draft the policy's
  // K by default: a capped probe is a step shape of its own, whose first sight (GEMM
  // tuning, graph recording) cost more than the drafts it saved (H200: 0.87x at batch 2).
  int probe_interval = 32;
  int max_probe_interval = 128;
  int probe_drafts = 0;
  // Drafts are taken only where the step's expected rate beats plain decoding's by this
  // fraction: the model's errors cost more where speculation loses than they gain where it
  // wins, and a batch whose requests all run to the end gains less from some requests'
  // drafts than the step's rate says (the others still take every step). n-gram at batch
  // 128 drafted for the few requests with a match at a predicted gain of a few percent and
  // ran at 0.89x plain on the H200.
  double min_gain = 0.05;
};

class DraftLengthPolicy {
 public:
  explicit DraftLengthPolicy(DraftLengthConfig config) : config_(config) {}

  // One verification of a request: `proposed` drafts, `accepted` of them.
  void Record(DraftHistory& history, int proposed, int accepted) const;
  // The estimated per-draft acceptance (with the prior; the prior again when probing) at
  // the drafter's step `step`. A request idle for its probe interval probes only on steps
  // that are multiples of it (each a multiple of probe_interval), so idle requests probe
  // together: one verification step of equal draft counts (a graph) instead of one with
  // mixed counts every few steps.
  double Acceptance(const DraftHistory& history, int64_t step = 0) const;
  // Whether the request probes at step `step` (it then drafts at most probe_drafts).
  bool Probing(const DraftHistory& history, int64_t step) const;
  // Steps without drafts before the request's next probe (doubled by each failed probe).
  int ProbeInterval(const DraftHistory& history) const;
  // K per request for one step: rooms[i] is request i's most (0: it does not decode next),
  // acceptance[i] its estimate. Non-decoding requests get 0 and cost nothing.
  std::vector<int> Choose(const std::vector<int>& rooms, const std::vector<double>& acceptance,
                          const DraftCostModel& cost) const;
  // Expected tokens a request emits with k drafts at acceptance a.
  static double ExpectedTokens(double a, int k);

  const DraftLengthConfig& config() const { return config_; }

 private:
  DraftLengthConfig config_;
};

}  // namespace hsx
