"""The four fixed-shape engines (``"buckets"``, ``"compiled"``, ``"graphs"``, ``"compiled-graphs"``): one
forward per tree-size bucket on a slot cache (:mod:`.forward`; batch rows: :mod:`.rows`), a bucket's
step (:mod:`.runner`), the sizes (:mod:`.sizes`), the model-wide store of compiled forwards and the check
against eager (:mod:`.shared`), device state (:mod:`.device_set`), dynamo (:mod:`.dynamo`) and the
on-disk compile cache (:mod:`.compile_cache`)."""
