// Compact suffix automata for specdec: the static corpus automaton and the dynamic
// per-sequence one. specdec/reference/suffix_automaton.py is the readable oracle (the
// construction's cases 1-3, the cursor, the draft rule, the occurrence tree); the compiled
// code follows it name for name and is tested against it. This header holds the data
// structures, each field documented (what it holds, its units and index space, and why it
// is laid out so); the code lives in four files, compiled into one extension (the source
// list: SOURCES in specdec/datastores/sam.py):
//
//   sam_automaton.cpp        MutableAutomaton (online construction, cases 1-3; matching;
//                            CSR export; invariant checks) and what is built on it:
//                            DynamicSam, SharedSam, StaticBuilder
//   sam_static_view.cpp      StaticView<Tok>: matching, drafting and checks over the
//                            memory-mapped arrays of a datastore file
//   sam_occurrence_tree.cpp  build_occurrence_tree: the drafter's tree read from any
//                            automaton through OccurrenceIndex; node_feature
//   sam_bindings.cpp         the Python module: classes, argument conversion, occurrence_tree
//
// Vocabulary. A *state* is an int32 id, dense from 0 (the root, kRoot) to S-1; every
// per-state array below is indexed by it. A *position* is an int32 index into the text the
// automaton was built from (the sequence's committed tokens, the shared store's documents
// one after another, or the corpus' `tokens[N]`). A *token* is a vocabulary id, 0..2^31-1.
// endpos(v) is the set of positions where an occurrence of v's strings ends; a state's
// strings are the suffixes of its longest one down to length(link(v)) + 1.
//
// Two representations:
//
// * MutableAutomaton: built online, one token at a time. Serves the static builder (a
//   generalized automaton over many documents, exported to CSR arrays) and DynamicSam
//   (one growing document: prompt + generated text, with the matching cursor), and
//   SharedSam (the store shared across requests: documents added one at a time).
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
//     occurrences[S] int32, last_endpos[S] int32,
//     edge_start[S+1] uint32, edge_token[E] Tok, edge_target[E] int32,
//     tokens[N] Tok, doc_starts[D+1] int64,
//   with Tok = uint16 when the vocabulary fits (the common case) or uint32. State v's
//   transitions are edge_*[edge_start[v] : edge_start[v+1]], sorted by token. Measured on
//   10M tokens of code, math and prose: 1.46 states and 2.05 edges per token, so
//   1.46 * 24 B + 2.05 * 6 B + 2 B = 49 B per corpus token (the five per-state int32
//   arrays and edge_start; edge token and target; the text). Reads are bounds-checked
//   (see StaticView::next), so no file, however damaged, makes them leave the arrays or
//   loop. draft_endpos[v] is the end of the occurrence of v's strings with the most tokens
//   after it in its document (ties: the earliest). For one text that is min_endpos (the
//   reference's rule); with documents kept apart the earliest occurrence may end its
//   document, with nothing to draft, while a later one continues.
//
// Positions are int32: a corpus holds fewer than 2^31 tokens and 2^32 transitions. Both
// limits are checked where text enters (StaticBuilder::add_documents, SharedSam::add_document,
// specdec.datastores.sam.MAX_TOKENS); in exchange no per-state or per-edge field is wider
// than 4 bytes, half of what int64 would take.
//
// Every declaration here has hidden visibility: nothing is exported from the extension
// but its Python module, calls between the four files bind directly (no PLT), and the
// compiler inlines within a file as it did when all of this was one file in an anonymous
// namespace (GCC does not inline a default-visibility function defined outside its class
// in -fPIC code: another library could interpose it).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file: one set of std::vector casters for the whole module

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace specdec {
namespace sam __attribute__((visibility("hidden"))) {

namespace py = pybind11;

// =======================================================================================
// Constants and small value types

constexpr int32_t kRoot = 0;
constexpr uint32_t kLinearScan = 8;  // blocks this small are scanned, larger ones bisected
// Root transitions on tokens below this live in a dense table (4 MB at most); larger ids
// (vocabularies past a million, or tests' random 31-bit ids) use the root's sorted block.
constexpr int64_t kDenseRoot = int64_t(1) << 20;

// One transition of a MutableAutomaton: 8 bytes, no padding, so a state's block of them is
// a packed array that memcpy moves and std::lower_bound bisects by token.
struct Edge {
  int32_t token;   // the vocabulary id the transition reads (a state's block is sorted by it)
  int32_t target;  // the state it leads to (> kRoot: no transition enters the root)
};

using Cursor = std::pair<int32_t, int32_t>;  // (state, match length); (kRoot, 0) is no match

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

// =======================================================================================
// Checks at the Python boundary (both throw the Python exception they name)

// A token from Python as int32, or ValueError naming it.
inline int32_t checked_token(int64_t token) {
  if (token < 0 || token > std::numeric_limits<int32_t>::max())
    throw py::value_error("token id " + std::to_string(token) + " is outside 0..2^31-1");
  return int32_t(token);
}

// The data of a 1-D, C-contiguous numpy array of T (no copy), `expected_size` elements
// long unless it is -1; TypeError or ValueError naming `name` otherwise.
template <typename T>
const T* array_data(const py::array& array, const char* name, int64_t expected_size) {
  if (!array.dtype().is(py::dtype::of<T>()))
    throw py::type_error(std::string(name) + ": wrong dtype " + std::string(py::str(array.dtype())));
  if (!(array.flags() & py::array::c_style)) throw py::type_error(std::string(name) + " is not C-contiguous");
  if (array.ndim() != 1 || (expected_size >= 0 && array.shape(0) != expected_size))
    throw py::value_error(std::string(name) + ": shape does not match the automaton");
  return static_cast<const T*>(array.data());
}

// =======================================================================================
// The growable automaton (code: sam_automaton.cpp)
//
// Layout. Per-state fields are parallel vectors indexed by state id (a structure of
// arrays), not a vector of state structs: each loop reads only the fields it needs (the
// cursor's suffix-link walk: link_ and length_; count_occurrence: link_ and the two
// occurrence fields), so none drags the others through the cache; the occurrence fields
// exist only when tracked (the static builder does without them, 8 B per state); and
// length_/link_ leave for the file as they are (one memcpy each in StaticBuilder::finish).
// Transitions are not one std::vector per state: that would cost 24 B of header plus a
// heap allocation (16 B or more of malloc overhead) per state, ~60 B per token before the
// first edge. One pool of Edge blocks costs 12 B per state
// (offset_ + count_) and 8 B per edge with at most 2x slack. Memory per token: 24 B of
// per-state fields (32 B tracked) x 1.46 states, and 8 to 16 B x 2.05 edges.
//
// The members declared `inline` below are defined in sam_automaton.cpp, the one file that
// calls them (C++ asks an inline function to be defined only where it is used). They are
// the per-token path; `inline` keeps the inlining GCC did when they were defined in the
// class body (it gives a function declared inline a larger budget): without it extend
// calls insert_if_absent, find and next instead of inlining them, and DynamicSam.commit
// measured 8% slower (benchmarks/test_sam_bench.py, interleaved with the one-file build).
class MutableAutomaton {
 public:
  // `track_occurrences`: keep occurrences_[v] = |endpos(v)| and last_endpos_[v] = max(endpos(v))
  // online (the dynamic automaton and the shared store draft occurrence trees from them; the
  // static builder computes them in one pass at the end instead, which is cheaper).
  explicit MutableAutomaton(bool track_occurrences = false);

  void reserve(size_t tokens);

  void start_document() { last_ = kRoot; }
  int32_t last_state() const { return last_; }  // the state of the current document's whole prefix

  // Appends `token`, at corpus position `position`, to the current document; the
  // reference's SuffixAutomaton.extend (its cases 1-3 and the generalized case).
  inline void extend(int32_t token, int32_t position);

  // The new position ends an occurrence of every suffix of the document's prefix: the
  // states on last_'s suffix-link path. O(length of that path): a few states on natural
  // text, up to the text's length on a text that repeats one token (see sam.md).
  inline void count_occurrence(int32_t position);

  inline Cursor step(Cursor cursor, int32_t token) const;  // cursor_step over this automaton
  int32_t link_of(int32_t state) const { return link_[state]; }
  int32_t length_of(int32_t state) const { return length_[state]; }

  // The target of `state`'s `token` transition, -1 when it has none.
  inline int32_t next(int32_t state, int32_t token) const;

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
  size_t memory_bytes() const;

  // The transitions as CSR arrays: edge_start[S+1], edge_token[E], edge_target[E]
  // (defined in sam_automaton.cpp, its only user; Tok is uint16_t or uint32_t).
  template <typename Tok>
  void export_edges(uint32_t* edge_start, Tok* edge_token, int32_t* edge_target) const;

  // The tracked occurrences against a recount (tests): every position of every document
  // (`doc_starts[D+1]` cuts `tokens`) adds one to the state of its document prefix, and each
  // state's total flows to its suffix link, longest states first. O(N + S log S).
  std::string check_occurrences(const int32_t* tokens, const int64_t* doc_starts, int64_t num_docs) const;

  // Every structural invariant; "" when all hold, else the first failure, named.
  // With `tokens` (the text) also the semantic one: each state's longest string, read at
  // its min_endpos, leads from the root back to it (O(sum of lengths): tests only).
  std::string check(const int32_t* tokens, int64_t num_tokens) const;

 private:
  // Construction (sam_automaton.cpp).
  inline int32_t new_state(int32_t length, int32_t link, int32_t min_endpos, int32_t occurrences = 0,
                           int32_t last_endpos = -1);
  inline const Edge* find(int32_t state, int32_t token) const;
  inline Edge* find(int32_t state, int32_t token);
  inline uint64_t allocate(uint32_t capacity);
  inline bool insert_if_absent(int32_t state, int32_t token, int32_t target);
  inline int32_t split(int32_t p, int32_t token, int32_t q);  // case 3 of extend

  // Whether occurrences_ and last_endpos_ are kept (fixed at construction).
  bool track_ = false;

  // Per state [S], indexed by state id:
  //   length_[v]      the length of v's longest string, in tokens (0 for the root);
  //   link_[v]        v's suffix link, a state id with a shorter length (-1 for the root);
  //   min_endpos_[v]  the position where v's strings first occur (end of the occurrence,
  //                   inclusive; -1 for the root): the draft occurrence of the reference's
  //                   rule, read by DynamicSam::draft and by check().
  std::vector<int32_t> length_, link_, min_endpos_;
  // Per state [S] when tracked (else empty):
  //   occurrences_[v] |endpos(v)|: how many times v's strings occur (0 for the root);
  //   last_endpos_[v] max(endpos(v)): the position of their latest occurrence (-1: root).
  std::vector<int32_t> occurrences_, last_endpos_;  // when tracked: |endpos(v)|, max(endpos(v))
  // Per state [S]: where v's transitions are. offset_ is an index into pool_ (in Edge
  // entries; uint64 because the pool, slack included, may pass 2^32 entries while the
  // edges themselves stay below it); count_ is the number of edges, so the block's
  // capacity is block_capacity(count_[v]) and need not be stored.
  std::vector<uint64_t> offset_;  // block of each state's edges in pool_
  std::vector<uint32_t> count_;   // edges of each state (block capacity = block_capacity(count))
  // Every state's transitions except the root's dense ones: blocks of power-of-two
  // capacity, each sorted by token. A block that fills moves to one twice as large and
  // its old place goes on free_, for the next block of that size.
  std::vector<Edge> pool_;
  // The root's transitions on tokens below kDenseRoot, indexed by token id (-1: none). The
  // root is where every failed match ends up and has one transition per distinct token
  // (tens of thousands): one load instead of a bisection of that many. Sized to the
  // largest id seen, so at most 4 MB; larger ids go to the root's block in pool_.
  std::vector<int32_t> root_;     // root transitions, dense by token (-1: none)
  // Free blocks by size: free_[k] holds the pool offsets of released blocks of capacity
  // 2^k, reused before the pool grows.
  std::vector<uint64_t> free_[32];
  // All transitions, root's dense ones included (what export_edges writes, E).
  uint64_t num_edges_ = 0;
  // The state of the current document's whole prefix (where the next extend starts).
  int32_t last_ = kRoot;
  // What the last extend did in case 3: the state q it split and its clone (-1: no split).
  // DynamicSam reads them to keep its cursor canonical.
  int32_t split_ = -1, clone_ = -1;
};

// =======================================================================================
// Occurrence trees (specdec/reference/suffix_automaton.py, "The occurrence tree", states
// the rule; docs/algorithms/sam.md says why). For a match in state v, the strings x of v
// occur |endpos(v)| times; the trie of the continuations of all those occurrences is the
// automaton itself below v: x followed by t occurs |endpos(next(v, t))| times. So the tree
// is read from transitions and per-state counts, never from the text.

// One transition as the tree builder sees it.
struct ChildInfo {
  int32_t token;        // the transition's token
  int32_t state;        // its target state, in the index the child came from
  int32_t occurrences;  // |endpos(state)|: how often "match + path + token" occurs
  int32_t last_endpos;  // max(endpos(state)): where its latest occurrence ends (a position)
};

// What the tree builder reads from an automaton (dynamic, shared store, static file). A
// virtual interface because one tree mixes up to kMaxSources automata of three kinds; a
// call costs far less than the O(degree) work it returns.
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
  const MutableAutomaton& sam_;  // the automaton read (owned by the CountedText holding both)
};

// =======================================================================================
// What Python holds (code: sam_automaton.cpp; bound in sam_bindings.cpp)

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
  // `state` itself, or IndexError (Python) when it is not a state id.
  int32_t checked(int32_t state) const {
    if (state < 0 || state >= sam_.num_states()) throw py::index_error("state " + std::to_string(state) + " out of range");
    return state;
  }

  MutableAutomaton sam_{true};  // the automaton of tokens_, occurrences tracked
  MutableIndex index_{sam_};    // sam_ as the tree builder reads it (declared after sam_: built after it)
  // The text, int32 token ids [N]; a position is an index into it. The drafts are copied
  // out of it (the automaton stores positions, not tokens).
  std::vector<int32_t> tokens_;
};

// The dynamic automaton of one sequence: committed tokens, their automaton, the cursor.
class DynamicSam : public CountedText {
 public:
  // For each token: advance the cursor first (a match must point to an earlier
  // occurrence), extend second; a split of the cursor's state moves it to the clone,
  // which now holds its string, so the cursor stays canonical.
  void commit(const std::vector<int64_t>& tokens);

  // The cursor after `token` (the pending one), not committed: the match behind a draft.
  Cursor peek(int64_t token) const;

  // Up to `wanted` tokens after the min_endpos of `state`, with the suffix-link fallback.
  py::list draft(int32_t state, int32_t wanted) const;

  // The last `n` committed tokens (fewer when the text is shorter).
  std::vector<int32_t> tail(int64_t n) const;

  Cursor cursor() const { return cursor_; }
  size_t memory_bytes() const { return sam_.memory_bytes() + tokens_.capacity() * 4; }
  int32_t state_min_endpos(int32_t state) const { return sam_.min_endpos()[size_t(checked(state))]; }

  std::string check() const;

 private:
  // The match: the longest suffix of the committed text that also ends at an earlier
  // position (its state, its length in tokens); canonical: length(link(state)) < length
  // <= length(state), which check() verifies.
  Cursor cursor_{kRoot, 0};
};

// One generation of the store shared across requests (specdec/datastores/shared.py): an
// online generalized automaton over whole sequences (documents) added one at a time, with
// occurrences tracked. Sequences read it through their own cursors; a document added
// later may split the state a cursor is in, so readers re-match after every change
// (`version` counts them).
class SharedSam : public CountedText {
 public:
  // Appends one document (its tokens in order), holding the GIL: no reader sees it half done.
  void add_document(const std::vector<int64_t>& document);

  Cursor step(Cursor cursor, int64_t token) const;
  Cursor advance(Cursor cursor, const std::vector<int64_t>& tokens) const;

  // The stored documents, in order (tests, introspection): O(tokens).
  std::vector<std::vector<int32_t>> documents() const;

  int64_t version() const { return version_; }
  int64_t num_documents() const { return int64_t(doc_starts_.size()) - 1; }
  size_t memory_bytes() const { return sam_.memory_bytes() + tokens_.capacity() * 4 + doc_starts_.capacity() * 8; }

  std::string check() const;

 private:
  // ValueError (Python) unless the cursor's state is a state id.
  void check_cursor(Cursor cursor) const;
  // [D+1] positions: document d is tokens_[doc_starts_[d] : doc_starts_[d+1]]; starts as {0}.
  std::vector<int64_t> doc_starts_{0};
  // Documents added so far: a reader whose cursor was matched at an older version re-matches.
  int64_t version_ = 0;
};

// The static builder: a generalized automaton over documents, exported as CSR arrays.
// Occurrences are not tracked online (that walks every suffix-link path); each position
// counts once for the state of its document prefix and finish() sums them up the links.
class StaticBuilder {
 public:
  explicit StaticBuilder(int64_t expected_tokens);

  // Adds documents [first, last) of the corpus `tokens` (int32 [N]) cut by `doc_starts`
  // (int64 [D+1]); the GIL is released while it works. Each position also offers itself
  // as the draft occurrence of the state of its document prefix (that string is the
  // state's longest, so no later split moves it); finish() spreads them up the links.
  void add_documents(const py::array& tokens, const py::array& doc_starts, int64_t first, int64_t last);

  // The automaton's arrays (fresh numpy arrays): length, link, draft_endpos, edge_start,
  // edge_token (uint16 when `narrow_tokens`, else uint32), edge_target.
  py::dict finish(bool narrow_tokens);

  std::string check(const py::array& tokens) const;
  int32_t num_states() const { return sam_.num_states(); }
  uint64_t num_edges() const { return sam_.num_edges(); }
  uint64_t pool_entries() const { return sam_.pool_entries(); }
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  MutableAutomaton sam_;  // occurrences not tracked (see the class comment)
  // Per state [S], resized to sam_'s states after every extend (new states: -1, or 0 occurrences);
  // after finish() they hold the file's draft_endpos, occurrences and last_endpos.
  std::vector<int32_t> best_;   // per state: its draft occurrence so far (-1: none yet)
  std::vector<int32_t> after_;  // per state: tokens after best_ in its document
  std::vector<int32_t> occurrences_, last_endpos_;  // per state: |endpos|, max(endpos) (own, then subtree)
  // The largest memory_bytes() of the builder seen after a batch (bytes; the report's
  // builder_peak_bytes).
  size_t peak_bytes_ = 0;
};

// =======================================================================================
// The static view (code: sam_static_view.cpp, instantiated there for uint16_t and uint32_t)
//
// Read-only matching and drafting over a datastore's CSR arrays (never copied). Layout of
// the arrays (see the top of this file for sizes): CSR rather than the builder's blocks
// because a file has no slack to carry (edge_start[S+1] replaces offset and count, 4 B per
// state instead of 12; uint32 suffices since E < 2^32). Tokens and targets are separate
// arrays, not interleaved Edge pairs: the scan or bisection of a state's transitions reads
// only tokens (with Tok = uint16, 32 to a 64-byte line), then one target. Tok = uint16 for
// vocabularies up to 65536 saves 2 B per edge and per text token, ~6 B per corpus token.
template <typename Tok>
class StaticView : public OccurrenceIndex {
 public:
  explicit StaticView(const py::dict& arrays);

  // Loading checks the file's checksums, not its structure (a pass over every array would
  // double the load time); instead every read below is bounds-checked, so a damaged file
  // that passes its checksums yields wrong drafts (which verification rejects) but never
  // reads out of bounds or loops: a state's edges lie inside edge_*, targets and links
  // are valid states, a link must be shorter (so link walks end), positions lie in tokens.
  inline int32_t next(int32_t state, int64_t token) const;

  Cursor step(Cursor cursor, int64_t token) const;
  int32_t link_of(int32_t state) const override;
  int32_t length_of(int32_t state) const override { return length_[state]; }

  // OccurrenceIndex, bounds-checked like next(): a damaged file gives wrong trees, no bad reads.
  void children(int32_t state, std::vector<ChildInfo>& out) const override;
  bool has_children(int32_t state) const override;
  int32_t occurrences_of(int32_t state) const override { return occurrences_[state]; }
  int32_t num_states() const override { return int32_t(states_); }

  Cursor advance(Cursor cursor, const std::vector<int64_t>& tokens) const;

  // One past the end of the document holding `position` (O(log D)), at most num_tokens.
  int64_t document_end(int64_t position) const;

  // Tokens after the draft occurrence of `state` in its document (-1: no valid occurrence).
  // (next() and available() are inline for the reason given at MutableAutomaton, and like
  // its inline members are defined, and used, only in sam_static_view.cpp.)
  inline int64_t available(int32_t state) const;

  py::list draft(int32_t state, int32_t wanted) const;

  // The structural invariants the bounds checks above guard against (O(S + E)).
  std::string validate() const;

  // The automaton's semantics, not only its bounds (O(sum of lengths)): for tests.
  std::string check() const;

  int64_t size_states() const { return states_; }
  int64_t num_edges() const { return edges_; }
  int64_t num_tokens() const { return num_tokens_; }
  int32_t state_occurrences(int32_t s) const { return occurrences_[checked(s)]; }
  int32_t state_last_endpos(int32_t s) const { return last_endpos_[checked(s)]; }
  int32_t state_length(int32_t s) const { return length_[checked(s)]; }
  int32_t state_link(int32_t s) const { return link_[checked(s)]; }
  int32_t state_draft_endpos(int32_t s) const { return draft_endpos_[checked(s)]; }

 private:
  // `s` itself, or IndexError (Python) when it is not a state id.
  int32_t checked(int32_t s) const {
    if (s < 0 || s >= states_) throw py::index_error("state " + std::to_string(s) + " out of range");
    return s;
  }

  // References to every array of the file (numpy arrays over its memory map), so the
  // pointers below stay valid for as long as this view lives.
  py::list keep_;
  // Sizes: S states, E edges, N text tokens, D documents (int64: numpy's shape type).
  int64_t states_ = 0, edges_ = 0, num_tokens_ = 0, num_docs_ = 0;
  // Per state [S], int32 (as MutableAutomaton's fields): length_ in tokens, link_ a state
  // id (-1 for the root), draft_endpos_ a position (the draft occurrence; -1 for the root),
  // occurrences_ |endpos| and last_endpos_ max(endpos), a position (0 and -1 for the root).
  // Per edge [E]: edge_target_, a state id.
  const int32_t *length_, *link_, *draft_endpos_, *occurrences_, *last_endpos_, *edge_target_;
  // [S+1], indices into edge_token_/edge_target_: state v's edges are [edge_start_[v],
  // edge_start_[v+1]), sorted by token.
  const uint32_t* edge_start_;
  // edge_token_ [E], the token of each edge; tokens_ [N], the corpus text (documents one
  // after another), indexed by position.
  const Tok *edge_token_, *tokens_;
  // [D+1] positions: document d is tokens_[doc_starts_[d] : doc_starts_[d+1]] (int64 as
  // numpy's cumsum writes it; one entry per document, so the width costs little).
  const int64_t* doc_starts_;
  // Dense root table, built at load from the root's CSR row: root_[token] is the root's
  // transition on token (-1: none) for tokens below kDenseRoot. Every failed match ends at
  // the root, so its lookup is one load (the one copy a view makes: 4 B per token id up to
  // the largest the root reads, so a uint16 file's table is at most 256 KB).
  std::vector<int32_t> root_;
};

extern template class StaticView<uint16_t>;
extern template class StaticView<uint32_t>;

// =======================================================================================
// The occurrence tree builder (code and its rule, steps 1-4: sam_occurrence_tree.cpp)

constexpr int kMaxSources = 4;  // the most automata one tree reads (TreeSource.rank tells them apart)

// One automaton the tree reads, and the match in it.
struct TreeSource {
  const OccurrenceIndex* index;  // the automaton (not owned; outlives the build)
  int32_t state;                 // the cursor's state in it
  int32_t length;                // the match length there, in tokens
  int32_t bias;                  // subtracted from length before sources are compared (l_bias)
  int32_t rank;                  // recency rank, 0..30 (larger: more recent text); bit `rank` of a node's sources
};

// A draft tree, node 0 the root (the pending token); every per-node vector has one entry
// per node, in the order nodes were emitted, so a node's parent comes before it.
struct OccurrenceTree {
  std::vector<int64_t> tokens;     // per node: its token (root: the pending token)
  std::vector<int32_t> parents, occurrences, sources;  // per node; sources: bit r set when rank r's source has it
  // (parents: the parent's node index, -1 for the root; occurrences: the sum over kept
  // sources of |endpos| of "match + path", the root's being root_occurrences.)
  int32_t match_length = 0;       // of the kept sources, unbiased (the largest), 0 when nothing is drafted
  int32_t root_occurrences = 0;   // the kept states' |endpos| summed (0 when nothing is drafted)
};

// The budget planner's feature of a node (specdec.drafters.sam.node_feature, documented there):
// match length class x the node's share of its parent's occurrences x its own support.
int32_t node_feature(int32_t match_length, int32_t occurrences, int32_t parent_occurrences);

// The tree of `pending` (the root's token) over the sources' matches: at most `max_nodes`
// nodes (root included), `max_depth` levels below the root and `max_children` candidates
// per node; `min_share` (of the root's occurrences), `match_factor` and `match_offset`
// size it by evidence (0: off). The rule, steps 1-4, heads sam_occurrence_tree.cpp.
OccurrenceTree build_occurrence_tree(std::vector<TreeSource> sources, int64_t pending, int32_t max_nodes,
                                     int32_t max_depth, int32_t max_children, double min_share,
                                     double match_factor, double match_offset);

}  // namespace sam
}  // namespace specdec
