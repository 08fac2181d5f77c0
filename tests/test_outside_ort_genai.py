"""Reproduction of what the inference_engine laws found in onnxruntime-genai (peer set "engines",
``tox -e peers-engines``); skipped where it is missing. It asserts the finding as measured, so a
release that changes the behaviour fails here and its expectation
(``expectations/inference_engine-ort_genai.toml``) is revisited."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None,
                                reason="onnxruntime_genai is not installed")


def _logprobs(og, model, rows, n):
    """(B, n) log-softmax of the chosen tokens of greedy generation over the 2-D ``rows``."""
    gp = og.GeneratorParams(model)
    gp.set_search_options(max_length=len(rows[0]) + n, do_sample=False, top_k=1, batch_size=len(rows))
    gen = og.Generator(model, gp)
    gen.append_tokens(np.array(rows, dtype=np.int32))
    out = []
    for _ in range(n):
        logits = np.array(gen.get_logits(), dtype=np.float64).reshape(len(rows), -1)
        gen.generate_next_token()
        t = np.array(gen.get_next_tokens())
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        out.append(logits[np.arange(len(rows)), t] - lse)
    return np.stack(out, 1)


def test_finding_ort_genai_left_padded_rows_attend_their_padding(tmp_path):
    """onnxruntime-genai 0.18.0, greedy, ``batch_size`` 2 and a padded 2-D ``append_tokens``
    (pad id 0, the exported ``genai_config.json``'s ``pad_token_id``): the 1-token prompt (1,)
    left-padded beside an 8-token prompt gets other logprobs than alone (by 1.68 here), while
    right-padded it is bitwise equal to alone. EN-2 fails on it
    (expectations/inference_engine-ort_genai.toml)."""
    import onnxruntime_genai as og

    from inference_conformance.optimized.inference_engine.ort_genai import OrtGenAI
    from inference_conformance.smallworld.hf_export import export_model

    folder, _ = export_model("target", tmp_path / "target")
    model, pad = OrtGenAI().model(folder)
    short, long = [1], [1, 235, 105, 64, 211, 17, 4, 235]
    alone = _logprobs(og, model, [short], 6)[0]
    left = _logprobs(og, model, [[pad] * 7 + short, long], 6)[0]
    right = _logprobs(og, model, [short + [pad] * 7, long], 6)[0]
    assert np.array_equal(right, alone), (right, alone)
    assert np.abs(left - alone).max() > 0.3, (left, alone)
