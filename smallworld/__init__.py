"""The small world: a trained-model fixture, not a float64 oracle.

Lecture 001's quality claims (an NLL, a grammatical rate, a draft's acceptance rate) need real
models with known behaviour. This package is the suite's own version of that world: a
probabilistic grammar with an exact checker (:mod:`inference_conformance.smallworld.grammar`,
:mod:`inference_conformance.smallworld.checker`),
a word tokenizer, seeded data splits, the training command (``python -m inference_conformance.smallworld.train``), three
shipped checkpoints of the reference transformer (``smallworld/checkpoints/``: a target and two
drafts, each with a JSON card) and a loader for local Hugging Face Llama checkpoints
(:mod:`inference_conformance.smallworld.hf_llama`). Claims WD-1..WD-3.
"""
