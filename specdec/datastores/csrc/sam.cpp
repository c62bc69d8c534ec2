// Compact suffix automata for specdec: the static corpus automaton and the dynamic
// per-sequence one. specdec/reference/suffix_automaton.py is the readable oracle (the
// construction's cases 1-3, the cursor, the draft rule); this file follows it name for
// name and is tested against it.
//
// Two representations:
//
// * MutableAutomaton: built online, one token at a time. Serves the static builder (a
//   generalized automaton over many documents, exported to CSR arrays) and DynamicSam
//   (one growing document: prompt + generated text, with the matching cursor).
//   Per state: length, link, min_endpos (int32 each), and its transitions as a block
//   of Edge{token, target} sorted by token in one shared pool. Blocks have power-of-two
//   capacities; a full block moves to a twice larger one and the old block goes on a
//   free list of its size, so the pool wastes at most half of itself. The root's
//   transitions (one per distinct token, up to the vocabulary) live in a dense table
//   instead (ids below kDenseRoot): it is the state every failed match falls back to.
//
// * StaticView<Tok>: read-only matching and drafting over the CSR arrays of a datastore
//   file, memory-mapped by numpy and never copied:
//     length[S] int32, link[S] int32, draft_endpos[S] int32,
//     edge_start[S+1] uint32, edge_token[E] Tok, edge_target[E] int32,
//     tokens[N] Tok, doc_starts[D+1] int64,
//   with Tok = uint16 when the vocabulary fits (the common case) or uint32. State v's
//   transitions are edge_*[edge_start[v] : edge_start[v+1]], sorted by token. Measured on
//   10M tokens of code, math and prose: 1.46 states and 2.05 edges per token, so
//   1.46 * 16 B + 2.05 * 6 B + 2 B = 38 B per corpus token. Reads are bounds-checked
//   (see next()), so no file, however damaged, makes them leave the arrays or loop.
//   draft_endpos[v] is the end of the occurrence of v's strings with the most tokens after
//   it in its document (ties: the earliest). For one text that is min_endpos (the
//   reference's rule); with documents kept apart the earliest occurrence may end its
//   document, with nothing to draft, while a later one continues.
//
// Positions are int32: a corpus holds fewer than 2^31 tokens and 2^32 transitions.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int32_t kRoot = 0;
constexpr uint32_t kLinearScan = 8;  // blocks this small are scanned, larger ones bisected
// Root transitions on tokens below this live in a dense table (4 MB at most); larger ids
// (vocabularies past a million, or tests' random 31-bit ids) use the root's sorted block.
constexpr int64_t kDenseRoot = int64_t(1) << 20;

struct Edge {
  int32_t token;
  int32_t target;
};

using Cursor = std::pair<int32_t, int32_t>;  // (state, match length)

inline uint32_t block_capacity(uint32_t count) {  // power of two >= count (0 for 0)
  if (count == 0) return 0;
  uint32_t capacity = 1;
  while (capacity < count) capacity <<= 1;
  return capacity;
}

inline int log2_exact(uint32_t power) { return 31 - __builtin_clz(power); }

// The reference's draft rule, shared by both representations: from `state`, move to the
// suffix link while fewer than `wanted` tokens follow its draft occurrence and the link is
// not the root. `available(state)` counts those tokens.
template <typename Available, typename Link>
int32_t draft_state(int32_t state, int32_t wanted, Available available, Link link) {
  while (available(state) < wanted && link(state) > kRoot) state = link(state);
  return state;
}

// The matching cursor's step, shared by both representations (amortized O(1)): follow
// suffix links, the match shrinking to each state's length, until a state has a `token`
// transition; take it. At the root with none, the match is empty.
template <typename Automaton, typename Token>
Cursor cursor_step(const Automaton& automaton, Cursor cursor, Token token) {
  auto [state, length] = cursor;
  for (;;) {
    int32_t target = automaton.next(state, token);
    if (target >= 0) return {target, length + 1};
    state = automaton.link_of(state);  // -1 past the root (or, in a damaged file, on a bad link)
    if (state < 0) return {kRoot, 0};
    length = automaton.length_of(state);
  }
}

class MutableAutomaton {
 public:
  // `track_occurrences`: keep occurrences_[v] = |endpos(v)| and last_endpos_[v] = max(endpos(v))
  // online (the dynamic automaton and the shared store draft occurrence trees from them; the
  // static builder computes them in one pass at the end instead, which is cheaper).
  explicit MutableAutomaton(bool track_occurrences = false) : track_(track_occurrences) { new_state(0, -1, -1); }

  void reserve(size_t tokens) {
    size_t states = tokens + tokens / 2 + 1;
    length_.reserve(states);
    link_.reserve(states);
    min_endpos_.reserve(states);
    if (track_) {
      occurrences_.reserve(states);
      last_endpos_.reserve(states);
    }
    offset_.reserve(states);
    count_.reserve(states);
    pool_.reserve(tokens * 5 / 2);  // ~2.05 edges per token, plus the blocks' slack
  }

  void start_document() { last_ = kRoot; }
  int32_t last_state() const { return last_; }  // the state of the current document's whole prefix

  // Appends `token`, at corpus position `position`, to the current document; the
  // reference's SuffixAutomaton.extend (its cases 1-3 and the generalized case).
  void extend(int32_t token, int32_t position) {
    split_ = clone_ = -1;
    int32_t q = next(last_, token);
    if (q >= 0) {  // generalized case: this document's prefix + token occurred before
      last_ = (length_[q] == length_[last_] + 1) ? q : split(last_, token, q);
    } else {
      int32_t cur = new_state(length_[last_] + 1, -1, position);
      int32_t p = last_;
      while (p != -1 && insert_if_absent(p, token, cur)) p = link_[p];
      if (p == -1) {  // case 1: the token is new
        link_[cur] = kRoot;
      } else {
        q = next(p, token);
        link_[cur] = (length_[q] == length_[p] + 1) ? q : split(p, token, q);  // case 2 : case 3
      }
      last_ = cur;
    }
    if (track_) count_occurrence(position);
  }

  // The new position ends an occurrence of every suffix of the document's prefix: the
  // states on last_'s suffix-link path. O(length of that path): a few states on natural
  // text, up to the text's length on a text that repeats one token (see sam.md).
  void count_occurrence(int32_t position) {
    for (int32_t state = last_; state > kRoot; state = link_[state]) {
      ++occurrences_[state];
      last_endpos_[state] = position;
    }
  }

  Cursor step(Cursor cursor, int32_t token) const { return cursor_step(*this, cursor, token); }
  int32_t link_of(int32_t state) const { return link_[state]; }
  int32_t length_of(int32_t state) const { return length_[state]; }

  int32_t next(int32_t state, int32_t token) const {
    if (state == kRoot && token < kDenseRoot) return (token >= 0 && size_t(token) < root_.size()) ? root_[token] : -1;
    const Edge* edge = find(state, token);
    return edge ? edge->target : -1;
  }

  // The clone made by the last extend and the state it split (-1: none).
  int32_t split_state() const { return split_; }
  int32_t clone_state() const { return clone_; }

  int32_t num_states() const { return int32_t(length_.size()); }
  uint64_t num_edges() const { return num_edges_; }
  uint64_t pool_entries() const { return pool_.size(); }
  const std::vector<int32_t>& length() const { return length_; }
  const std::vector<int32_t>& link() const { return link_; }
  const std::vector<int32_t>& min_endpos() const { return min_endpos_; }
  bool tracks_occurrences() const { return track_; }
  int32_t occurrences(int32_t state) const { return occurrences_[state]; }
  int32_t last_endpos(int32_t state) const { return last_endpos_[state]; }

  // The transitions of a state other than the root, with each target's occurrences and
  // last end position (the automaton must track occurrences). O(degree).
  template <typename Visit>
  void for_each_child(int32_t state, Visit visit) const {
    const Edge* block = pool_.data() + offset_[state];
    for (uint32_t i = 0; i < count_[state]; ++i) {
      int32_t target = block[i].target;
      visit(block[i].token, target, occurrences_[target], last_endpos_[target]);
    }
  }
  bool has_children(int32_t state) const { return count_[state] > 0; }

  // Bytes held by the growable arrays (capacity, not size): the builder's footprint.
  size_t memory_bytes() const {
    size_t free_bytes = 0;
    for (const auto& list : free_) free_bytes += list.capacity() * sizeof(uint64_t);
    return (length_.capacity() + link_.capacity() + min_endpos_.capacity() + count_.capacity() +
            occurrences_.capacity() + last_endpos_.capacity()) * 4 +
           offset_.capacity() * 8 + pool_.capacity() * sizeof(Edge) + root_.capacity() * 4 + free_bytes;
  }

  // The transitions as CSR arrays: edge_start[S+1], edge_token[E], edge_target[E].
  template <typename Tok>
  void export_edges(uint32_t* edge_start, Tok* edge_token, int32_t* edge_target) const {
    uint64_t at = 0;
    edge_start[0] = 0;
    for (size_t token = 0; token < root_.size(); ++token) {  // then the root's block: larger ids
      if (root_[token] < 0) continue;
      edge_token[at] = Tok(token);
      edge_target[at++] = root_[token];
    }
    for (int32_t state = 0; state < num_states(); ++state) {
      const Edge* block = pool_.data() + offset_[state];
      for (uint32_t i = 0; i < count_[state]; ++i) {
        edge_token[at] = Tok(block[i].token);
        edge_target[at++] = block[i].target;
      }
      edge_start[state + 1] = uint32_t(at);
    }
  }

  // The tracked occurrences against a recount (tests): every position of every document
  // (`doc_starts[D+1]` cuts `tokens`) adds one to the state of its document prefix, and each
  // state's total flows to its suffix link, longest states first. O(N + S log S).
  std::string check_occurrences(const int32_t* tokens, const int64_t* doc_starts, int64_t num_docs) const {
    if (!track_) return "";
    std::vector<int32_t> occurrences(size_t(num_states()), 0), last(size_t(num_states()), -1);
    for (int64_t d = 0; d < num_docs; ++d) {
      int32_t state = kRoot;
      for (int64_t at = doc_starts[d]; at < doc_starts[d + 1]; ++at) {
        state = next(state, tokens[at]);
        if (state < 0) return "a document's prefix is not in the automaton at position " + std::to_string(at);
        ++occurrences[size_t(state)];
        last[size_t(state)] = std::max(last[size_t(state)], int32_t(at));
      }
    }
    std::vector<int32_t> order(static_cast<size_t>(num_states()));
    for (int32_t v = 0; v < num_states(); ++v) order[size_t(v)] = v;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return length_[a] > length_[b]; });
    for (int32_t v : order) {
      if (v == kRoot) continue;
      if (occurrences[size_t(v)] != occurrences_[v] || last[size_t(v)] != last_endpos_[v]) {
        std::ostringstream out;
        out << "state " << v << ": tracks " << occurrences_[v] << " occurrences (last at " << last_endpos_[v]
            << "), the text has " << occurrences[size_t(v)] << " (last at " << last[size_t(v)] << ")";
        return out.str();
      }
      int32_t link = link_[v];
      occurrences[size_t(link)] += occurrences[size_t(v)];
      last[size_t(link)] = std::max(last[size_t(link)], last[size_t(v)]);
    }
    return "";
  }

  // Every structural invariant; "" when all hold, else the first failure, named.
  // With `tokens` (the text) also the semantic one: each state's longest string, read at
  // its min_endpos, leads from the root back to it (O(sum of lengths): tests only).
  std::string check(const int32_t* tokens, int64_t num_tokens) const {
    std::ostringstream out;
    uint64_t edges = 0;
    for (int32_t state = 0; state < num_states(); ++state) {
      if (state > 0) {
        int32_t link = link_[state];
        if (link < 0 || link >= num_states()) return (out << "state " << state << ": link " << link, out.str());
        if (length_[link] >= length_[state])
          return (out << "state " << state << ": link length " << length_[link] << " >= " << length_[state], out.str());
      }
      int32_t previous = std::numeric_limits<int32_t>::min();
      auto visit = [&](int32_t token, int32_t target) -> bool {
        ++edges;
        if (token <= previous) return (out << "state " << state << ": edges not sorted at token " << token, false);
        previous = token;
        if (target <= 0 || target >= num_states())
          return (out << "state " << state << ": edge target " << target, false);
        if (length_[target] < length_[state] + 1)
          return (out << "state " << state << ": edge on " << token << " to a shorter state", false);
        return true;
      };
      if (state == kRoot) {
        for (size_t token = 0; token < root_.size(); ++token)
          if (root_[token] >= 0 && !visit(int32_t(token), root_[token])) return out.str();
      }
      const Edge* block = pool_.data() + offset_[state];
      for (uint32_t i = 0; i < count_[state]; ++i)
        if (!visit(block[i].token, block[i].target)) return out.str();
      if (tokens != nullptr && state > 0) {
        int64_t end = min_endpos_[state], start = end - length_[state] + 1;
        if (start < 0 || end >= num_tokens) return (out << "state " << state << ": min_endpos " << end, out.str());
        int32_t walk = kRoot;
        for (int64_t at = start; at <= end && walk >= 0; ++at) walk = next(walk, tokens[at]);
        if (walk != state)
          return (out << "state " << state << ": its longest string leads to state " << walk, out.str());
      }
    }
    if (edges != num_edges_) return (out << "counted " << edges << " edges, expected " << num_edges_, out.str());
    return "";
  }

 private:
  int32_t new_state(int32_t length, int32_t link, int32_t min_endpos, int32_t occurrences = 0,
                    int32_t last_endpos = -1) {
    length_.push_back(length);
    link_.push_back(link);
    min_endpos_.push_back(min_endpos);
    if (track_) {
      occurrences_.push_back(occurrences);
      last_endpos_.push_back(last_endpos);
    }
    offset_.push_back(0);
    count_.push_back(0);
    return int32_t(length_.size() - 1);
  }

  const Edge* find(int32_t state, int32_t token) const {
    const Edge* begin = pool_.data() + offset_[state];
    const Edge* end = begin + count_[state];
    if (count_[state] <= kLinearScan) {
      for (const Edge* edge = begin; edge != end && edge->token <= token; ++edge)
        if (edge->token == token) return edge;
      return nullptr;
    }
    const Edge* edge = std::lower_bound(begin, end, token, [](const Edge& e, int32_t t) { return e.token < t; });
    return (edge != end && edge->token == token) ? edge : nullptr;
  }

  Edge* find(int32_t state, int32_t token) {
    return const_cast<Edge*>(static_cast<const MutableAutomaton*>(this)->find(state, token));
  }

  uint64_t allocate(uint32_t capacity) {
    auto& free_list = free_[log2_exact(capacity)];
    if (!free_list.empty()) {
      uint64_t offset = free_list.back();
      free_list.pop_back();
      return offset;
    }
    uint64_t offset = pool_.size();
    pool_.resize(pool_.size() + capacity);
    return offset;
  }

  // Adds state -token-> target unless the state has a `token` edge; true when added.
  bool insert_if_absent(int32_t state, int32_t token, int32_t target) {
    if (state == kRoot && token < kDenseRoot) {
      if (size_t(token) >= root_.size()) root_.resize(size_t(token) + 1, -1);
      if (root_[token] >= 0) return false;
      root_[token] = target;
      ++num_edges_;
      return true;
    }
    uint32_t count = count_[state];
    Edge* begin = pool_.data() + offset_[state];
    Edge* at = std::lower_bound(begin, begin + count, token, [](const Edge& e, int32_t t) { return e.token < t; });
    if (at != begin + count && at->token == token) return false;
    uint32_t index = uint32_t(at - begin);
    if (count == block_capacity(count)) {  // full (or empty): move to a block twice as large
      uint64_t offset = allocate(count == 0 ? 1 : 2 * count);  // may reallocate the pool
      Edge* source = pool_.data() + offset_[state];
      Edge* target_block = pool_.data() + offset;
      std::memcpy(target_block, source, index * sizeof(Edge));
      std::memcpy(target_block + index + 1, source + index, (count - index) * sizeof(Edge));
      if (count > 0) free_[log2_exact(count)].push_back(offset_[state]);
      offset_[state] = offset;
      begin = target_block;
    } else {
      std::memmove(begin + index + 1, begin + index, (count - index) * sizeof(Edge));
    }
    begin[index] = Edge{token, target};
    count_[state] = count + 1;
    ++num_edges_;
    return true;
  }

  // Case 3: clone q at length(p) + 1 (q's edges, link, min_endpos and, when tracked, its
  // occurrences so far: the new position is counted by extend's walk, which passes the
  // clone) and send p's chain of suffix links, where it led to q on `token`, to the clone.
  int32_t split(int32_t p, int32_t token, int32_t q) {
    int32_t clone = track_ ? new_state(length_[p] + 1, link_[q], min_endpos_[q], occurrences_[q], last_endpos_[q])
                           : new_state(length_[p] + 1, link_[q], min_endpos_[q]);
    uint32_t count = count_[q];
    if (count > 0) {
      uint64_t offset = allocate(block_capacity(count));
      std::memcpy(pool_.data() + offset, pool_.data() + offset_[q], count * sizeof(Edge));
      offset_[clone] = offset;
      count_[clone] = count;
      num_edges_ += count;
    }
    for (; p != -1; p = link_[p]) {
      if (p == kRoot && token < kDenseRoot) {
        if (size_t(token) >= root_.size() || root_[token] != q) break;
        root_[token] = clone;
      } else {
        Edge* edge = find(p, token);
        if (edge == nullptr || edge->target != q) break;
        edge->target = clone;
      }
    }
    link_[q] = clone;
    split_ = q;
    clone_ = clone;
    return clone;
  }

  bool track_ = false;
  std::vector<int32_t> length_, link_, min_endpos_;
  std::vector<int32_t> occurrences_, last_endpos_;  // when tracked: |endpos(v)|, max(endpos(v))
  std::vector<uint64_t> offset_;  // block of each state's edges in pool_
  std::vector<uint32_t> count_;   // edges of each state (block capacity = block_capacity(count))
  std::vector<Edge> pool_;
  std::vector<int32_t> root_;     // root transitions, dense by token (-1: none)
  std::vector<uint64_t> free_[32];
  uint64_t num_edges_ = 0;
  int32_t last_ = kRoot;
  int32_t split_ = -1, clone_ = -1;
};

int32_t checked_token(int64_t token) {
  if (token < 0 || token > std::numeric_limits<int32_t>::max())
    throw py::value_error("token id " + std::to_string(token) + " is outside 0..2^31-1");
  return int32_t(token);
}

template <typename T>
const T* array_data(const py::array& array, const char* name, int64_t expected_size) {
  if (!array.dtype().is(py::dtype::of<T>()))
    throw py::type_error(std::string(name) + ": wrong dtype " + std::string(py::str(array.dtype())));
  if (!(array.flags() & py::array::c_style)) throw py::type_error(std::string(name) + " is not C-contiguous");
  if (array.ndim() != 1 || (expected_size >= 0 && array.shape(0) != expected_size))
    throw py::value_error(std::string(name) + ": shape does not match the automaton");
  return static_cast<const T*>(array.data());
}

// ---------------------------------------------------------------------------------------
// Occurrence trees (specdec/reference/suffix_automaton.py, "The occurrence tree", states
// the rule; docs/algorithms/sam.md says why). For a match in state v, the strings x of v
// occur |endpos(v)| times; the trie of the continuations of all those occurrences is the
// automaton itself below v: x followed by t occurs |endpos(next(v, t))| times. So the tree
// is read from transitions and per-state counts, never from the text.

struct ChildInfo {
  int32_t token, state, occurrences, last_endpos;
};

// What the tree builder reads from an automaton (dynamic, shared store, static file).
class OccurrenceIndex {
 public:
  virtual ~OccurrenceIndex() = default;
  // Appends the transitions of `state` (not the root), sorted by token.
  virtual void children(int32_t state, std::vector<ChildInfo>& out) const = 0;
  virtual bool has_children(int32_t state) const = 0;
  virtual int32_t link_of(int32_t state) const = 0;  // -1 past the root
  virtual int32_t length_of(int32_t state) const = 0;
  virtual int32_t occurrences_of(int32_t state) const = 0;
  virtual int32_t num_states() const = 0;
};

// An automaton that tracks occurrences, as an OccurrenceIndex.
class MutableIndex : public OccurrenceIndex {
 public:
  explicit MutableIndex(const MutableAutomaton& sam) : sam_(sam) {}
  void children(int32_t state, std::vector<ChildInfo>& out) const override {
    sam_.for_each_child(state, [&](int32_t token, int32_t target, int32_t occurrences, int32_t last) {
      out.push_back(ChildInfo{token, target, occurrences, last});
    });
  }
  bool has_children(int32_t state) const override { return sam_.has_children(state); }
  int32_t link_of(int32_t state) const override { return sam_.link_of(state); }
  int32_t length_of(int32_t state) const override { return sam_.length_of(state); }
  int32_t occurrences_of(int32_t state) const override { return sam_.occurrences(state); }
  int32_t num_states() const override { return sam_.num_states(); }

 private:
  const MutableAutomaton& sam_;
};

// ---------------------------------------------------------------------------------------
// A growing text and its automaton with occurrences tracked: what the dynamic automaton
// and a store generation share (accessors, the tree builder's index, bounds checks).
class CountedText {
 public:
  const OccurrenceIndex& index() const { return index_; }
  int64_t size() const { return int64_t(tokens_.size()); }
  int32_t num_states() const { return sam_.num_states(); }
  uint64_t num_edges() const { return sam_.num_edges(); }
  int32_t state_length(int32_t state) const { return sam_.length()[size_t(checked(state))]; }
  int32_t state_link(int32_t state) const { return sam_.link()[size_t(checked(state))]; }
  int32_t state_occurrences(int32_t state) const { return sam_.occurrences(checked(state)); }
  int32_t state_last_endpos(int32_t state) const { return sam_.last_endpos(checked(state)); }

 protected:
  int32_t checked(int32_t state) const {
    if (state < 0 || state >= sam_.num_states()) throw py::index_error("state " + std::to_string(state) + " out of range");
    return state;
  }

  MutableAutomaton sam_{true};
  MutableIndex index_{sam_};
  std::vector<int32_t> tokens_;
};

// ---------------------------------------------------------------------------------------
// The dynamic automaton of one sequence: committed tokens, their automaton, the cursor.
class DynamicSam : public CountedText {
 public:
  // For each token: advance the cursor first (a match must point to an earlier
  // occurrence), extend second; a split of the cursor's state moves it to the clone,
  // which now holds its string, so the cursor stays canonical.
  void commit(const std::vector<int64_t>& tokens) {
    for (int64_t raw : tokens) {
      int32_t token = checked_token(raw);
      cursor_ = sam_.step(cursor_, token);
      sam_.extend(token, int32_t(tokens_.size()));
      tokens_.push_back(token);
      int32_t clone = sam_.clone_state();
      if (clone >= 0 && cursor_.first == sam_.split_state() && cursor_.second <= sam_.length()[clone])
        cursor_.first = clone;
    }
  }

  // The cursor after `token` (the pending one), not committed: the match behind a draft.
  Cursor peek(int64_t token) const {
    if (token < 0 || token > std::numeric_limits<int32_t>::max()) return sam_.step(cursor_, -1);
    return sam_.step(cursor_, int32_t(token));
  }

  // Up to `wanted` tokens after the min_endpos of `state`, with the suffix-link fallback.
  py::list draft(int32_t state, int32_t wanted) const {
    py::list out;
    if (state <= kRoot || state >= sam_.num_states() || wanted < 1) return out;
    int64_t size = int64_t(tokens_.size());
    const auto& min_endpos = sam_.min_endpos();
    const auto& link = sam_.link();
    state = draft_state(
        state, wanted, [&](int32_t s) { return size - 1 - min_endpos[s]; }, [&](int32_t s) { return link[s]; });
    int64_t begin = int64_t(min_endpos[state]) + 1;
    int64_t end = std::min(size, begin + wanted);
    for (int64_t at = begin; at < end; ++at) out.append(tokens_[at]);
    return out;
  }

  // The last `n` committed tokens (fewer when the text is shorter).
  std::vector<int32_t> tail(int64_t n) const {
    int64_t size = int64_t(tokens_.size()), begin = std::max<int64_t>(0, size - std::max<int64_t>(n, 0));
    return std::vector<int32_t>(tokens_.begin() + begin, tokens_.end());
  }

  Cursor cursor() const { return cursor_; }
  size_t memory_bytes() const { return sam_.memory_bytes() + tokens_.capacity() * 4; }
  int32_t state_min_endpos(int32_t state) const { return sam_.min_endpos()[size_t(checked(state))]; }

  std::string check() const {
    std::string problem = sam_.check(tokens_.data(), int64_t(tokens_.size()));
    if (problem.empty()) {
      int64_t doc_starts[2] = {0, int64_t(tokens_.size())};
      problem = sam_.check_occurrences(tokens_.data(), doc_starts, 1);
    }
    if (!problem.empty()) return problem;
    auto [state, length] = cursor_;
    if (state < 0 || state >= sam_.num_states()) return "cursor state out of range";
    if (length > sam_.length()[state] || (state > 0 && length <= sam_.length()[sam_.link()[state]]))
      return "cursor not canonical: length " + std::to_string(length) + " in state " + std::to_string(state);
    return "";
  }

 private:
  Cursor cursor_{kRoot, 0};
};

// ---------------------------------------------------------------------------------------
// One generation of the store shared across requests (specdec/datastores/shared.py): an
// online generalized automaton over whole sequences (documents) added one at a time, with
// occurrences tracked. Sequences read it through their own cursors; a document added
// later may split the state a cursor is in, so readers re-match after every change
// (`version` counts them).
class SharedSam : public CountedText {
 public:
  // Appends one document (its tokens in order); the GIL is released while it works.
  void add_document(const std::vector<int64_t>& document) {
    std::vector<int32_t> checked_tokens;
    checked_tokens.reserve(document.size());
    for (int64_t raw : document) checked_tokens.push_back(checked_token(raw));
    if (int64_t(tokens_.size()) + int64_t(checked_tokens.size()) > std::numeric_limits<int32_t>::max() - 1)
      throw py::value_error("a shared automaton holds fewer than 2^31 tokens");
    py::gil_scoped_release release;
    sam_.start_document();
    for (int32_t token : checked_tokens) {
      sam_.extend(token, int32_t(tokens_.size()));
      tokens_.push_back(token);
    }
    doc_starts_.push_back(int64_t(tokens_.size()));
    ++version_;
  }

  Cursor step(Cursor cursor, int64_t token) const {
    check_cursor(cursor);
    if (token < 0 || token > std::numeric_limits<int32_t>::max()) return {kRoot, 0};
    return sam_.step(cursor, int32_t(token));
  }
  Cursor advance(Cursor cursor, const std::vector<int64_t>& tokens) const {
    check_cursor(cursor);
    for (int64_t token : tokens)
      cursor = (token < 0 || token > std::numeric_limits<int32_t>::max()) ? Cursor{kRoot, 0}
                                                                          : sam_.step(cursor, int32_t(token));
    return cursor;
  }

  // The stored documents, in order (tests, introspection): O(tokens).
  std::vector<std::vector<int32_t>> documents() const {
    std::vector<std::vector<int32_t>> out;
    for (size_t d = 0; d + 1 < doc_starts_.size(); ++d)
      out.emplace_back(tokens_.begin() + doc_starts_[d], tokens_.begin() + doc_starts_[d + 1]);
    return out;
  }

  int64_t version() const { return version_; }
  int64_t num_documents() const { return int64_t(doc_starts_.size()) - 1; }
  size_t memory_bytes() const { return sam_.memory_bytes() + tokens_.capacity() * 4 + doc_starts_.capacity() * 8; }

  std::string check() const {
    std::string problem = sam_.check(tokens_.data(), int64_t(tokens_.size()));
    if (!problem.empty()) return problem;
    return sam_.check_occurrences(tokens_.data(), doc_starts_.data(), num_documents());
  }

 private:
  void check_cursor(Cursor cursor) const {
    if (cursor.first < 0 || cursor.first >= sam_.num_states()) throw py::value_error("cursor state out of range");
  }
  std::vector<int64_t> doc_starts_{0};
  int64_t version_ = 0;
};

// ---------------------------------------------------------------------------------------
// The static builder: a generalized automaton over documents, exported as CSR arrays.
class StaticBuilder {
 public:
  explicit StaticBuilder(int64_t expected_tokens) { sam_.reserve(size_t(std::max<int64_t>(expected_tokens, 0))); }

  // Adds documents [first, last) of the corpus `tokens` (int32 [N]) cut by `doc_starts`
  // (int64 [D+1]); the GIL is released while it works. Each position also offers itself
  // as the draft occurrence of the state of its document prefix (that string is the
  // state's longest, so no later split moves it); finish() spreads them up the links.
  void add_documents(const py::array& tokens, const py::array& doc_starts, int64_t first, int64_t last) {
    const int32_t* text = array_data<int32_t>(tokens, "tokens", -1);
    const int64_t* starts = array_data<int64_t>(doc_starts, "doc_starts", -1);
    int64_t num_docs = doc_starts.shape(0) - 1, num_tokens = tokens.shape(0);
    if (first < 0 || last > num_docs || first > last) throw py::value_error("document range out of bounds");
    if (num_tokens > std::numeric_limits<int32_t>::max() - 1)
      throw py::value_error("a static automaton holds fewer than 2^31 tokens");
    for (int64_t d = first; d < last; ++d)
      if (starts[d] < 0 || starts[d] > starts[d + 1] || starts[d + 1] > num_tokens)
        throw py::value_error("doc_starts is not a sorted cut of the tokens");
    py::gil_scoped_release release;
    for (int64_t d = first; d < last; ++d) {
      sam_.start_document();
      for (int64_t at = starts[d]; at < starts[d + 1]; ++at) {
        sam_.extend(text[at], int32_t(at));
        best_.resize(size_t(sam_.num_states()), -1);
        after_.resize(size_t(sam_.num_states()), -1);
        occurrences_.resize(size_t(sam_.num_states()), 0);
        last_endpos_.resize(size_t(sam_.num_states()), -1);
        int32_t state = sam_.last_state(), after = int32_t(starts[d + 1] - at - 1);
        if (after > after_[state]) best_[state] = int32_t(at), after_[state] = after;  // ties keep the earliest
        ++occurrences_[size_t(state)];  // positions come in order: the last one offered is the latest
        last_endpos_[size_t(state)] = int32_t(at);
      }
    }
    if (sam_.num_edges() >= (uint64_t(1) << 32)) throw py::value_error("more than 2^32 transitions");
    peak_bytes_ = std::max(peak_bytes_, sam_.memory_bytes() + (best_.capacity() + after_.capacity() +
                                                               occurrences_.capacity() + last_endpos_.capacity()) * 4);
  }

  // The automaton's arrays (fresh numpy arrays): length, link, draft_endpos, edge_start,
  // edge_token (uint16 when `narrow_tokens`, else uint32), edge_target.
  py::dict finish(bool narrow_tokens) {
    int32_t states = sam_.num_states();
    uint64_t edges = sam_.num_edges();
    best_.resize(size_t(states), -1);
    after_.resize(size_t(states), -1);
    occurrences_.resize(size_t(states), 0);
    last_endpos_.resize(size_t(states), -1);
    // endpos(link(v)) contains endpos(v): offer each state's best, occurrences and latest
    // end to its link, longest states first (a counting sort by length), so each state
    // sees its whole subtree.
    const auto& length_of = sam_.length();
    const auto& link_of = sam_.link();
    int32_t longest = states > 0 ? *std::max_element(length_of.begin(), length_of.end()) : 0;
    std::vector<int32_t> by_length(size_t(longest) + 2, 0);
    std::vector<int32_t> order(static_cast<size_t>(states));
    for (int32_t v = 0; v < states; ++v) ++by_length[size_t(length_of[v]) + 1];
    for (size_t l = 1; l < by_length.size(); ++l) by_length[l] += by_length[l - 1];
    for (int32_t v = 0; v < states; ++v) order[size_t(by_length[size_t(length_of[v])]++)] = v;
    for (int32_t i = states - 1; i > 0; --i) {
      int32_t v = order[size_t(i)], p = link_of[v];
      if (p >= 0 && (after_[v] > after_[p] || (after_[v] == after_[p] && best_[v] < best_[p])))
        best_[p] = best_[v], after_[p] = after_[v];
      if (p >= 0) {
        occurrences_[size_t(p)] += occurrences_[size_t(v)];
        last_endpos_[size_t(p)] = std::max(last_endpos_[size_t(p)], last_endpos_[size_t(v)]);
      }
    }
    best_[0] = -1;  // the root matches nothing
    occurrences_[0] = 0;
    last_endpos_[0] = -1;
    py::array_t<int32_t> length(states), link(states), draft_endpos(states), occurrences(states), last_endpos(states);
    std::memcpy(length.mutable_data(), length_of.data(), size_t(states) * 4);
    std::memcpy(link.mutable_data(), link_of.data(), size_t(states) * 4);
    std::memcpy(draft_endpos.mutable_data(), best_.data(), size_t(states) * 4);
    std::memcpy(occurrences.mutable_data(), occurrences_.data(), size_t(states) * 4);
    std::memcpy(last_endpos.mutable_data(), last_endpos_.data(), size_t(states) * 4);
    py::array_t<uint32_t> edge_start(size_t(states) + 1);
    py::array_t<int32_t> edge_target(edges);
    py::dict out;
    if (narrow_tokens) {
      py::array_t<uint16_t> edge_token(edges);
      sam_.export_edges(edge_start.mutable_data(), edge_token.mutable_data(), edge_target.mutable_data());
      out["edge_token"] = edge_token;
    } else {
      py::array_t<uint32_t> edge_token(edges);
      sam_.export_edges(edge_start.mutable_data(), edge_token.mutable_data(), edge_target.mutable_data());
      out["edge_token"] = edge_token;
    }
    out["length"] = length;
    out["link"] = link;
    out["draft_endpos"] = draft_endpos;
    out["occurrences"] = occurrences;
    out["last_endpos"] = last_endpos;
    out["edge_start"] = edge_start;
    out["edge_target"] = edge_target;
    return out;
  }

  std::string check(const py::array& tokens) const {
    return sam_.check(array_data<int32_t>(tokens, "tokens", -1), tokens.shape(0));
  }
  int32_t num_states() const { return sam_.num_states(); }
  uint64_t num_edges() const { return sam_.num_edges(); }
  uint64_t pool_entries() const { return sam_.pool_entries(); }
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  MutableAutomaton sam_;
  std::vector<int32_t> best_;   // per state: its draft occurrence so far (-1: none yet)
  std::vector<int32_t> after_;  // per state: tokens after best_ in its document
  std::vector<int32_t> occurrences_, last_endpos_;  // per state: |endpos|, max(endpos) (own, then subtree)
  size_t peak_bytes_ = 0;
};

// ---------------------------------------------------------------------------------------
// Read-only matching and drafting over a datastore's CSR arrays (never copied).
template <typename Tok>
class StaticView : public OccurrenceIndex {
 public:
  explicit StaticView(const py::dict& arrays) {
    for (auto item : arrays) keep_.append(item.second);  // holds the memory maps while this view lives
    py::array length = arrays["length"];
    states_ = length.shape(0);
    length_ = array_data<int32_t>(length, "length", -1);
    link_ = array_data<int32_t>(arrays["link"], "link", states_);
    draft_endpos_ = array_data<int32_t>(arrays["draft_endpos"], "draft_endpos", states_);
    occurrences_ = array_data<int32_t>(arrays["occurrences"], "occurrences", states_);
    last_endpos_ = array_data<int32_t>(arrays["last_endpos"], "last_endpos", states_);
    edge_start_ = array_data<uint32_t>(arrays["edge_start"], "edge_start", states_ + 1);
    py::array edge_target = arrays["edge_target"];
    edges_ = edge_target.shape(0);
    edge_target_ = array_data<int32_t>(edge_target, "edge_target", -1);
    edge_token_ = array_data<Tok>(arrays["edge_token"], "edge_token", edges_);
    py::array tokens = arrays["tokens"];
    num_tokens_ = tokens.shape(0);
    tokens_ = array_data<Tok>(tokens, "tokens", -1);
    py::array doc_starts = arrays["doc_starts"];
    num_docs_ = doc_starts.shape(0) - 1;
    doc_starts_ = array_data<int64_t>(doc_starts, "doc_starts", -1);
    if (states_ < 1 || num_docs_ < 0) throw py::value_error("an automaton needs a root state and doc_starts[0]");
    // Dense root table: every failed match ends at the root, so its lookup is one load.
    uint32_t root_end = std::min<uint64_t>(edge_start_[1], uint64_t(edges_));
    for (uint32_t e = edge_start_[0]; e < root_end && int64_t(edge_token_[e]) < kDenseRoot; ++e) {
      if (size_t(edge_token_[e]) >= root_.size()) root_.resize(size_t(edge_token_[e]) + 1, -1);
      root_[edge_token_[e]] = edge_target_[e];
    }
  }

  // Loading checks the file's checksums, not its structure (a pass over every array would
  // double the load time); instead every read below is bounds-checked, so a damaged file
  // that passes its checksums yields wrong drafts (which verification rejects) but never
  // reads out of bounds or loops: a state's edges lie inside edge_*, targets and links
  // are valid states, a link must be shorter (so link walks end), positions lie in tokens.
  int32_t next(int32_t state, int64_t token) const {
    if (state == kRoot && token < kDenseRoot)
      return (token >= 0 && uint64_t(token) < root_.size()) ? root_[size_t(token)] : -1;
    if (token < 0 || uint64_t(token) > uint64_t(std::numeric_limits<Tok>::max())) return -1;
    uint64_t first = edge_start_[state], last = std::min<uint64_t>(edge_start_[state + 1], uint64_t(edges_));
    if (first > last) return -1;
    const Tok* begin = edge_token_ + first;
    const Tok* end = edge_token_ + last;
    Tok key = Tok(token);
    const Tok* at;
    if (end - begin <= int64_t(kLinearScan)) {
      for (at = begin; at != end && *at < key; ++at) {
      }
    } else {
      at = std::lower_bound(begin, end, key);
    }
    if (at == end || *at != key) return -1;
    int32_t target = edge_target_[at - edge_token_];
    return (target > kRoot && target < states_) ? target : -1;
  }

  Cursor step(Cursor cursor, int64_t token) const {
    if (cursor.first < 0 || cursor.first >= states_) throw py::value_error("cursor state out of range");
    return cursor_step(*this, cursor, token);
  }
  int32_t link_of(int32_t state) const override {
    int32_t link = link_[state];
    bool valid = link >= 0 && link < states_ && length_[link] >= 0 && length_[link] < length_[state];
    return valid ? link : -1;
  }
  int32_t length_of(int32_t state) const override { return length_[state]; }

  // OccurrenceIndex, bounds-checked like next(): a damaged file gives wrong trees, no bad reads.
  void children(int32_t state, std::vector<ChildInfo>& out) const override {
    uint64_t first = edge_start_[state], last = std::min<uint64_t>(edge_start_[state + 1], uint64_t(edges_));
    for (uint64_t e = first; e < last; ++e) {
      int32_t target = edge_target_[e];
      if (target <= kRoot || target >= states_) continue;
      out.push_back(ChildInfo{int32_t(edge_token_[e]), target, occurrences_[target], last_endpos_[target]});
    }
  }
  bool has_children(int32_t state) const override {
    return edge_start_[state] < std::min<uint64_t>(edge_start_[state + 1], uint64_t(edges_));
  }
  int32_t occurrences_of(int32_t state) const override { return occurrences_[state]; }
  int32_t num_states() const override { return int32_t(states_); }

  Cursor advance(Cursor cursor, const std::vector<int64_t>& tokens) const {
    if (cursor.first < 0 || cursor.first >= states_) throw py::value_error("cursor state out of range");
    for (int64_t token : tokens) cursor = cursor_step(*this, cursor, token);
    return cursor;
  }

  // One past the end of the document holding `position` (O(log D)), at most num_tokens.
  int64_t document_end(int64_t position) const {
    const int64_t* at = std::upper_bound(doc_starts_, doc_starts_ + num_docs_ + 1, position);
    return at == doc_starts_ + num_docs_ + 1 ? num_tokens_ : std::min(*at, num_tokens_);
  }

  // Tokens after the draft occurrence of `state` in its document (-1: no valid occurrence).
  int64_t available(int32_t state) const {
    int64_t end = draft_endpos_[state];
    return (end < 0 || end >= num_tokens_) ? -1 : document_end(end) - 1 - end;
  }

  py::list draft(int32_t state, int32_t wanted) const {
    py::list out;
    if (state <= kRoot || state >= states_ || wanted < 1) return out;
    state = draft_state(
        state, wanted, [&](int32_t s) { return available(s); }, [&](int32_t s) { return link_of(s); });
    int64_t begin = int64_t(draft_endpos_[state]) + 1;
    int64_t end = begin + std::min<int64_t>(available(state), wanted);
    for (int64_t at = begin; at < end; ++at) out.append(int64_t(tokens_[at]));
    return out;
  }

  // The structural invariants the bounds checks above guard against (O(S + E)).
  std::string validate() const {
    std::ostringstream out;
    if (states_ < 1 || length_[0] != 0 || link_[0] != -1) return "the root state is malformed";
    if (num_docs_ < 0 || doc_starts_[0] != 0 || doc_starts_[num_docs_] != num_tokens_)
      return "doc_starts does not cover the tokens";
    for (int64_t d = 0; d < num_docs_; ++d)
      if (doc_starts_[d] > doc_starts_[d + 1]) return (out << "doc_starts decreases at document " << d, out.str());
    if (edge_start_[0] != 0 || uint64_t(edge_start_[states_]) != uint64_t(edges_)) return "edge_start does not cover the edges";
    for (int64_t s = 0; s < states_; ++s) {
      if (edge_start_[s] > edge_start_[s + 1]) return (out << "edge_start decreases at state " << s, out.str());
      if (s == 0) continue;
      int32_t link = link_[s];
      if (link < 0 || link >= states_ || length_[link] >= length_[s])
        return (out << "state " << s << ": bad suffix link " << link, out.str());
      if (draft_endpos_[s] < 0 || draft_endpos_[s] >= num_tokens_)
        return (out << "state " << s << ": draft_endpos " << draft_endpos_[s] << " out of range", out.str());
      if (occurrences_[s] < 1 || last_endpos_[s] < 0 || last_endpos_[s] >= num_tokens_)
        return (out << "state " << s << ": occurrences " << occurrences_[s] << ", last_endpos " << last_endpos_[s],
                out.str());
    }
    for (int64_t e = 0; e < edges_; ++e)
      if (edge_target_[e] <= 0 || edge_target_[e] >= states_)
        return (out << "edge " << e << ": target " << edge_target_[e] << " out of range", out.str());
    return "";
  }

  // The automaton's semantics, not only its bounds (O(sum of lengths)): for tests.
  std::string check() const {
    std::string problem = validate();
    if (!problem.empty()) return problem;
    std::ostringstream out;
    for (int32_t s = 0; s < states_; ++s) {
      for (uint32_t e = edge_start_[s]; e + 1 < edge_start_[s + 1]; ++e)
        if (edge_token_[e] >= edge_token_[e + 1]) return (out << "state " << s << ": edges not sorted", out.str());
      for (uint32_t e = edge_start_[s]; e < edge_start_[s + 1]; ++e)
        if (length_[edge_target_[e]] < length_[s] + 1) return (out << "state " << s << ": short edge", out.str());
      if (s == 0) continue;
      int64_t end = draft_endpos_[s], start = end - length_[s] + 1;
      if (start < 0 || document_end(start) != document_end(end))
        return (out << "state " << s << ": its longest string crosses a document boundary", out.str());
      int32_t walk = kRoot;
      for (int64_t at = start; at <= end && walk >= 0; ++at) walk = next(walk, tokens_[at]);
      if (walk != s) return (out << "state " << s << ": its longest string leads to state " << walk, out.str());
    }
    // Occurrences and latest ends, recounted: each position adds one to the state of its
    // document prefix; totals flow to suffix links, longest states first.
    std::vector<int32_t> occurrences(size_t(states_), 0), last(size_t(states_), -1);
    for (int64_t d = 0; d < num_docs_; ++d) {
      int32_t state = kRoot;
      for (int64_t at = doc_starts_[d]; at < doc_starts_[d + 1]; ++at) {
        state = next(state, tokens_[at]);
        if (state < 0) return (out << "document " << d << ": its prefix ending at " << at << " is missing", out.str());
        ++occurrences[size_t(state)];
        last[size_t(state)] = int32_t(at);
      }
    }
    std::vector<int32_t> order(static_cast<size_t>(states_));
    for (int32_t v = 0; v < states_; ++v) order[size_t(v)] = v;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return length_[a] > length_[b]; });
    for (int32_t v : order) {
      if (v == kRoot) continue;
      if (occurrences[size_t(v)] != occurrences_[v] || last[size_t(v)] != last_endpos_[v])
        return (out << "state " << v << ": stores " << occurrences_[v] << " occurrences (last at " << last_endpos_[v]
                    << "), the corpus has " << occurrences[size_t(v)] << " (last at " << last[size_t(v)] << ")",
                out.str());
      occurrences[size_t(link_[v])] += occurrences[size_t(v)];
      last[size_t(link_[v])] = std::max(last[size_t(link_[v])], last[size_t(v)]);
    }
    return "";
  }

  int64_t size_states() const { return states_; }
  int64_t num_edges() const { return edges_; }
  int64_t num_tokens() const { return num_tokens_; }
  int32_t state_occurrences(int32_t s) const { return occurrences_[checked(s)]; }
  int32_t state_last_endpos(int32_t s) const { return last_endpos_[checked(s)]; }
  int32_t state_length(int32_t s) const { return length_[checked(s)]; }
  int32_t state_link(int32_t s) const { return link_[checked(s)]; }
  int32_t state_draft_endpos(int32_t s) const { return draft_endpos_[checked(s)]; }

 private:
  int32_t checked(int32_t s) const {
    if (s < 0 || s >= states_) throw py::index_error("state " + std::to_string(s) + " out of range");
    return s;
  }

  py::list keep_;
  int64_t states_ = 0, edges_ = 0, num_tokens_ = 0, num_docs_ = 0;
  const int32_t *length_, *link_, *draft_endpos_, *occurrences_, *last_endpos_, *edge_target_;
  const uint32_t* edge_start_;
  const Tok *edge_token_, *tokens_;
  const int64_t* doc_starts_;
  std::vector<int32_t> root_;
};

// ---------------------------------------------------------------------------------------
// The occurrence tree builder (reference: occurrence_tree in specdec/reference/suffix_automaton.py).
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

constexpr int kMaxSources = 4;

struct TreeSource {
  const OccurrenceIndex* index;
  int32_t state, length, bias, rank;
};

// The budget planner's feature of a node (specdec.drafters.sam.node_feature, documented there):
// match length class x the node's share of its parent's occurrences x its own support.
inline int32_t node_feature(int32_t match_length, int32_t occurrences, int32_t parent_occurrences) {
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

struct OccurrenceTree {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents, occurrences, sources;  // per node; sources: bit r set when rank r's source has it
  int32_t match_length = 0;       // of the kept sources, unbiased (the largest), 0 when nothing is drafted
  int32_t root_occurrences = 0;
};

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
// DynamicSam, SharedSam, StaticView16 or StaticView32. Returns (tokens, parents,
// occurrences, sources, match_length, features), features by node_feature (root: 0).
py::tuple occurrence_tree(const py::list& sources, int64_t pending, int32_t max_nodes, int32_t max_depth,
                          int32_t max_children, double min_share, double match_factor, double match_offset) {
  if (int(py::len(sources)) > kMaxSources)
    throw py::value_error("an occurrence tree takes at most " + std::to_string(kMaxSources) + " sources");
  if (max_children < 1) throw py::value_error("max_children must be at least 1");
  if (!(min_share >= 0.0 && min_share <= 1.0)) throw py::value_error("min_share must be in [0, 1]");
  if (!(match_factor >= 0.0) || !(match_offset >= 0.0) || !std::isfinite(match_factor) || !std::isfinite(match_offset))
    throw py::value_error("match_factor and match_offset must be finite and >= 0");
  std::vector<TreeSource> parsed;
  for (const auto& item : sources) {
    auto entry = item.cast<py::tuple>();
    if (py::len(entry) != 5) throw py::value_error("a source is (automaton, state, length, bias, rank)");
    py::handle automaton = entry[0];
    const OccurrenceIndex* index = nullptr;
    if (py::isinstance<DynamicSam>(automaton)) index = &automaton.cast<const DynamicSam&>().index();
    else if (py::isinstance<SharedSam>(automaton)) index = &automaton.cast<const SharedSam&>().index();
    else if (py::isinstance<StaticView<uint16_t>>(automaton)) index = &automaton.cast<const StaticView<uint16_t>&>();
    else if (py::isinstance<StaticView<uint32_t>>(automaton)) index = &automaton.cast<const StaticView<uint32_t>&>();
    else throw py::type_error("a source's automaton must be a DynamicSam, SharedSam or StaticView");
    int32_t rank = entry[4].cast<int32_t>();
    if (rank < 0 || rank > 30) throw py::value_error("a source's rank must be in 0..30");
    parsed.push_back(TreeSource{index, entry[1].cast<int32_t>(), entry[2].cast<int32_t>(), entry[3].cast<int32_t>(), rank});
  }
  OccurrenceTree tree = build_occurrence_tree(std::move(parsed), pending, max_nodes, max_depth, max_children,
                                              min_share, match_factor, match_offset);
  std::vector<int32_t> features(tree.tokens.size(), 0);
  for (size_t i = 1; i < tree.tokens.size(); ++i)
    features[i] = node_feature(tree.match_length, tree.occurrences[i], tree.occurrences[size_t(tree.parents[i])]);
  return py::make_tuple(py::cast(tree.tokens), py::cast(tree.parents), py::cast(tree.occurrences),
                        py::cast(tree.sources), tree.match_length, py::cast(features));
}

template <typename Tok>
void bind_view(py::module_& m, const char* name) {
  py::class_<StaticView<Tok>>(m, name)
      .def(py::init<py::dict>())
      .def("step", &StaticView<Tok>::step)
      .def("advance", &StaticView<Tok>::advance)
      .def("draft", &StaticView<Tok>::draft)
      .def("document_end", &StaticView<Tok>::document_end)
      .def("check", &StaticView<Tok>::check)
      .def("state_length", &StaticView<Tok>::state_length)
      .def("state_link", &StaticView<Tok>::state_link)
      .def("state_draft_endpos", &StaticView<Tok>::state_draft_endpos)
      .def("state_occurrences", &StaticView<Tok>::state_occurrences)
      .def("state_last_endpos", &StaticView<Tok>::state_last_endpos)
      .def_property_readonly("num_states", &StaticView<Tok>::size_states)
      .def_property_readonly("num_edges", &StaticView<Tok>::num_edges)
      .def_property_readonly("num_tokens", &StaticView<Tok>::num_tokens);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdec suffix automata: static (CSR, memory-mapped) and dynamic (per sequence)";
  py::class_<DynamicSam>(m, "DynamicSam")
      .def(py::init<>())
      .def("commit", &DynamicSam::commit)
      .def("peek", &DynamicSam::peek)
      .def("draft", &DynamicSam::draft)
      .def("check", &DynamicSam::check)
      .def("state_length", &DynamicSam::state_length)
      .def("state_link", &DynamicSam::state_link)
      .def("state_min_endpos", &DynamicSam::state_min_endpos)
      .def("state_occurrences", &DynamicSam::state_occurrences)
      .def("state_last_endpos", &DynamicSam::state_last_endpos)
      .def("tail", &DynamicSam::tail)
      .def_property_readonly("memory_bytes", &DynamicSam::memory_bytes)
      .def_property_readonly("cursor", &DynamicSam::cursor)
      .def_property_readonly("size", &DynamicSam::size)
      .def_property_readonly("num_states", &DynamicSam::num_states)
      .def_property_readonly("num_edges", &DynamicSam::num_edges);
  py::class_<SharedSam>(m, "SharedSam")
      .def(py::init<>())
      .def("add_document", &SharedSam::add_document)
      .def("documents", &SharedSam::documents)
      .def("step", &SharedSam::step)
      .def("advance", &SharedSam::advance)
      .def("check", &SharedSam::check)
      .def("state_length", &SharedSam::state_length)
      .def("state_link", &SharedSam::state_link)
      .def("state_occurrences", &SharedSam::state_occurrences)
      .def("state_last_endpos", &SharedSam::state_last_endpos)
      .def_property_readonly("version", &SharedSam::version)
      .def_property_readonly("size", &SharedSam::size)
      .def_property_readonly("num_documents", &SharedSam::num_documents)
      .def_property_readonly("num_states", &SharedSam::num_states)
      .def_property_readonly("num_edges", &SharedSam::num_edges)
      .def_property_readonly("memory_bytes", &SharedSam::memory_bytes);
  py::class_<StaticBuilder>(m, "StaticBuilder")
      .def(py::init<int64_t>())
      .def("add_documents", &StaticBuilder::add_documents)
      .def("finish", &StaticBuilder::finish)
      .def("check", &StaticBuilder::check)
      .def_property_readonly("num_states", &StaticBuilder::num_states)
      .def_property_readonly("num_edges", &StaticBuilder::num_edges)
      .def_property_readonly("pool_entries", &StaticBuilder::pool_entries)
      .def_property_readonly("peak_bytes", &StaticBuilder::peak_bytes);
  bind_view<uint16_t>(m, "StaticView16");
  bind_view<uint32_t>(m, "StaticView32");
  m.def("occurrence_tree", &occurrence_tree, py::arg("sources"), py::arg("pending"), py::arg("max_nodes"),
        py::arg("max_depth"), py::arg("max_children"), py::arg("min_share") = 0.0, py::arg("match_factor") = 0.0,
        py::arg("match_offset") = 0.0);
}
