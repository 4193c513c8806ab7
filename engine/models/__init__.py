"""Models: resolving a spec safely, loading it (Hugging Face dir, GGUF, hub), its facts and its
weights fingerprint (:mod:`engine.models.load`)."""

#: the precisions a model can be loaded in (CLI ``--dtype``, the sidebar's Precision); torch-free
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
