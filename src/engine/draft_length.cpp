#include "engine/draft_length.h"

#include <algorithm>
#include <iterator>
#include <cstdlib>

namespace hsx {
namespace {

// A lower measurement replaces the figure at once: first-use costs and host hiccups only
// ever lengthen a step, so an inflated figure must not linger. A higher one moves the
// figure `weight` toward it.
void Smooth(double& figure, double seconds, double weight, bool seen) {
  figure = seen && seconds > figure ? (1.0 - weight) * figure + weight * seconds : seconds;
}

}  // namespace

// The first step of each kind is not a measurement: it captures its CUDA graph (or tunes its
// GEMMs), up to hundreds of times its cost. Taken as one it stops drafting, and with it the
// measurements that would correct it.
void DraftCostModel::ObserveTarget(int rows, double seconds) {
  if (target_warm_.insert(rows).second) return;
  const bool seen = target_.count(rows) > 0;
  Smooth(target_[rows], seconds, weight_, seen);
}

void DraftCostModel::ObserveDraft(int seqs, int k, double seconds) {
  if (draft_warm_.insert({seqs, k}).second) return;
  const bool seen = draft_.count({seqs, k}) > 0;
  Smooth(draft_[{seqs, k}], seconds, weight_, seen);
}

// Linear between measured rows; past the most, on the slope of the last two (never
// falling), or flat with one. Below the least, in proportion to rows: optimistic for fewer
// rows, so a batch that has only run verification steps tries a plain one and measures it
// (flat, a plain step looked as dear as a verification of K+1 rows a sequence, and a large
// batch kept drafting where drafting lost: 0.89x plain at batch 128 on the H200).
double DraftCostModel::TargetSeconds(int rows) const {
  if (target_.empty()) return 1.0;
  auto hi = target_.lower_bound(rows);
  if (hi != target_.end() && hi->first == rows) return hi->second;
  if (hi == target_.begin()) return hi->second * std::max(rows, 1) / hi->first;
  if (hi == target_.end()) {
    auto last = std::prev(target_.end());
    if (last == target_.begin()) return last->second;
    auto before = std::prev(last);
    const double slope = std::max(0.0, (last->second - before->second) / (last->first - before->first));
    return last->second + slope * (rows - last->first);
  }
  auto lo = std::prev(hi);
  const double t = static_cast<double>(rows - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

// A round's time at a measured request count scales with k from the nearest measured k;
// between measured request counts it is linear (flat outside them). Unmeasured: the prior.
double DraftCostModel::DraftSeconds(int seqs, int k) const {
  if (k <= 0 || seqs <= 0) return 0.0;
  if (draft_.empty()) return ratio_ * k * TargetSeconds(seqs);
  std::map<int, std::pair<int, double>> nearest;  // by request count: the measured k nearest k (lower on a tie)
  for (const auto& [key, seconds] : draft_) {
    const auto [s, kk] = key;
    auto it = nearest.find(s);
    if (it == nearest.end() || std::abs(kk - k) < std::abs(it->second.first - k)) nearest[s] = {kk, seconds};
  }
  std::map<int, double> at_k;
  for (const auto& [s, measured] : nearest) at_k[s] = measured.second * k / measured.first;
  auto hi = at_k.lower_bound(seqs);
  if (hi != at_k.end() && hi->first == seqs) return hi->second;
  if (hi == at_k.begin()) return hi->second;
  if (hi == at_k.end()) return std::prev(hi)->second;
  auto lo = std::prev(hi);
  const double t = static_cast<double>(seqs - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
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
  auto rate = [&](double extra_tokens, int extra_rows, int drafting, int round_k) {
    return (n + extra_tokens) / (cost.TargetSeconds(n + extra_rows) + cost.DraftSeconds(drafting, round_k));
  };
  // The best (m, c): the first m of order draft min(c, room) each. Only a strictly better
  // rate replaces the best, so ties keep fewer drafts.
  double best = rate(0, 0, 0, 0);
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
