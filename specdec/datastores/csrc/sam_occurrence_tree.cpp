// The occurrence tree: the sam drafter's draft tree, read from one or more automata
// (data structures: TreeSource, OccurrenceTree and OccurrenceIndex in sam.h).
//
// The builder (reference: occurrence_tree in specdec/reference/suffix_automaton.py).
//
// Input: up to kMaxSources matches, each (index, state, length, bias, rank): an automaton,
// the cursor's state and match length there, a bias subtracted from the length before
// sources are compared (l_bias for the static corpus), and a recency rank (larger: more
// recent text; the sequence's own text outranks the shared store, which outranks a corpus).
//
// 1. A match whose state has no transition (every occurrence ends its text) moves to its
//    suffix link, a shorter match, until one has (the root: no draft). A match with a
//    continuation never moves: no fallback while the longest match continues.
// 2. The sources whose biased length is the largest are kept (the longest match; ties all
//    kept), the others dropped. The root's occurrences are the kept states' sum.
// 3. A node stands for a path of tokens after the match and holds, per kept source, the
//    state of "match + path" (absent where that source lacks the path). Its children are
//    the tokens any of its states continues with; a child's occurrences are the sum over
//    sources of |endpos(next(state, token))|, its recency the largest (rank, end of the
//    match occurrence = last_endpos - depth) over them. The `max_children` children of
//    most occurrences (then most recent, then lowest token) are its candidates.
// 4. Best first: the candidate of the largest weight, occurrences / 2^depth (then most
//    recent, then shallowest, then first offered) is emitted next, and its own candidates
//    offered, until `max_nodes` nodes (root included) or no candidate is left; nodes deeper
//    than `max_depth` are never offered. A child never has more occurrences than its
//    parent and is one level deeper, so its weight is at most half its parent's: parents
//    come first and every prefix of the output is itself a tree.
//
// Cost: O(sum of the expanded states' degrees + N log N) for N nodes; no text is read.

#include "sam.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace specdec {
namespace sam {

int32_t node_feature(int32_t match_length, int32_t occurrences, int32_t parent_occurrences) {
  int32_t length_class = 0;
  if (match_length > 1) {
    int32_t bits = 0;
    for (uint32_t v = uint32_t(match_length); v > 0; v >>= 1) ++bits;
    length_class = std::min(bits - 1, 4);
  }
  int32_t share = occurrences >= parent_occurrences ? 2 : (2 * int64_t(occurrences) >= parent_occurrences ? 1 : 0);
  int32_t support = occurrences <= 1 ? 0 : (occurrences <= 3 ? 1 : 2);
  return (length_class * 3 + share) * 3 + support;
}

OccurrenceTree build_occurrence_tree(std::vector<TreeSource> sources, int64_t pending, int32_t max_nodes,
                                     int32_t max_depth, int32_t max_children, double min_share,
                                     double match_factor, double match_offset) {
  OccurrenceTree tree;
  tree.tokens.push_back(pending);
  tree.parents.push_back(-1);
  tree.occurrences.push_back(0);
  tree.sources.push_back(0);
  // Step 1: fall back only while the match has no continuation.
  std::vector<TreeSource> live;
  for (TreeSource source : sources) {
    const OccurrenceIndex& index = *source.index;
    int32_t state = source.state;
    if (state <= kRoot || state >= index.num_states()) continue;
    int32_t length = source.length;
    while (state > kRoot && !index.has_children(state)) {
      state = index.link_of(state);
      length = state > kRoot ? index.length_of(state) : 0;
    }
    if (state <= kRoot) continue;
    source.state = state;
    source.length = length;
    live.push_back(source);
  }
  if (live.empty() || max_nodes < 2 || max_depth < 1) return tree;
  // Step 2: the longest (biased) match.
  int32_t best = std::numeric_limits<int32_t>::min();
  for (const auto& source : live) best = std::max(best, source.length - source.bias);
  std::vector<TreeSource> kept;
  int32_t root_sources = 0;
  for (const auto& source : live) {
    if (source.length - source.bias != best || int(kept.size()) == kMaxSources) continue;
    kept.push_back(source);
    tree.match_length = std::max(tree.match_length, source.length);
    tree.root_occurrences += source.index->occurrences_of(source.state);
    root_sources |= 1 << source.rank;
  }
  tree.occurrences[0] = tree.root_occurrences;
  tree.sources[0] = root_sources;
  // Step 4 (optional): size by evidence. At most match_factor x (biased match length) +
  // match_offset draft tokens, and no node below min_share of the root's occurrences.
  if (match_factor > 0.0) {
    double cap = 1.0 + match_factor * double(std::max(best, 0)) + match_offset;
    if (cap < double(max_nodes)) max_nodes = int32_t(cap);
    if (max_nodes < 2) return tree;
  }
  const double min_occurrences = min_share * double(tree.root_occurrences);
  const int num_sources = int(kept.size());

  using States = std::array<int32_t, kMaxSources>;  // per kept source: the node's state (-1: absent)
  struct Candidate {
    int32_t occurrences;
    int64_t recency;
    int32_t depth, order, parent;
    int64_t token;
    int32_t sources;
    States states;
  };
  // Best first: most occurrences, most recent, shallowest, first offered.
  // Best first: the largest weight (occurrences halved per level of depth: exact in double),
  // then the most recent, then the shallowest, then the first offered.
  auto worse = [](const Candidate& a, const Candidate& b) {
    double weight_a = std::ldexp(double(a.occurrences), -a.depth), weight_b = std::ldexp(double(b.occurrences), -b.depth);
    if (weight_a != weight_b) return weight_a < weight_b;
    if (a.recency != b.recency) return a.recency < b.recency;
    if (a.depth != b.depth) return a.depth > b.depth;
    return a.order > b.order;
  };
  std::vector<Candidate> heap;
  std::vector<ChildInfo> scratch;
  std::array<std::vector<ChildInfo>, kMaxSources> lists;
  int32_t offered = 0;

  auto expand = [&](int32_t node, const States& states, int32_t depth) {
    if (depth >= max_depth) return;
    for (int i = 0; i < num_sources; ++i) {
      lists[size_t(i)].clear();
      if (states[size_t(i)] > kRoot) kept[size_t(i)].index->children(states[size_t(i)], lists[size_t(i)]);
    }
    // k-way merge of the sources' child lists (each sorted by token), keeping the best
    // max_children merged children in `top` (a small sorted array: degree is usually tiny).
    std::vector<Candidate> top;
    std::array<size_t, kMaxSources> at{};
    for (;;) {
      int64_t token = std::numeric_limits<int64_t>::max();
      for (int i = 0; i < num_sources; ++i)
        if (at[size_t(i)] < lists[size_t(i)].size()) token = std::min<int64_t>(token, lists[size_t(i)][at[size_t(i)]].token);
      if (token == std::numeric_limits<int64_t>::max()) break;
      Candidate child{0, -1, depth + 1, 0, node, token, 0, {}};
      child.states.fill(-1);
      for (int i = 0; i < num_sources; ++i) {
        auto& list = lists[size_t(i)];
        if (at[size_t(i)] < list.size() && list[at[size_t(i)]].token == token) {
          const ChildInfo& info = list[at[size_t(i)]++];
          child.occurrences += info.occurrences;
          int64_t recency = (int64_t(kept[size_t(i)].rank) << 32) + int64_t(info.last_endpos) - (depth + 1);
          child.recency = std::max(child.recency, recency);
          child.states[size_t(i)] = info.state;
          child.sources |= 1 << kept[size_t(i)].rank;
        }
      }
      if (double(child.occurrences) < min_occurrences) continue;
      // Rank among siblings: occurrences, then recency, then the lower token (merge order).
      auto better = [](const Candidate& a, const Candidate& b) {
        if (a.occurrences != b.occurrences) return a.occurrences > b.occurrences;
        return a.recency > b.recency;
      };
      if (int(top.size()) < max_children) {
        top.push_back(child);
      } else if (better(child, top.back())) {
        top.back() = child;
      } else {
        continue;
      }
      for (size_t j = top.size() - 1; j > 0 && better(top[j], top[j - 1]); --j) std::swap(top[j], top[j - 1]);
    }
    for (auto& child : top) {
      child.order = offered++;
      heap.push_back(child);
      std::push_heap(heap.begin(), heap.end(), worse);
    }
  };

  States root_states;
  root_states.fill(-1);
  for (int i = 0; i < num_sources; ++i) root_states[size_t(i)] = kept[size_t(i)].state;
  expand(0, root_states, 0);
  while (!heap.empty() && int32_t(tree.tokens.size()) < max_nodes) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    Candidate best_candidate = heap.back();
    heap.pop_back();
    int32_t node = int32_t(tree.tokens.size());
    tree.tokens.push_back(best_candidate.token);
    tree.parents.push_back(best_candidate.parent);
    tree.occurrences.push_back(best_candidate.occurrences);
    tree.sources.push_back(best_candidate.sources);
    expand(node, best_candidate.states, best_candidate.depth);
  }
  return tree;
}

// Python face: sources as (automaton, state, length, bias, rank) with the automaton a

}  // namespace sam
}  // namespace specdec
