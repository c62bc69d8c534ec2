// The Python module of specdec's suffix automata (specdec.datastores.sam.native()): the
// classes DynamicSam, SharedSam, StaticBuilder, StaticView16 and StaticView32, and the
// function occurrence_tree. Only argument conversion lives here; the work is done in
// sam_automaton.cpp, sam_static_view.cpp and sam_occurrence_tree.cpp (structures: sam.h).

#include <cmath>
#include <string>

#include "sam.h"

namespace specdec {
namespace sam {
namespace {

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


// Registers every class and function of the module (PYBIND11_MODULE below).
void bind(py::module_& m) {
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

}  // namespace
}  // namespace sam
}  // namespace specdec

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { specdec::sam::bind(m); }
