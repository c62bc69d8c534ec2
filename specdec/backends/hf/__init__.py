"""Engine ``"hf"``: Hugging Face's own forward on its ``DynamicCache`` (:mod:`.forward`)."""
