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
  MutableAutomaton() { new_state(0, -1, -1); }

  void reserve(size_t tokens) {
    size_t states = tokens + tokens / 2 + 1;
    length_.reserve(states);
    link_.reserve(states);
    min_endpos_.reserve(states);
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
      return;
    }
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

  // Bytes held by the growable arrays (capacity, not size): the builder's footprint.
  size_t memory_bytes() const {
    size_t free_bytes = 0;
    for (const auto& list : free_) free_bytes += list.capacity() * sizeof(uint64_t);
    return (length_.capacity() + link_.capacity() + min_endpos_.capacity() + count_.capacity()) * 4 +
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
  int32_t new_state(int32_t length, int32_t link, int32_t min_endpos) {
    length_.push_back(length);
    link_.push_back(link);
    min_endpos_.push_back(min_endpos);
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

  // Case 3: clone q at length(p) + 1 (q's edges, link and min_endpos) and send p's
  // chain of suffix links, where it led to q on `token`, to the clone.
  int32_t split(int32_t p, int32_t token, int32_t q) {
    int32_t clone = new_state(length_[p] + 1, link_[q], min_endpos_[q]);
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

  std::vector<int32_t> length_, link_, min_endpos_;
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
// The dynamic automaton of one sequence: committed tokens, their automaton, the cursor.
class DynamicSam {
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

  Cursor cursor() const { return cursor_; }
  int64_t size() const { return int64_t(tokens_.size()); }
  int32_t num_states() const { return sam_.num_states(); }
  uint64_t num_edges() const { return sam_.num_edges(); }
  int32_t state_length(int32_t state) const { return sam_.length().at(state); }
  int32_t state_link(int32_t state) const { return sam_.link().at(state); }
  int32_t state_min_endpos(int32_t state) const { return sam_.min_endpos().at(state); }

  std::string check() const {
    std::string problem = sam_.check(tokens_.data(), int64_t(tokens_.size()));
    if (!problem.empty()) return problem;
    auto [state, length] = cursor_;
    if (state < 0 || state >= sam_.num_states()) return "cursor state out of range";
    if (length > sam_.length()[state] || (state > 0 && length <= sam_.length()[sam_.link()[state]]))
      return "cursor not canonical: length " + std::to_string(length) + " in state " + std::to_string(state);
    return "";
  }

 private:
  MutableAutomaton sam_;
  std::vector<int32_t> tokens_;
  Cursor cursor_{kRoot, 0};
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
        int32_t state = sam_.last_state(), after = int32_t(starts[d + 1] - at - 1);
        if (after > after_[state]) best_[state] = int32_t(at), after_[state] = after;  // ties keep the earliest
      }
    }
    if (sam_.num_edges() >= (uint64_t(1) << 32)) throw py::value_error("more than 2^32 transitions");
    peak_bytes_ = std::max(peak_bytes_, sam_.memory_bytes() + (best_.capacity() + after_.capacity()) * 4);
  }

  // The automaton's arrays (fresh numpy arrays): length, link, draft_endpos, edge_start,
  // edge_token (uint16 when `narrow_tokens`, else uint32), edge_target.
  py::dict finish(bool narrow_tokens) {
    int32_t states = sam_.num_states();
    uint64_t edges = sam_.num_edges();
    best_.resize(size_t(states), -1);
    after_.resize(size_t(states), -1);
    // endpos(link(v)) contains endpos(v): offer each state's best to its link, longest
    // states first (a counting sort by length), so each state sees its whole subtree.
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
    }
    best_[0] = -1;  // the root matches nothing
    py::array_t<int32_t> length(states), link(states), draft_endpos(states);
    std::memcpy(length.mutable_data(), length_of.data(), size_t(states) * 4);
    std::memcpy(link.mutable_data(), link_of.data(), size_t(states) * 4);
    std::memcpy(draft_endpos.mutable_data(), best_.data(), size_t(states) * 4);
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
  size_t peak_bytes_ = 0;
};

// ---------------------------------------------------------------------------------------
// Read-only matching and drafting over a datastore's CSR arrays (never copied).
template <typename Tok>
class StaticView {
 public:
  explicit StaticView(const py::dict& arrays) {
    for (auto item : arrays) keep_.append(item.second);  // holds the memory maps while this view lives
    py::array length = arrays["length"];
    states_ = length.shape(0);
    length_ = array_data<int32_t>(length, "length", -1);
    link_ = array_data<int32_t>(arrays["link"], "link", states_);
    draft_endpos_ = array_data<int32_t>(arrays["draft_endpos"], "draft_endpos", states_);
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
  int32_t link_of(int32_t state) const {
    int32_t link = link_[state];
    bool valid = link >= 0 && link < states_ && length_[link] >= 0 && length_[link] < length_[state];
    return valid ? link : -1;
  }
  int32_t length_of(int32_t state) const { return length_[state]; }

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
    return "";
  }

  int64_t num_states() const { return states_; }
  int64_t num_edges() const { return edges_; }
  int64_t num_tokens() const { return num_tokens_; }
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
  const int32_t *length_, *link_, *draft_endpos_, *edge_target_;
  const uint32_t* edge_start_;
  const Tok *edge_token_, *tokens_;
  const int64_t* doc_starts_;
  std::vector<int32_t> root_;
};

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
      .def_property_readonly("num_states", &StaticView<Tok>::num_states)
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
      .def_property_readonly("cursor", &DynamicSam::cursor)
      .def_property_readonly("size", &DynamicSam::size)
      .def_property_readonly("num_states", &DynamicSam::num_states)
      .def_property_readonly("num_edges", &DynamicSam::num_edges);
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
}
