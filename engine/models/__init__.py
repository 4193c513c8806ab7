"""Models: what a spec names and its safety checks (:mod:`~engine.models.spec`), loading it -- Hugging Face
dir, GGUF, hub -- bridged or plain (:mod:`~engine.models.load`), where its weights go
(:mod:`~engine.models.placement`), its facts (:mod:`~engine.models.facts`) and its weights fingerprint
(:mod:`~engine.models.fingerprint`)."""

#: the precisions a model can be loaded in (CLI ``--dtype``, the sidebar's Precision); torch-free
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
