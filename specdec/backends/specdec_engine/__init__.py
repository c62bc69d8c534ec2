"""Engine ``"specdec"``: specdec's own forward on a slot cache (:mod:`.forward`), the decoder it runs
(:mod:`.model_runner`), the C++ CPU kernels it calls (:mod:`.cpu_kernels`, sources in ``csrc/``)."""
