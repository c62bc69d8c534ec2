"""Benchmarks users can trust: ``specdec bench``, the one door for measurements.

- :mod:`~specdec.bench.questions`: Spec-Bench's question file, categories, the one question selector;
- :mod:`~specdec.bench.methods`: method specs (``label=name:key=value``), specdec drafters and
  the table of Hugging Face peers, all measured by hooks on the model;
- :mod:`~specdec.bench.runner`: the interleaved, resumable run;
- :mod:`~specdec.bench.judge`: identical, greedy near-tie, sampling near-boundary, or different;
- :mod:`~specdec.bench.results`: the one results format (``results.json``) everything reads;
- :mod:`~specdec.bench.report` and :mod:`~specdec.bench.plot`: tables, comparisons, the plot;
- :mod:`~specdec.bench.stream_replay`: drafters driven by a known token stream, no model (drafter
  microbenchmarks, and replays of a run's recorded outputs under frozen cost tables);
- :mod:`~specdec.bench.quality`: deterministic MAT/steps figures on fixed prompts, the
  regression guard the test suite checks against saved values;
- :mod:`~specdec.bench.datastore_costs`, :mod:`~specdec.bench.curves`, :mod:`~specdec.bench.corpora`:
  datastore costs, verification cost curves, the corpora they build from.

``specdec bench`` (:mod:`specdec.commands.bench`) is the command line; docs/benchmarks.md has
the command behind every figure.
"""
