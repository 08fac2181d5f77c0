"""Adapters of the attention libraries that run on a CPU to the ``attention`` contract
(``conformance/contracts/attention.py``)::

    attention(q, k, v, *, causal: bool, scale: float) -> Tensor
    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D); causal mask aligned bottom-right; returns (B, Hq, Tq, D)

Each translates the call into the library's layout and calls the library's own attention; none
computes a softmax itself. Where the package is missing the registry lists the adapter
unavailable (``needs=``) without importing it. What a library does not take raises
``NotImplementedError`` naming it (the suite reports "unsupported", never a pass); anything the
library itself raises or returns is left for the laws to judge. Claims FA-3, FA-7 (the laws of
``properties/attention/test_attention.py``).

- ``flex_attention``: ``torch.nn.attention.flex_attention.flex_attention`` eager, the causal mask
  as a ``mask_mod`` (key j visible from query i iff j <= i + Tk - Tq) through
  ``create_block_mask``, GQA by ``enable_gqa``. Every dtype of the contract. (Compiled
  flex_attention on CPU needs torch.compile's C++ backend, a compile per shape: not adapted.)
  FA-8's options: ``window`` joins the ``mask_mod`` (``j > i + Tk - Tq - W``), ``softcap`` is a
  ``score_mod`` (``c · tanh(score / c)``); flex_attention has no sinks: refused (no keyword).
- ``sdpa_math`` / ``sdpa_flash_cpu``: ``torch.nn.functional.scaled_dot_product_attention`` with
  one CPU backend forced by ``torch.nn.attention.sdpa_kernel`` (``SDPBackend.MATH``,
  ``SDPBackend.FLASH_ATTENTION``: the CPU flash kernel). ``is_causal=True`` where Tq == Tk
  (PyTorch aligns it top-left), else an explicit boolean mask; GQA by ``enable_gqa``. The CPU
  flash kernel takes float32, float64, float16, bfloat16; an input the forced backend refuses
  (PyTorch's "No available kernel", e.g. the flash kernel on non-contiguous inputs) is refused.
  FA-8's ``window``: the built boolean mask (:func:`window_mask`); SDPA has no cap or sinks.
- ``jax_attention``: ``jax.nn.dot_product_attention(q, k, v, mask=, scale=,
  implementation="xla")`` on JAX's CPU device, layout (B, T, N, H), GQA native; the causal mask
  is passed as a boolean (1, 1, Tq, Tk) mask (JAX's ``is_causal`` is top-left). float64 runs
  under ``jax.enable_x64`` (one call at a time); bfloat16 crosses as ``ml_dtypes.bfloat16``.
  FA-8's ``window`` through JAX's own ``local_window_size=(W - 1, 0)`` with ``is_causal=True``
  (both top-left): the query is front-padded with Tk - Tq zero rows so that its rows sit at
  their bottom-right positions, and those rows are dropped from the output. JAX has no cap or
  sinks (no keyword: refused).
- ``ort_attention``: the ONNX ``Attention`` operator (opset 23) in ONNX Runtime's CPU provider,
  4-D inputs (B, H, T, D), GQA native, ``is_causal=1`` where Tq == Tk, else a boolean ``attn_mask``;
  float32, float16, float64 (no bfloat16 kernel: refused); scale <= 0 refused (its kernel raises
  "scale must be greater than 0").
- ``ort_mha``: ``com.microsoft.MultiHeadAttention``, query (B, Tq, Hq * D), key and value in BNSH
  (B, H, Tk, D); the causal mask as an additive ``attention_bias`` (1, 1, Tq, Tk) of 0 / -inf.
  float32 and float16; no GQA (Hq != Hkv refused); scale 0 refused (the op reads 0 as 1/sqrt(D)).
- ``ort_gqa``: ``com.microsoft.GroupQueryAttention``, ``causal`` as its attribute (1: the mask
  aligned bottom-right, 0: bidirectional; ONNX Runtime 1.32): the first Tk - Tq keys are
  its ``past_key`` / ``past_value`` (B, Hkv, Tk - Tq, D), the last Tq the new ones (B, Tq,
  Hkv * D), ``seqlens_k`` = Tk - 1, ``total_sequence_length`` = Tk (one request at a time where it has a
  past and Tq > 1: its CPU kernel takes batch 1 there). float32 and float16, head dims multiple of 8.
  FA-8's options: ``window`` W as ``local_window_size`` = min(W, Tk) (ONNX
  Runtime's window counts the query's own key, as the contract's), ``softcap`` as its ``softcap``
  attribute, ``sinks`` as its ``head_sink`` input (Hq,), which has the query's type: sinks not
  exact in q's dtype are refused (rounding them would change the answer).

ONNX sessions are built once per (operator, dtype, heads, head dim, causal, scale, shape) and
cached (:func:`_session`).
"""
from __future__ import annotations

import functools
import importlib
import math

import torch

from inference_conformance.conformance.contracts.attention import causal_mask, validate, window_mask

# ------------------------------------------------------------------------ torch flex_attention


def flex_attention(q, k, v, *, causal: bool, scale: float, window: int | None = None,
                   softcap: float | None = None):
    """The attention contract through eager ``flex_attention``; q (B, Hq, Tq, D), k, v (B, Hkv,
    Tk, D) -> (B, Hq, Tq, D) in q's dtype; ``window`` as a mask_mod, ``softcap`` as a score_mod
    (FA-8). Raises as the contract's ``validate``."""
    s = validate(q, k, v, causal, scale, window, softcap)
    fa = importlib.import_module("torch.nn.attention.flex_attention")
    block_mask = score_mod = None
    if causal:
        offset = s.Tk - s.Tq

        def bottom_right(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

        def windowed(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx + offset) & (kv_idx > q_idx + offset - window)

        block_mask = fa.create_block_mask(bottom_right if window is None else windowed, None, None, s.Tq, s.Tk,
                                          device=str(q.device))
    if softcap is not None:
        def capped(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / softcap) * softcap

        score_mod = capped
    out = fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=float(scale),
                            enable_gqa=s.group > 1)
    return out.contiguous()


# ------------------------------------------------------------------- SDPA, one CPU backend


def _sdpa(backend_name: str, q, k, v, causal: bool, scale: float, window=None):
    s = validate(q, k, v, causal, scale, window)
    if q.device.type != "cpu":
        raise NotImplementedError(f"the {backend_name} adapter pins a CPU backend, got {q.device}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    kwargs = {"enable_gqa": True} if s.group > 1 else {}
    try:
        with sdpa_kernel([backend]):
            if causal and s.Tq == s.Tk and window is None:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float(scale),
                                                                        **kwargs)
            mask = window_mask(s.Tq, s.Tk, window, q.device) if causal else None   # (Tq, Tk) bool
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(scale),
                                                                    **kwargs)
    except RuntimeError as e:              # the forced backend refuses this input (PyTorch's own check)
        if "No available kernel" in str(e):
            raise NotImplementedError(f"SDPBackend.{backend_name} refuses this call on CPU: {e}") from e
        raise


def sdpa_math(q, k, v, *, causal: bool, scale: float, window: int | None = None):
    """SDPA with ``SDPBackend.MATH`` forced (PyTorch's composite reference path); ``window`` as a
    built mask (FA-8). Shapes as the contract; NotImplementedError off CPU."""
    return _sdpa("MATH", q, k, v, causal, scale, window)


def sdpa_flash_cpu(q, k, v, *, causal: bool, scale: float, window: int | None = None):
    """SDPA with ``SDPBackend.FLASH_ATTENTION`` forced: on CPU, PyTorch's tiled flash kernel;
    ``window`` as a built mask (FA-8). Shapes as the contract; NotImplementedError off CPU."""
    return _sdpa("FLASH_ATTENTION", q, k, v, causal, scale, window)


# --------------------------------------------------------------------------------------- JAX


def _to_numpy(t: torch.Tensor):
    """A CPU tensor as a numpy array; bfloat16 as ml_dtypes.bfloat16 (the same bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        ml_dtypes = importlib.import_module("ml_dtypes")
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a, dtype: torch.dtype, device) -> torch.Tensor:
    import numpy as np

    a = np.asarray(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(a.copy()).to(device=device, dtype=dtype)


def jax_attention(q, k, v, *, causal: bool, scale: float, window: int | None = None):
    """The attention contract through ``jax.nn.dot_product_attention`` (XLA, CPU), layout
    (B, T, N, H); q (B, Hq, Tq, D), k, v (B, Hkv, Tk, D) -> (B, Hq, Tq, D) in q's dtype on q's
    device; ``window`` W as JAX's ``local_window_size`` (see the module docstring). Raises as
    the contract's ``validate``."""
    s = validate(q, k, v, causal, scale, window)
    jax = importlib.import_module("jax")
    jnp = importlib.import_module("jax.numpy")
    x64 = _jax_x64(jax) if q.dtype == torch.float64 else _NoContext()
    pad = s.Tk - s.Tq if window is not None else 0
    if pad:   # the rows at their bottom-right positions: JAX's causal mask and window are top-left
        q = torch.cat([q.new_zeros(s.B, s.Hq, pad, s.D), q], dim=2)
    with x64:
        cpu = jax.devices("cpu")[0]
        qj, kj, vj = (jax.device_put(_to_numpy(t.transpose(1, 2)), cpu) for t in (q, k, v))   # (B, T, N, H)
        if window is not None:
            out = jax.nn.dot_product_attention(qj, kj, vj, scale=float(scale), is_causal=True,
                                               local_window_size=(min(window, s.Tk) - 1, 0), implementation="xla")
        else:
            mask = jnp.asarray(_to_numpy(causal_mask(s.Tq, s.Tk, "cpu")))[None, None] if causal else None
            out = jax.nn.dot_product_attention(qj, kj, vj, mask=mask, scale=float(scale), implementation="xla")
        out = jax.device_get(out)                                                              # (B, T, Hq, D)
    return _from_numpy(out, q.dtype, q.device)[:, pad:].transpose(1, 2).contiguous()


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _jax_x64(jax):
    """JAX's float64 mode for one call: ``jax.enable_x64(True)`` (JAX >= 0.7), else
    ``jax.experimental.enable_x64()``."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    return importlib.import_module("jax.experimental").enable_x64()


# ------------------------------------------------------------------------------ ONNX Runtime

_ORT_DTYPES = {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.float64: "DOUBLE"}


@functools.lru_cache(maxsize=64)
def _session(op: str, dtype: torch.dtype, Hq: int, Hkv: int, D: int, causal: bool, scale: float,
             square: bool, window: int = -1, softcap: float = 0.0, sinks: bool = False):
    """An ONNX Runtime CPU session running one attention node: ``op`` "attention" (ONNX
    Attention, opset 23), "mha" (com.microsoft.MultiHeadAttention) or "gqa"
    (com.microsoft.GroupQueryAttention, with its ``causal``, ``local_window_size`` = ``window`` (-1: none),
    ``softcap`` (0: none) and, where ``sinks``, a ``head_sink`` input); inputs and outputs as the
    adapters feed them."""
    onnx = importlib.import_module("onnx")
    ort = importlib.import_module("onnxruntime")
    helper, tp = onnx.helper, onnx.TensorProto
    elem = getattr(tp, _ORT_DTYPES[dtype])

    def value(name, elem_type=elem):
        return helper.make_tensor_value_info(name, elem_type, None)

    if op == "attention":
        inputs = ["Q", "K", "V"] + ([] if not causal or square else ["mask"])
        attrs = {"scale": scale, "is_causal": int(causal and square)}
        node = helper.make_node("Attention", inputs, ["Y"], **attrs)
        ins = [value("Q"), value("K"), value("V")] + ([value("mask", tp.BOOL)] if len(inputs) == 4 else [])
        opsets = [helper.make_opsetid("", 23)]
    elif op == "mha":
        inputs = ["Q", "K", "V"] + (["", "", "bias"] if causal else [])
        node = helper.make_node("MultiHeadAttention", inputs, ["Y"], domain="com.microsoft", num_heads=Hq,
                                scale=scale)
        ins = [value("Q"), value("K"), value("V")] + ([value("bias")] if causal else [])
        opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    else:
        inputs = ["Q", "K", "V", "past_k", "past_v", "seqlens_k", "total"]
        inputs += ["", "", "", "", "sinks"] if sinks else []                 # head_sink is input 11
        node = helper.make_node("GroupQueryAttention", inputs, ["Y", "present_k", "present_v"],
                                domain="com.microsoft", num_heads=Hq, kv_num_heads=Hkv, scale=scale,
                                local_window_size=window, softcap=softcap, causal=int(causal))
        ins = [value("Q"), value("K"), value("V"), value("past_k"), value("past_v"),
               value("seqlens_k", tp.INT32), value("total", tp.INT32)] + ([value("sinks")] if sinks else [])
        opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    outs = [value(n) for n in node.output]
    model = helper.make_model(helper.make_graph([node], op, ins, outs), opset_imports=opsets)
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ort_refuse(q, what: str, dtypes) -> None:
    if q.dtype not in dtypes:
        raise NotImplementedError(f"ONNX Runtime's CPU {what} supports {[str(d) for d in dtypes]}, not {q.dtype}")


def ort_attention(q, k, v, *, causal: bool, scale: float):
    """The attention contract through the ONNX ``Attention`` operator (opset 23) on ONNX
    Runtime's CPU provider, inputs (B, H, T, D) as they are. NotImplementedError for bfloat16."""
    s = validate(q, k, v, causal, scale)
    _ort_refuse(q, "Attention", (torch.float32, torch.float16, torch.float64))
    if scale <= 0:      # the library's own refusal (session creation fails), in its words
        raise NotImplementedError("ONNX Runtime's Attention kernel (attention.cc): \"scale must be greater than 0 "
                                  f"if specified\" (got {scale})")
    square = s.Tq == s.Tk
    feeds = {"Q": _to_numpy(q), "K": _to_numpy(k), "V": _to_numpy(v)}
    if causal and not square:
        feeds["mask"] = _to_numpy(causal_mask(s.Tq, s.Tk, "cpu"))                          # (Tq, Tk) bool
    sess = _session("attention", q.dtype, s.Hq, s.Hkv, s.D, causal, float(scale), square)
    (out,) = sess.run(None, feeds)
    return _from_numpy(out, q.dtype, q.device)


def ort_mha(q, k, v, *, causal: bool, scale: float):
    """The attention contract through ``com.microsoft.MultiHeadAttention`` (CPU): query
    (B, Tq, Hq * D), key / value (B, H, Tk, D); causal as an additive (1, 1, Tq, Tk) bias.
    NotImplementedError for float64, bfloat16 and GQA (Hq != Hkv). Scale 0 is not refused: ONNX
    Runtime reads it as its default 1/sqrt(D) and answers wrongly (FA-3 fails there)."""
    s = validate(q, k, v, causal, scale)
    _ort_refuse(q, "MultiHeadAttention", (torch.float32, torch.float16))
    if s.Hq != s.Hkv:
        raise NotImplementedError(f"com.microsoft.MultiHeadAttention has no GQA (Hq = {s.Hq}, Hkv = {s.Hkv})")
    feeds = {"Q": _to_numpy(q.transpose(1, 2).reshape(s.B, s.Tq, s.Hq * s.D)), "K": _to_numpy(k),
             "V": _to_numpy(v)}
    if causal:
        bias = torch.zeros(s.Tq, s.Tk, dtype=q.dtype).masked_fill(~causal_mask(s.Tq, s.Tk, "cpu"), -math.inf)
        feeds["bias"] = _to_numpy(bias[None, None])                                          # (1, 1, Tq, Tk)
    sess = _session("mha", q.dtype, s.Hq, s.Hkv, s.D, causal, float(scale), s.Tq == s.Tk)
    (out,) = sess.run(None, feeds)                                                           # (B, Tq, Hq * D)
    return _from_numpy(out, q.dtype, q.device).reshape(s.B, s.Tq, s.Hq, s.D).transpose(1, 2).contiguous()


def ort_gqa(q, k, v, *, causal: bool, scale: float, window: int | None = None, softcap: float | None = None,
            sinks=None):
    """The attention contract through ``com.microsoft.GroupQueryAttention`` (CPU): keys
    0..Tk - Tq - 1 as its past (B, Hkv, Tk - Tq, D), the last Tq as new tokens; ``causal`` as its
    ``causal`` attribute (1: the mask aligned bottom-right, 0: bidirectional).
    FA-8's options: ``window`` W as ``local_window_size`` = min(W, Tk) (the op's query sees its
    own key and the W - 1 before it, as the contract's; W >= Tk is plain causal), ``softcap`` as
    its ``softcap`` attribute (float32), ``sinks`` (Hq,) as its ``head_sink`` input, which has q's
    dtype. NotImplementedError for float64, bfloat16, head dims not a multiple of 8, Tq > Tk and
    sinks not exact in q's dtype (ONNX Runtime takes no other head_sink type). Scale 0 is not refused: ONNX
    Runtime reads it as its default 1/sqrt(D) and answers wrongly (FA-3 fails there)."""
    s = validate(q, k, v, causal, scale, window, softcap, sinks)
    _ort_refuse(q, "GroupQueryAttention", (torch.float32, torch.float16))
    if s.D % 8:
        raise NotImplementedError(f"com.microsoft.GroupQueryAttention's CPU kernel needs a head dim multiple of 8, not {s.D}")
    if s.Tq > s.Tk:        # its new tokens are the last Tq keys: a past of Tk - Tq >= 0 keys
        raise NotImplementedError("com.microsoft.GroupQueryAttention: \"query and key must have the same sequence "
                                  f"length when past_key is provided\" (Tq = {s.Tq} > Tk = {s.Tk})")
    past = s.Tk - s.Tq
    import numpy as np

    def tokens(t):                                                                  # (B, Tq, H * D)
        return _to_numpy(t[:, :, t.shape[2] - s.Tq:].transpose(1, 2).reshape(s.B, s.Tq, -1))

    feeds = {"Q": tokens(q), "K": tokens(k), "V": tokens(v),
             "past_k": _to_numpy(k[:, :, :past]), "past_v": _to_numpy(v[:, :, :past]),      # (B, Hkv, past, D)
             "seqlens_k": np.full((s.B,), s.Tk - 1, dtype=np.int32), "total": np.array(s.Tk, dtype=np.int32)}
    if sinks is not None:
        sink = sinks.detach().to("cpu", q.dtype)                                                  # (Hq,)
        if not bool((sink.to(sinks.dtype) == sinks.detach().cpu()).all()):       # rounding would change the math
            raise NotImplementedError(
                f"com.microsoft.GroupQueryAttention's head_sink input has the query's type: ONNX Runtime raises "
                f"\"Unexpected input data type\" for {sinks.dtype} sinks with {q.dtype} queries, and these sinks "
                f"are not exact in {q.dtype}")
        feeds["sinks"] = _to_numpy(sink)
    sess = _session("gqa", q.dtype, s.Hq, s.Hkv, s.D, causal, float(scale), s.Tq == s.Tk,
                    -1 if window is None else min(int(window), s.Tk), 0.0 if softcap is None else float(softcap),
                    sinks is not None)
    if past and s.Tq > 1 and s.B > 1:      # "batch_size must be 1 when sequence_length > 1 and past context is given"
        one = [{n: (a if n in ("total", "sinks") else a[b:b + 1]) for n, a in feeds.items()} for b in range(s.B)]
        outs = [sess.run(["Y"], f)[0] for f in one]
        out = np.concatenate(outs)
    else:
        out = sess.run(["Y"], feeds)[0]                                              # (B, Tq, Hq * D)
    return _from_numpy(out, q.dtype, q.device).reshape(s.B, s.Tq, s.Hq, s.D).transpose(1, 2).contiguous()
