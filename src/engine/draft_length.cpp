#include "engine/draft_length.h"

#include <algorithm>
#include <iterator>
#include <cstdlib>
#include <limits>

namespace hsx {
namespace {

// A lower measurement replaces the figure at once: first-use costs and host hiccups only
// ever lengthen a step, so an inflated figure must not linger. A higher one moves the
// figure `weight` toward it.
void Smooth(double& figure, double seconds, double weight, bool seen) {
  figure = seen && seconds > figure ? (1.0 - weight) * figure + weight * seconds : seconds;
}

// Linear between measured rows; past the most, on the slope of the last two (never
// falling), or flat with one. Below the least, in proportion to rows: optimistic for fewer
// rows, so a batch that has only run verification steps tries a plain one and measures it
// (flat, a plain step looked as dear as a verification of K+1 rows a sequence, and a large
// batch kept drafting where drafting lost: 0.89x plain at batch 128 on the H200). And never
// above a figure measured at more rows: a step costs no more for fewer rows, and a figure
// inflated by a first-use cost must not outprice the step that replaced it, which is then
// never chosen to be measured again (the H200 drafted K=1 at zero acceptance, 0.89x, with
// a plain step priced above a verification of twice its rows).
double Interpolate(const std::map<int, double>& figures, int rows) {
  auto hi = figures.lower_bound(rows);
  double ceiling = std::numeric_limits<double>::infinity();
  for (auto it = hi; it != figures.end(); ++it) ceiling = std::min(ceiling, it->second);
  if (hi != figures.end() && hi->first == rows) return ceiling;
  if (hi == figures.begin()) return ceiling * std::max(rows, 1) / hi->first;
  if (hi == figures.end()) {
    auto last = std::prev(figures.end());
    if (last == figures.begin()) return last->second;
    auto before = std::prev(last);
    const double slope = std::max(0.0, (last->second - before->second) / (last->first - before->first));
    return last->second + slope * (rows - last->first);
  }
  auto lo = std::prev(hi);
  const double t = static_cast<double>(rows - lo->first) / (hi->first - lo->first);
  return std::min(ceiling, lo->second + t * (hi->second - lo->second));
}

}  // namespace

// The first step of each kind is not a measurement: it plans its GEMMs (a step that records
// a graph is left out by the caller: up to hundreds of times its cost). Taken as one it
// stops drafting, and with it the measurements that would correct it.
void DraftCostModel::ObserveTarget(int rows, double seconds, bool graph) {
  if (target_warm_.insert({graph, rows}).second) return;
  if (!graph && !graph_.empty()) {  // what it cost over the graph step of its rows, never below 0
    // (an eager step runs no more rows than the graph step of its rows; a sample below the
    // graph figure is the graph figure's error past its measured rows)
    Smooth(penalty_, std::max(0.0, seconds - Interpolate(graph_, rows)), weight_, penalty_seen_);
    penalty_seen_ = true;
  }
  std::map<int, double>& figures = graph ? graph_ : eager_;
  const bool seen = figures.count(rows) > 0;
  Smooth(figures[rows], seconds, weight_, seen);
}

void DraftCostModel::ObserveDraft(int seqs, int k, double seconds) {
  if (draft_warm_.insert({seqs, k}).second) return;
  const bool seen = draft_.count({seqs, k}) > 0;
  Smooth(draft_[{seqs, k}], seconds, weight_, seen);
}

double DraftCostModel::TargetSeconds(int rows, bool graph) const {
  if (!graph && !graph_.empty()) return Interpolate(graph_, rows) + penalty_;  // 0 until measured
  const std::map<int, double>& figures = graph ? graph_ : eager_;
  const std::map<int, double>& other = graph ? eager_ : graph_;
  if (!figures.empty()) return Interpolate(figures, rows);
  return other.empty() ? 1.0 : Interpolate(other, rows);
}

double DraftCostModel::StepSeconds(int seqs, int q, int rows) const {
  const StepShape shape = rule_ ? rule_(seqs, q, rows) : StepShape{rows, true};
  return TargetSeconds(shape.rows, shape.graph);
}

// A round's time at a measured request count scales with k from the nearest measured k
// (the lower on a tie); between measured request counts it is linear (flat outside them).
// Never above a round measured with as many requests and drafts or more: a round costs no
// more for fewer (a figure inflated by first-use costs, such as new GEMM shapes, must not
// outprice its K: the H200 held a round of 31 requests at 10.75 ms against 0.94 at 32).
// Unmeasured: the prior. Called for every (requests, k) the policy weighs: no allocation.
double DraftCostModel::DraftSeconds(int seqs, int k) const {
  if (k <= 0 || seqs <= 0) return 0.0;
  if (draft_.empty()) return ratio_ * k * TargetSeconds(seqs);
  auto at_k = [&](int s) {  // s is a measured request count
    double best = 0;
    int best_k = 0;
    for (auto it = draft_.lower_bound({s, 0}); it != draft_.end() && it->first.first == s; ++it) {
      const int kk = it->first.second;
      if (best_k == 0 || std::abs(kk - k) < std::abs(best_k - k)) best_k = kk, best = it->second;
    }
    return best * k / best_k;
  };
  auto estimate = [&] {
    auto hi = draft_.lower_bound({seqs, 0});  // the first entry of the least measured count >= seqs
    if (hi != draft_.end() && hi->first.first == seqs) return at_k(seqs);
    if (hi == draft_.begin()) return at_k(hi->first.first);
    const int lo_seqs = std::prev(hi)->first.first;
    if (hi == draft_.end()) return at_k(lo_seqs);
    const int hi_seqs = hi->first.first;
    const double t = static_cast<double>(seqs - lo_seqs) / (hi_seqs - lo_seqs);
    return at_k(lo_seqs) + t * (at_k(hi_seqs) - at_k(lo_seqs));
  };
  double seconds = estimate();
  for (auto it = draft_.lower_bound({seqs, 0}); it != draft_.end(); ++it) {
    if (it->first.second >= k) seconds = std::min(seconds, it->second);
  }
  // And never above kMaxDraftStepRatio of a plain step per draft step: a draft is a small
  // model by design (EAGLE-3 one layer, 0.05-0.07 of the target's step a draft step on the
  // H200), so a figure past that is a first-use cost. Past it, the only round measured at
  // batch 32 (31 requests x 3 at 11.4 ms) priced every round there out, and forced
  // acceptance 0.745 ran at 0.93x plain.
  return std::min(seconds, kMaxDraftStepRatio * k * TargetSeconds(seqs));
}

// The prior enters as prior_weight trials at the first verification and is discounted with
// the outcomes after it, so a request whose drafts are never accepted goes toward 0.
void DraftLengthPolicy::Record(DraftHistory& h, int proposed, int accepted) const {
  if (proposed <= 0) {
    ++h.idle_steps;
    return;
  }
  if (h.idle_steps + 1 >= ProbeInterval(h)) {  // this verification was a probe
    if (accepted == 0) {
      h.failed_probes = std::min(h.failed_probes + 1, 30);
    } else {  // the draft works again: its old record no longer says how well
      h.failed_probes = 0;
      h.observed = 0;
    }
  } else if (accepted > 0) {
    h.failed_probes = 0;
  }
  h.idle_steps = 0;
  if (h.observed == 0) {  // its first verification (any later one leaves observed > 0)
    h.accepted = config_.prior_acceptance * config_.prior_weight;
    h.observed = config_.prior_weight;
  }
  h.accepted = config_.discount * h.accepted + accepted;
  h.observed = config_.discount * h.observed + accepted + (accepted < proposed ? 1 : 0);
}

int DraftLengthPolicy::ProbeInterval(const DraftHistory& h) const {
  int interval = std::max(1, config_.probe_interval);
  for (int i = 0; i < h.failed_probes && interval <= config_.max_probe_interval / 2; ++i) interval *= 2;
  return interval;
}

bool DraftLengthPolicy::Probing(const DraftHistory& h, int64_t step) const {
  const int interval = ProbeInterval(h);
  // idle_steps counts the steps since its last draft before this one: a request that stopped
  // drafting at a multiple of the interval probes again exactly one interval later.
  return h.idle_steps + 1 >= interval && step % interval == 0;
}

double DraftLengthPolicy::Acceptance(const DraftHistory& h, int64_t step) const {
  if (h.observed == 0 || Probing(h, step)) return config_.prior_acceptance;
  return std::clamp(h.accepted / h.observed, 0.0, 1.0);
}

double DraftLengthPolicy::ExpectedTokens(double a, int k) {
  double sum = 1.0, term = 1.0;
  for (int j = 0; j < k; ++j) sum += term *= a;
  return sum;
}

std::vector<int> DraftLengthPolicy::Choose(const std::vector<int>& rooms, const std::vector<double>& acceptance,
                                           const DraftCostModel& cost) const {
  const int n = static_cast<int>(rooms.size());
  std::vector<int> ks(n, 0);
  std::vector<int> order;  // the requests that may draft, highest acceptance first (then index)
  for (int i = 0; i < n; ++i) {
    if (rooms[i] > 0 && config_.k_max > 0) order.push_back(i);
  }
  if (order.empty()) return ks;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return acceptance[a] > acceptance[b]; });
  // The step's rows per sequence at most are round_k + 1: with fewer for some, the runner
  // pads them on a graph or runs them eagerly, which the cost model prices.
  auto rate = [&](double extra_tokens, int extra_rows, int drafting, int round_k) {
    return (n + extra_tokens) /
           (cost.StepSeconds(n, round_k + 1, n + extra_rows) + cost.DraftSeconds(drafting, round_k));
  };
  // The best (m, c): the first m of order draft min(c, room) each. Only a strictly better
  // rate replaces the best, so ties keep fewer drafts; drafting must beat plain decoding by
  // min_gain.
  double best = rate(0, 0, 0, 0) * (1.0 + config_.min_gain);
  int best_m = 0, best_c = 0;
  for (int c = 1; c <= config_.k_max; ++c) {
    double tokens = 0;
    int rows = 0, round_k = 0;
    for (int m = 1; m <= static_cast<int>(order.size()); ++m) {
      const int i = order[m - 1];
      const int k = std::min(c, rooms[i]);
      tokens += ExpectedTokens(acceptance[i], k) - 1.0;
      rows += k;
      round_k = std::max(round_k, k);
      const double r = rate(tokens, rows, m, round_k);
      if (r > best * (1.0 + 1e-12)) {
        best = r;
        best_m = m;
        best_c = c;
      }
    }
  }
  if (best_m == 0) return ks;
  // Then each drafting request, lowest acceptance first, gives up drafts while that pays.
  double tokens = 0;
  int rows = 0;
  std::vector<int> count(config_.k_max + 1, 0);  // drafting requests by k: the round's k is the largest
  for (int m = 0; m < best_m; ++m) {
    const int i = order[m];
    ks[i] = std::min(best_c, rooms[i]);
    tokens += ExpectedTokens(acceptance[i], ks[i]) - 1.0;
    rows += ks[i];
    ++count[ks[i]];
  }
  auto round_k = [&] {
    for (int k = config_.k_max; k > 0; --k) {
      if (count[k] > 0) return k;
    }
    return 0;
  };
  int drafting = best_m;
  for (int m = best_m - 1; m >= 0; --m) {
    const int i = order[m];
    while (ks[i] > 0) {
      const int k = ks[i];
      const double t = tokens - (ExpectedTokens(acceptance[i], k) - ExpectedTokens(acceptance[i], k - 1));
      --count[k];
      ++count[k - 1];
      const int d = drafting - (k == 1 ? 1 : 0);
      const double r = rate(t, rows - 1, d, round_k());
      if (!(r > best * (1.0 + 1e-12))) {
        ++count[k];
        --count[k - 1];
        break;
      }
      best = r;
      tokens = t;
      rows -= 1;
      drafting = d;
      ks[i] = k - 1;
    }
  }
  return ks;
}

}  // namespace hsx
