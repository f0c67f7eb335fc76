#include "engine/token_tree.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace hsx {
namespace {

// A reader for the Python literals a tree is written in: a list or tuple of tuples or
// lists of non-negative integers, trailing commas allowed, as ast.literal_eval reads them.
class LiteralReader {
 public:
  LiteralReader(const std::string& text, const std::string& field) : s_(text), field_(field) {}

  Result<std::vector<std::vector<int>>> Read() {
    std::vector<std::vector<int>> paths;
    Skip();
    const char open = Peek();
    if (open != '[' && open != '(') return Fail("expected a list of paths such as \"[(0,), (1,), (0, 0)]\"");
    const char close = open == '[' ? ']' : ')';
    ++at_;
    while (true) {
      Skip();
      if (Peek() == close) {
        ++at_;
        break;
      }
      auto path = ReadPath();
      if (!path.ok()) return path.status();
      paths.push_back(std::move(*path));
      Skip();
      if (Peek() == ',') {
        ++at_;
      } else if (Peek() != close) {
        return Fail("expected ',' or the list's end");
      }
    }
    Skip();
    if (at_ != s_.size()) return Fail("unexpected text after the list");
    return paths;
  }

 private:
  Result<std::vector<int>> ReadPath() {
    const char open = Peek();
    if (open != '(' && open != '[') return Fail("expected a path, a tuple of child ranks such as (0, 1)");
    const char close = open == '(' ? ')' : ']';
    ++at_;
    std::vector<int> path;
    bool comma = false;  // Python: (0) is an int, (0,) a tuple
    while (true) {
      Skip();
      if (Peek() == close) {
        ++at_;
        break;
      }
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) {
        return Fail("expected a child rank (a non-negative integer)");
      }
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) {
        v = v * 10 + (s_[at_++] - '0');
        if (v > 1000000) return Fail("a child rank is too large");
      }
      path.push_back(static_cast<int>(v));
      Skip();
      if (Peek() == ',') {
        ++at_;
        comma = true;
      } else if (Peek() != close) {
        return Fail("expected ',' or the path's end");
      }
    }
    if (open == '(' && path.size() == 1 && !comma) return Fail("(" + std::to_string(path[0]) + ") is not a tuple: write (" + std::to_string(path[0]) + ",)");
    if (path.empty()) return Fail("an empty path (the root is implicit)");
    return path;
  }
  char Peek() const { return at_ < s_.size() ? s_[at_] : '\0'; }
  void Skip() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  Status Fail(const std::string& what) const {
    return Error(field_ + ": " + what + " at character " + std::to_string(at_) + " of \"" + s_ + "\"");
  }

  const std::string& s_;
  const std::string& field_;
  size_t at_ = 0;
};

std::string PathText(const std::vector<int>& p) {
  std::string s = "(";
  for (size_t i = 0; i < p.size(); ++i) s += std::to_string(p[i]) + (p.size() == 1 || i + 1 < p.size() ? ", " : "");
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s + ")";
}

TokenTree FromSorted(std::vector<std::vector<int>> paths) {
  TokenTree t;
  std::map<std::vector<int>, int> index;
  for (size_t i = 0; i < paths.size(); ++i) index[paths[i]] = static_cast<int>(i);
  for (const auto& p : paths) {
    const std::vector<int> up(p.begin(), p.end() - 1);
    t.parent.push_back(up.empty() ? -1 : index.at(up));
    t.depth.push_back(static_cast<int32_t>(p.size()));
    t.rank.push_back(p.back());
    t.max_depth = std::max(t.max_depth, static_cast<int>(p.size()));
  }
  t.paths = std::move(paths);
  return t;
}

}  // namespace

int TokenTree::NodesUpToDepth(int d) const {
  int n = 0;
  while (n < size() && depth[n] <= d) ++n;
  return n;
}

uint64_t TokenTree::AncestorMask(int i) const { return hsx::AncestorMask(parent, i); }

uint64_t AncestorMask(const std::vector<int32_t>& parent, int i) {
  uint64_t mask = 0;
  for (int j = i; j >= 0; j = parent[j]) mask |= uint64_t{1} << j;
  return mask;
}

int NodeDepth(const std::vector<int32_t>& parent, int i) {
  int d = 0;
  for (int j = i; j >= 0; j = parent[j]) ++d;
  return d;
}

Result<TokenTree> TokenTree::Parse(const std::string& text, const std::string& field) {
  LiteralReader reader(text, field);
  auto read = reader.Read();
  if (!read.ok()) return read.status();
  std::vector<std::vector<int>> paths = std::move(*read);
  if (paths.empty()) return Error(field + ": the tree has no nodes (expected at least one path such as (0,))");
  if (paths.size() > static_cast<size_t>(kMaxNodes)) {
    return Error(field + ": " + std::to_string(paths.size()) + " nodes, at most " + std::to_string(kMaxNodes) +
                 " are supported (one verification row each, plus the root)");
  }
  // vLLM: sorted(tree_choices, key=lambda t: (len(t), t)).
  std::sort(paths.begin(), paths.end(), [](const std::vector<int>& a, const std::vector<int>& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  for (size_t i = 0; i < paths.size(); ++i) {
    if (i > 0 && paths[i] == paths[i - 1]) return Error(field + ": path " + PathText(paths[i]) + " is given twice");
    if (paths[i].size() > 1) {
      const std::vector<int> up(paths[i].begin(), paths[i].end() - 1);
      if (!std::binary_search(paths.begin(), paths.end(), up, [](const std::vector<int>& a, const std::vector<int>& b) {
            return a.size() != b.size() ? a.size() < b.size() : a < b;
          })) {
        return Error(field + ": path " + PathText(paths[i]) + " has no parent " + PathText(up) +
                     " (every prefix of a path must be a path too)");
      }
    }
  }
  return FromSorted(std::move(paths));
}

TokenTree TokenTree::Chain(int k) {
  std::vector<std::vector<int>> paths;
  for (int i = 1; i <= k; ++i) paths.emplace_back(static_cast<size_t>(i), 0);
  return FromSorted(std::move(paths));
}

}  // namespace hsx
