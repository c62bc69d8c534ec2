// REST retrieval over a token suffix array: the compiled core of specdec.datastores.rest.
//
// He et al., "REST: Retrieval-Based Speculative Decoding" (NAACL 2024). The readable
// oracle is specdec/reference/rest.py; docs/algorithms/rest.md walks through it. This file
// does the same work on the memory-mapped arrays of a `rest` datastore:
//
//   tokens[N]      unsigned ints (uint8/16/32/64, the narrowest holding the separator):
//                  every document followed by one separator token, whose value (the
//                  vocabulary size) is larger than every real token id;
//   suffixes[N]    int32 or int64: the suffix array of `tokens` (start positions of all
//                  suffixes in lexicographic order; a suffix that runs out sorts first).
//
// A *match* of a query q (s tokens) is an occurrence tokens[p : p + s] == q followed by at
// least one token of the same document (tokens[p + s] != separator). Queries never hold a
// separator, so a match never spans two documents, and the matches of q occupy one
// contiguous range of the suffix array, ordered by their continuations; the matches
// followed directly by a separator sort last in it (the separator is the largest value)
// and are cut off by one more binary search.
//
// Functions exported to Python (numpy arrays in, no copies; the GIL is released while
// searching, so several sequences may search one shared index from several threads):
//
//   retrieve(tokens, suffixes, separator, query, min_query, max_matches, max_depth, num_draft)
//       -> (match_length, lo, hi, sampled, draft_tokens[K], draft_parents[K], draft_counts[K])
//   match_range(tokens, suffixes, separator, query) -> (lo, hi)
//   check(tokens, suffixes) -> "" or the first violated invariant
//
// Costs (N corpus tokens, Q = len(query), m = sampled matches, D = max_depth):
//   search:  O(log Q) range searches by bisection on the query length (see longest_match),
//            each O(Q log N) token comparisons: tens of microseconds on a 10M-token store;
//   trie:    O(m * D) to read the continuations and count every prefix, O(T log K) to rank
//            the T <= m * D trie nodes; memory O(m * D).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// A read-only view of a datastore's two arrays.
template <typename Token, typename Index>
struct Corpus {
  const Token* tokens;    // [n]
  const Index* suffixes;  // [n]
  int64_t n;
  uint64_t separator;
};

// Compare the suffix starting at `start` with query[0:len]: negative if the suffix sorts
// before the query, 0 if the query is a prefix of it, positive if it sorts after.
template <typename Token, typename Index>
int compare_with_query(const Corpus<Token, Index>& corpus, int64_t start, const uint64_t* query, int64_t len) {
  for (int64_t i = 0; i < len; ++i) {
    if (start + i >= corpus.n) return -1;  // the suffix ran out first: shorter sorts first
    const uint64_t token = corpus.tokens[start + i];
    if (token != query[i]) return token < query[i] ? -1 : 1;
  }
  return 0;
}

// First index in [lo, hi) of the suffix array where `predicate` turns false (it must be
// true on a prefix of the range and false after it).
template <typename Predicate>
int64_t partition_point(int64_t lo, int64_t hi, Predicate predicate) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (predicate(mid)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The suffix-array range [lo, hi) of the matches of query[0:len] that have a continuation.
template <typename Token, typename Index>
std::pair<int64_t, int64_t> match_range(const Corpus<Token, Index>& corpus, const uint64_t* query, int64_t len) {
  const auto at = [&](int64_t i) { return static_cast<int64_t>(corpus.suffixes[i]); };
  const int64_t lo = partition_point(0, corpus.n, [&](int64_t i) {
    return compare_with_query(corpus, at(i), query, len) < 0;
  });
  const int64_t end = partition_point(lo, corpus.n, [&](int64_t i) {
    return compare_with_query(corpus, at(i), query, len) == 0;
  });
  // Inside [lo, end) suffixes are ordered by the token after the match; those followed by
  // the separator (or by the end of the text) come last.
  const int64_t hi = partition_point(lo, end, [&](int64_t i) {
    const int64_t next = at(i) + len;
    return next < corpus.n && static_cast<uint64_t>(corpus.tokens[next]) != corpus.separator;
  });
  return {lo, hi};
}

struct Match {
  int64_t length = 0;  // s, the number of query tokens matched (0: none)
  int64_t lo = 0;
  int64_t hi = 0;
};

// The longest s in [min_query, len(query)] whose last-s-token query has matches.
//
// The spec tries s from the longest down and stops at the first with matches. Having
// matches is monotone in s: an occurrence of the last s + 1 tokens (followed by a token of
// its document) contains an occurrence of the last s tokens with the same continuation. So
// the first s from the top with matches is the largest such s, found here by bisection in
// O(log Q) range searches instead of up to Q of them.
template <typename Token, typename Index>
Match longest_match(const Corpus<Token, Index>& corpus, const std::vector<uint64_t>& query, int64_t min_query) {
  const int64_t q_len = static_cast<int64_t>(query.size());
  // Only the trailing tokens below the separator can match (a larger id is not in the corpus).
  int64_t usable = 0;
  while (usable < q_len && query[q_len - 1 - usable] < corpus.separator) ++usable;
  Match best;
  if (usable < min_query || min_query < 1) return best;
  const auto probe = [&](int64_t s) {
    const auto range = match_range(corpus, query.data() + (q_len - s), s);
    return Match{s, range.first, range.second};
  };
  Match shortest = probe(min_query);
  if (shortest.hi <= shortest.lo) return best;
  best = shortest;
  int64_t low = min_query, high = usable;  // invariant: low has matches; the answer is in [low, high]
  while (low < high) {
    const int64_t mid = low + (high - low + 1) / 2;
    const Match candidate = probe(mid);
    if (candidate.hi > candidate.lo) {
      low = mid;
      best = candidate;
    } else {
      high = mid - 1;
    }
  }
  return best;
}

// One trie node: a distinct continuation prefix of the sampled matches.
struct Node {
  uint64_t token;   // its last token
  int32_t parent;   // node index of the prefix one shorter, -1 for depth 1
  int32_t depth;    // prefix length, 1..max_depth
  int64_t count;    // sampled matches whose continuation starts with this prefix
  int64_t first;    // first sampled row holding it: rank in lexicographic order at its depth
};

struct Draft {
  Match match;
  int64_t sampled = 0;
  std::vector<int64_t> tokens, parents, counts;
};

// Sample the matches, count every continuation prefix in a trie, and keep the best num_draft.
//
// Sampling: with n matches and m = min(n, max_matches), row j (0 <= j < m) is the match at
// suffix-array index lo + floor(j * n / m): evenly spread over the range, which is sorted by
// continuation, so the sample is stratified and its prefix counts are proportional to the
// true ones within one match each. Rows come out in lexicographic order, so the rows sharing
// a prefix are consecutive: a trie node is born where a row first differs from the previous
// one at that depth, and later rows that agree with it add one to its count.
//
// Ranking: count descending, then depth ascending, then lexicographic order of the prefix.
// A parent counts at least as much as its child and is shallower, so it always ranks first:
// every leading part of the ranking is prefix-closed and lists parents before children, as
// DraftTree requires, and it is the most frequent prefix-closed set of its size.
template <typename Token, typename Index>
Draft build_draft(const Corpus<Token, Index>& corpus, const Match& match, int64_t max_matches, int64_t max_depth,
                  int64_t num_draft) {
  Draft draft;
  draft.match = match;
  const int64_t n = match.hi - match.lo;
  if (match.length == 0 || n <= 0) return draft;
  const int64_t m = std::min(n, max_matches);
  draft.sampled = m;
  std::vector<Node> nodes;
  nodes.reserve(static_cast<size_t>(std::min<int64_t>(m * max_depth, 1 << 20)));
  // The sampled rows' continuations start at random places in the corpus: one cache miss
  // each (and one per suffix-array entry when the range is much wider than the sample).
  // Gathering the starts first and prefetching a few rows ahead overlaps those misses.
  constexpr int64_t kAhead = 16;
  std::vector<int64_t> starts(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) {
    // 128-bit product: j * n overflows int64 for huge ranges and sample sizes.
    const int64_t index = match.lo + static_cast<int64_t>(static_cast<__int128>(j) * n / m);
    if (j + kAhead < m) {
      __builtin_prefetch(corpus.suffixes + match.lo + static_cast<int64_t>(static_cast<__int128>(j + kAhead) * n / m));
    }
    starts[j] = static_cast<int64_t>(corpus.suffixes[index]) + match.length;
  }
  std::vector<uint64_t> row(max_depth), previous(max_depth);
  std::vector<int32_t> path(max_depth);  // path[d]: node of the previous row's prefix of length d + 1
  int64_t previous_len = 0;
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m && starts[j + kAhead] < corpus.n) __builtin_prefetch(corpus.tokens + starts[j + kAhead]);
    const int64_t start = starts[j];
    int64_t len = 0;
    while (len < max_depth && start + len < corpus.n) {
      const uint64_t token = corpus.tokens[start + len];
      if (token == corpus.separator) break;  // a continuation never crosses its document's end
      row[len++] = token;
    }
    int64_t common = 0;
    const int64_t limit = std::min(len, previous_len);
    while (common < limit && row[common] == previous[common]) ++common;
    for (int64_t d = 0; d < common; ++d) ++nodes[path[d]].count;
    for (int64_t d = common; d < len; ++d) {
      const int32_t parent = d == 0 ? -1 : path[d - 1];
      path[d] = static_cast<int32_t>(nodes.size());
      nodes.push_back(Node{row[d], parent, static_cast<int32_t>(d + 1), 1, j});
    }
    std::swap(row, previous);
    previous_len = len;
  }

  const int64_t keep = std::min<int64_t>(num_draft, static_cast<int64_t>(nodes.size()));
  std::vector<int32_t> order(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    const Node& x = nodes[a];
    const Node& y = nodes[b];
    if (x.count != y.count) return x.count > y.count;
    if (x.depth != y.depth) return x.depth < y.depth;
    return x.first < y.first;
  });
  std::vector<int32_t> tree_index(nodes.size(), -1);  // node -> its DraftTree index (root = 0)
  draft.tokens.resize(keep);
  draft.parents.resize(keep);
  draft.counts.resize(keep);
  for (int64_t k = 0; k < keep; ++k) {
    const Node& node = nodes[order[k]];
    tree_index[order[k]] = static_cast<int32_t>(k + 1);
    const int32_t parent = node.parent < 0 ? 0 : tree_index[node.parent];
    if (parent < 0) throw std::logic_error("rest: a ranked node precedes its parent (ranking is not prefix-closed)");
    draft.tokens[k] = static_cast<int64_t>(node.token);
    draft.parents[k] = parent;
    draft.counts[k] = node.count;
  }
  return draft;
}

// Full check of a suffix array: a permutation of 0..n-1 listing the suffixes in order.
// O(n + sum of adjacent common-prefix lengths). Returns "" or the first violation.
template <typename Token, typename Index>
std::string check_sorted(const Corpus<Token, Index>& corpus) {
  std::vector<bool> seen(static_cast<size_t>(corpus.n), false);
  for (int64_t i = 0; i < corpus.n; ++i) {
    const int64_t start = static_cast<int64_t>(corpus.suffixes[i]);
    if (start < 0 || start >= corpus.n) {
      return "suffix_array[" + std::to_string(i) + "] = " + std::to_string(start) + " is outside the text";
    }
    if (seen[start]) return "suffix_array repeats position " + std::to_string(start);
    seen[start] = true;
  }
  for (int64_t i = 1; i < corpus.n; ++i) {
    const int64_t a = static_cast<int64_t>(corpus.suffixes[i - 1]);
    const int64_t b = static_cast<int64_t>(corpus.suffixes[i]);
    int64_t k = 0;
    while (a + k < corpus.n && b + k < corpus.n && corpus.tokens[a + k] == corpus.tokens[b + k]) ++k;
    const bool ordered = a + k >= corpus.n || (b + k < corpus.n && corpus.tokens[a + k] < corpus.tokens[b + k]);
    if (!ordered) {
      return "suffix_array is not sorted: the suffix at " + std::to_string(a) + " (rank " + std::to_string(i - 1) +
             ") sorts after the one at " + std::to_string(b);
    }
  }
  return "";
}

// -- numpy plumbing ---------------------------------------------------------------------

py::buffer_info contiguous_1d(const py::array& array, const char* name) {
  py::buffer_info info = array.request();
  if (info.ndim != 1) throw py::value_error(std::string(name) + " must be one-dimensional");
  if (info.shape[0] > 1 && info.strides[0] != info.itemsize) {
    throw py::value_error(std::string(name) + " must be contiguous");
  }
  return info;
}

// Call `body(Corpus<Token, Index>)` with the template types matching the arrays' dtypes.
template <typename Body>
auto with_corpus(const py::array& tokens, const py::array& suffixes, uint64_t separator, Body body) {
  const py::buffer_info t = contiguous_1d(tokens, "tokens");
  const py::buffer_info s = contiguous_1d(suffixes, "suffixes");
  if (t.shape[0] != s.shape[0]) throw py::value_error("tokens and suffixes differ in length");
  const char token_kind = tokens.dtype().kind();
  const char index_kind = suffixes.dtype().kind();
  if (token_kind != 'u') throw py::value_error("tokens must be an unsigned integer array");
  if (index_kind != 'i') throw py::value_error("suffixes must be a signed integer array");
  const int64_t n = t.shape[0];
  auto with_index = [&](auto token_ptr) {
    using Token = std::remove_const_t<std::remove_pointer_t<decltype(token_ptr)>>;
    switch (s.itemsize) {
      case 4:
        return body(Corpus<Token, int32_t>{token_ptr, static_cast<const int32_t*>(s.ptr), n, separator});
      case 8:
        return body(Corpus<Token, int64_t>{token_ptr, static_cast<const int64_t*>(s.ptr), n, separator});
      default:
        throw py::value_error("suffixes must be int32 or int64");
    }
  };
  switch (t.itemsize) {
    case 1: return with_index(static_cast<const uint8_t*>(t.ptr));
    case 2: return with_index(static_cast<const uint16_t*>(t.ptr));
    case 4: return with_index(static_cast<const uint32_t*>(t.ptr));
    case 8: return with_index(static_cast<const uint64_t*>(t.ptr));
    default: throw py::value_error("tokens must be uint8, uint16, uint32 or uint64");
  }
}

std::vector<uint64_t> query_tokens(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& query) {
  if (query.ndim() != 1) throw py::value_error("query must be one-dimensional");
  std::vector<uint64_t> out(static_cast<size_t>(query.shape(0)));
  const int64_t* data = query.data();
  // A negative id wraps to a huge value, above the separator: it never matches.
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint64_t>(data[i]);
  return out;
}

py::array_t<int64_t> to_numpy(const std::vector<int64_t>& values) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

py::tuple retrieve(const py::array& tokens, const py::array& suffixes, uint64_t separator,
                   const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& query, int64_t min_query,
                   int64_t max_matches, int64_t max_depth, int64_t num_draft) {
  if (min_query < 1 || max_matches < 1 || max_depth < 1 || num_draft < 0) {
    throw py::value_error("min_query, max_matches and max_depth must be >= 1, num_draft >= 0");
  }
  const std::vector<uint64_t> q = query_tokens(query);
  const Draft draft = with_corpus(tokens, suffixes, separator, [&](const auto& corpus) {
    py::gil_scoped_release release;
    const Match match = longest_match(corpus, q, min_query);
    return build_draft(corpus, match, max_matches, max_depth, num_draft);
  });
  return py::make_tuple(draft.match.length, draft.match.lo, draft.match.hi, draft.sampled, to_numpy(draft.tokens),
                        to_numpy(draft.parents), to_numpy(draft.counts));
}

py::tuple exact_range(const py::array& tokens, const py::array& suffixes, uint64_t separator,
                      const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& query) {
  const std::vector<uint64_t> q = query_tokens(query);
  for (uint64_t token : q) {
    if (token >= separator) return py::make_tuple(0, 0);
  }
  const auto range = with_corpus(tokens, suffixes, separator, [&](const auto& corpus) {
    py::gil_scoped_release release;
    return match_range(corpus, q.data(), static_cast<int64_t>(q.size()));
  });
  return py::make_tuple(range.first, range.second);
}

std::string check(const py::array& tokens, const py::array& suffixes) {
  return with_corpus(tokens, suffixes, 0, [&](const auto& corpus) {
    py::gil_scoped_release release;
    return check_sorted(corpus);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "REST retrieval over a token suffix array (specdec.datastores.rest)";
  module.def("retrieve", &retrieve, py::arg("tokens"), py::arg("suffixes"), py::arg("separator"), py::arg("query"),
             py::arg("min_query"), py::arg("max_matches"), py::arg("max_depth"), py::arg("num_draft"));
  module.def("match_range", &exact_range, py::arg("tokens"), py::arg("suffixes"), py::arg("separator"),
             py::arg("query"));
  module.def("check", &check, py::arg("tokens"), py::arg("suffixes"));
}
