"""Benchmarks users can trust: Spec-Bench against the peers, on the same run.

- :mod:`~specdec.bench.questions`: Spec-Bench's question file, categories, stratified subsets;
- :mod:`~specdec.bench.methods`: method specs (``label=name:key=value``), specdec drafters
  and Hugging Face's ``generate`` / prompt lookup, all measured by hooks on the model;
- :mod:`~specdec.bench.runner`: the interleaved, resumable run that writes ``results.json``;
- :mod:`~specdec.bench.report` and :mod:`~specdec.bench.plot`: tables, comparisons, the plot;
- :mod:`~specdec.bench.quality`: deterministic MAT/steps figures on fixed prompts, the
  regression guard the test suite checks against saved values;
- :mod:`~specdec.bench.replay`: drafters driven by a known token stream, no model (drafter
  microbenchmarks).

``specdec bench`` (:mod:`~specdec.bench.cli`) is the command line.
"""
