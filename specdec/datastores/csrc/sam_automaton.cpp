// The growable suffix automaton and what is built on it (data structures: sam.h).
//
// MutableAutomaton: online construction, the reference's SuffixAutomaton.extend (cases 1-3
// and the generalized case), the transition pool, CSR export and the invariant checks.
// DynamicSam (one sequence and its cursor), SharedSam (the store shared across requests)
// and StaticBuilder (a corpus, exported to a datastore file's arrays) use it. Construction
// runs in amortized O(1) per token.

#include "sam.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace specdec {
namespace sam {

namespace {

inline uint32_t block_capacity(uint32_t count) {  // power of two >= count (0 for 0)
  if (count == 0) return 0;
  uint32_t capacity = 1;
  while (capacity < count) capacity <<= 1;
  return capacity;
}

inline int log2_exact(uint32_t power) { return 31 - __builtin_clz(power); }

}  // namespace

// ---------------------------------------------------------------------------------------
// MutableAutomaton

MutableAutomaton::MutableAutomaton(bool track_occurrences) : track_(track_occurrences) { new_state(0, -1, -1); }

void MutableAutomaton::reserve(size_t tokens) {
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

inline void MutableAutomaton::extend(int32_t token, int32_t position) {
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

inline void MutableAutomaton::count_occurrence(int32_t position) {
  for (int32_t state = last_; state > kRoot; state = link_[state]) {
    ++occurrences_[state];
    last_endpos_[state] = position;
  }
}

inline Cursor MutableAutomaton::step(Cursor cursor, int32_t token) const { return cursor_step(*this, cursor, token); }

inline int32_t MutableAutomaton::next(int32_t state, int32_t token) const {
  if (state == kRoot && token < kDenseRoot) return (token >= 0 && size_t(token) < root_.size()) ? root_[token] : -1;
  const Edge* edge = find(state, token);
  return edge ? edge->target : -1;
}

size_t MutableAutomaton::memory_bytes() const {
  size_t free_bytes = 0;
  for (const auto& list : free_) free_bytes += list.capacity() * sizeof(uint64_t);
  return (length_.capacity() + link_.capacity() + min_endpos_.capacity() + count_.capacity() +
          occurrences_.capacity() + last_endpos_.capacity()) * 4 +
         offset_.capacity() * 8 + pool_.capacity() * sizeof(Edge) + root_.capacity() * 4 + free_bytes;
}

template <typename Tok>
void MutableAutomaton::export_edges(uint32_t* edge_start, Tok* edge_token, int32_t* edge_target) const {
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

std::string MutableAutomaton::check_occurrences(const int32_t* tokens, const int64_t* doc_starts,
                                                int64_t num_docs) const {
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

std::string MutableAutomaton::check(const int32_t* tokens, int64_t num_tokens) const {
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

inline int32_t MutableAutomaton::new_state(int32_t length, int32_t link, int32_t min_endpos, int32_t occurrences,
                                           int32_t last_endpos) {
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

inline const Edge* MutableAutomaton::find(int32_t state, int32_t token) const {
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

inline Edge* MutableAutomaton::find(int32_t state, int32_t token) {
  return const_cast<Edge*>(static_cast<const MutableAutomaton*>(this)->find(state, token));
}

inline uint64_t MutableAutomaton::allocate(uint32_t capacity) {
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
inline bool MutableAutomaton::insert_if_absent(int32_t state, int32_t token, int32_t target) {
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
inline int32_t MutableAutomaton::split(int32_t p, int32_t token, int32_t q) {
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

// ---------------------------------------------------------------------------------------
// DynamicSam

void DynamicSam::commit(const std::vector<int64_t>& tokens) {
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

Cursor DynamicSam::peek(int64_t token) const {
  if (token < 0 || token > std::numeric_limits<int32_t>::max()) return sam_.step(cursor_, -1);
  return sam_.step(cursor_, int32_t(token));
}

py::list DynamicSam::draft(int32_t state, int32_t wanted) const {
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

std::vector<int32_t> DynamicSam::tail(int64_t n) const {
  int64_t size = int64_t(tokens_.size()), begin = std::max<int64_t>(0, size - std::max<int64_t>(n, 0));
  return std::vector<int32_t>(tokens_.begin() + begin, tokens_.end());
}

std::string DynamicSam::check() const {
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

// ---------------------------------------------------------------------------------------
// SharedSam

void SharedSam::add_document(const std::vector<int64_t>& document) {
  std::vector<int32_t> checked_tokens;
  checked_tokens.reserve(document.size());
  for (int64_t raw : document) checked_tokens.push_back(checked_token(raw));
  if (int64_t(tokens_.size()) + int64_t(checked_tokens.size()) > std::numeric_limits<int32_t>::max() - 1)
    throw py::value_error("a shared automaton holds fewer than 2^31 tokens");
  // The GIL stays held: readers (drafters in other threads) call into this automaton holding it,
  // so no read can see the states and tokens mid-append (a reallocation under a reader).
  sam_.start_document();
  for (int32_t token : checked_tokens) {
    sam_.extend(token, int32_t(tokens_.size()));
    tokens_.push_back(token);
  }
  doc_starts_.push_back(int64_t(tokens_.size()));
  ++version_;
}

Cursor SharedSam::step(Cursor cursor, int64_t token) const {
  check_cursor(cursor);
  if (token < 0 || token > std::numeric_limits<int32_t>::max()) return {kRoot, 0};
  return sam_.step(cursor, int32_t(token));
}

Cursor SharedSam::advance(Cursor cursor, const std::vector<int64_t>& tokens) const {
  check_cursor(cursor);
  for (int64_t token : tokens)
    cursor = (token < 0 || token > std::numeric_limits<int32_t>::max()) ? Cursor{kRoot, 0}
                                                                        : sam_.step(cursor, int32_t(token));
  return cursor;
}

std::vector<std::vector<int32_t>> SharedSam::documents() const {
  std::vector<std::vector<int32_t>> out;
  for (size_t d = 0; d + 1 < doc_starts_.size(); ++d)
    out.emplace_back(tokens_.begin() + doc_starts_[d], tokens_.begin() + doc_starts_[d + 1]);
  return out;
}

std::string SharedSam::check() const {
  std::string problem = sam_.check(tokens_.data(), int64_t(tokens_.size()));
  if (!problem.empty()) return problem;
  return sam_.check_occurrences(tokens_.data(), doc_starts_.data(), num_documents());
}

void SharedSam::check_cursor(Cursor cursor) const {
  if (cursor.first < 0 || cursor.first >= sam_.num_states()) throw py::value_error("cursor state out of range");
}

// ---------------------------------------------------------------------------------------
// StaticBuilder

StaticBuilder::StaticBuilder(int64_t expected_tokens) { sam_.reserve(size_t(std::max<int64_t>(expected_tokens, 0))); }

void StaticBuilder::add_documents(const py::array& tokens, const py::array& doc_starts, int64_t first, int64_t last) {
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

py::dict StaticBuilder::finish(bool narrow_tokens) {
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

std::string StaticBuilder::check(const py::array& tokens) const {
  return sam_.check(array_data<int32_t>(tokens, "tokens", -1), tokens.shape(0));
}

}  // namespace sam
}  // namespace specdec
