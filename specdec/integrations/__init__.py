"""specdec's drafters inside other engines.

- :mod:`specdec.integrations.vllm`: a proposer for vLLM's ``custom_class`` speculative
  method and the helper that builds its engine arguments (``docs/serving.md``);
- :mod:`specdec.integrations.vllm_replay`: vLLM's side of that interface, replayed without vLLM.

Their command-line drivers are :mod:`specdec.commands.vllm_flags` and :mod:`specdec.commands.vllm_check`.

Nothing here imports an engine: each module imports cleanly where the engine is absent,
and the engine imports it.
"""
