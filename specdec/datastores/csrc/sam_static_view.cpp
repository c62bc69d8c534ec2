// The static view: matching, drafting and checks over the memory-mapped CSR arrays of a
// `sam` datastore file (data structures and the bounds-checking contract: StaticView in
// sam.h). Nothing is copied but the root's transitions, into a dense table.
//
// The two instantiations, StaticView<uint16_t> (StaticView16 in Python) and
// StaticView<uint32_t> (StaticView32), are made here; other files see them through the
// `extern template` declarations in sam.h.

#include "sam.h"

#include <algorithm>
#include <sstream>

namespace specdec {
namespace sam {

template <typename Tok>
StaticView<Tok>::StaticView(const py::dict& arrays) {
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
    // A damaged file's wild target stays out of the table (next() checks every other edge's
    // target; a root lookup is not checked again, so an out-of-range one must not get in).
    int32_t target = edge_target_[e];
    root_[edge_token_[e]] = (target > kRoot && target < states_) ? target : -1;
  }
}

template <typename Tok>
inline int32_t StaticView<Tok>::next(int32_t state, int64_t token) const {
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

template <typename Tok>
Cursor StaticView<Tok>::step(Cursor cursor, int64_t token) const {
  if (cursor.first < 0 || cursor.first >= states_) throw py::value_error("cursor state out of range");
  return cursor_step(*this, cursor, token);
}

template <typename Tok>
int32_t StaticView<Tok>::link_of(int32_t state) const {
  int32_t link = link_[state];
  bool valid = link >= 0 && link < states_ && length_[link] >= 0 && length_[link] < length_[state];
  return valid ? link : -1;
}

template <typename Tok>
void StaticView<Tok>::children(int32_t state, std::vector<ChildInfo>& out) const {
  uint64_t first = edge_start_[state], last = std::min<uint64_t>(edge_start_[state + 1], uint64_t(edges_));
  for (uint64_t e = first; e < last; ++e) {
    int32_t target = edge_target_[e];
    if (target <= kRoot || target >= states_) continue;
    out.push_back(ChildInfo{int32_t(edge_token_[e]), target, occurrences_[target], last_endpos_[target]});
  }
}

template <typename Tok>
bool StaticView<Tok>::has_children(int32_t state) const {
  return edge_start_[state] < std::min<uint64_t>(edge_start_[state + 1], uint64_t(edges_));
}

template <typename Tok>
Cursor StaticView<Tok>::advance(Cursor cursor, const std::vector<int64_t>& tokens) const {
  if (cursor.first < 0 || cursor.first >= states_) throw py::value_error("cursor state out of range");
  for (int64_t token : tokens) cursor = cursor_step(*this, cursor, token);
  return cursor;
}

template <typename Tok>
int64_t StaticView<Tok>::document_end(int64_t position) const {
  const int64_t* at = std::upper_bound(doc_starts_, doc_starts_ + num_docs_ + 1, position);
  return at == doc_starts_ + num_docs_ + 1 ? num_tokens_ : std::min(*at, num_tokens_);
}

template <typename Tok>
inline int64_t StaticView<Tok>::available(int32_t state) const {
  int64_t end = draft_endpos_[state];
  return (end < 0 || end >= num_tokens_) ? -1 : document_end(end) - 1 - end;
}

template <typename Tok>
py::list StaticView<Tok>::draft(int32_t state, int32_t wanted) const {
  py::list out;
  if (state <= kRoot || state >= states_ || wanted < 1) return out;
  state = draft_state(
      state, wanted, [&](int32_t s) { return available(s); }, [&](int32_t s) { return link_of(s); });
  int64_t begin = int64_t(draft_endpos_[state]) + 1;
  int64_t end = begin + std::min<int64_t>(available(state), wanted);
  for (int64_t at = begin; at < end; ++at) out.append(int64_t(tokens_[at]));
  return out;
}

template <typename Tok>
std::string StaticView<Tok>::validate() const {
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

template <typename Tok>
std::string StaticView<Tok>::check() const {
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

template class StaticView<uint16_t>;
template class StaticView<uint32_t>;

}  // namespace sam
}  // namespace specdec
