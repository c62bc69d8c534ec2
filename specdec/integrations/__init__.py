"""specdec's drafters inside other engines.

- :mod:`specdec.integrations.vllm`: a proposer for vLLM's ``custom_class`` speculative
  method and the helper that builds its engine arguments (``docs/serving.md``).

Nothing here imports an engine: each module imports cleanly where the engine is absent,
and the engine imports it.
"""
