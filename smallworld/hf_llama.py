"""Load a Llama-family checkpoint from a local Hugging Face folder into the reference transformer.

The folder holds ``config.json`` and one or more ``*.safetensors`` files (sharded checkpoints
with ``model.safetensors.index.json`` too). Supported: ``model_type`` "llama"
(``LlamaForCausalLM``) with RMSNorm, RoPE with the config's theta (``rope_theta``, or
``rope_parameters["rope_theta"]`` in newer configs) and no RoPE scaling, grouped-query
attention (``num_key_value_heads``), an explicit ``head_dim``, SwiGLU (``hidden_act`` "silu"),
no attention/MLP biases, tied or untied embeddings. Anything else raises
:class:`UnsupportedCheckpoint` (a ValueError) naming the field; a missing or unexpected tensor
raises :class:`MissingTensor` / ValueError naming it.

RoPE layout: Hugging Face Llama checkpoints store q_proj / k_proj already permuted for the
"rotate half" convention (pairs ``(x[i], x[i + H/2])``), which is what
:func:`inference_conformance.reference.transformer.apply_rope` uses, so the weights are copied without permutation.
Name map (per layer ``i``)::

    model.embed_tokens.weight                     -> embed.weight
    model.layers.i.input_layernorm.weight         -> blocks.i.attn_norm.weight
    model.layers.i.self_attn.{q,k,v,o}_proj.weight -> blocks.i.attn.{wq,wk,wv,wo}.weight
    model.layers.i.post_attention_layernorm.weight -> blocks.i.mlp_norm.weight
    model.layers.i.mlp.{gate,up,down}_proj.weight -> blocks.i.mlp.{w_gate,w_up,w_down}.weight
    model.norm.weight                             -> norm.weight
    lm_head.weight                                -> head.weight (untied only)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from inference_conformance.reference.transformer import Transformer, TransformerConfig

SUPPORTED_MODEL_TYPES = ("llama",)
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn.wq.weight",
    "self_attn.k_proj.weight": "attn.wk.weight",
    "self_attn.v_proj.weight": "attn.wv.weight",
    "self_attn.o_proj.weight": "attn.wo.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    "mlp.gate_proj.weight": "mlp.w_gate.weight",
    "mlp.up_proj.weight": "mlp.w_up.weight",
    "mlp.down_proj.weight": "mlp.w_down.weight",
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class UnsupportedCheckpoint(ValueError):
    """The checkpoint's architecture or one of its options is not what the reference implements."""


class MissingTensor(ValueError):
    """A weight the architecture needs is not in the checkpoint's safetensors files."""


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    for what in (params, scaling or {}):
        kind = what.get("rope_type", what.get("type", "default"))
        if kind not in (None, "default"):
            raise UnsupportedCheckpoint(f"RoPE scaling {kind!r} is not supported (only plain RoPE)")
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(cfg.get("rope_theta", 10000.0))


def config_from_hf(cfg: dict, max_seq_len: int | None = None) -> TransformerConfig:
    """A :class:`TransformerConfig` from a Hugging Face Llama ``config.json`` dict.

    Raises UnsupportedCheckpoint for another model type or an option the reference lacks."""
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedCheckpoint(f"unsupported architecture: model_type {model_type!r} "
                                    f"(architectures {archs}); supported: {SUPPORTED_MODEL_TYPES}")
    if archs and not all(a in ("LlamaForCausalLM", "LlamaModel") for a in archs):
        raise UnsupportedCheckpoint(f"unsupported architecture {archs}; supported: LlamaForCausalLM")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
    for flag in ("attention_bias", "mlp_bias"):
        if cfg.get(flag, False):
            raise UnsupportedCheckpoint(f"{flag}=True is not supported (the reference has no biases)")
    d, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim")
    head_dim = None if head_dim is None or int(head_dim) * n_heads == d and d % n_heads == 0 else int(head_dim)
    return TransformerConfig(
        vocab_size=int(cfg["vocab_size"]), d_model=d, n_layers=int(cfg["num_hidden_layers"]), n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads), d_ff=int(cfg["intermediate_size"]),
        max_seq_len=int(max_seq_len or cfg.get("max_position_embeddings", 2048)), rope_theta=_rope_theta(cfg),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=head_dim)


def hf_name_map(cfg: TransformerConfig) -> dict[str, str]:
    """reference parameter name -> Hugging Face tensor name."""
    out = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    for i in range(cfg.n_layers):
        for hf, ref in _LAYER_MAP.items():
            out[f"blocks.{i}.{ref}"] = f"model.layers.{i}.{hf}"
    if not cfg.tie_embeddings:
        out["head.weight"] = "lm_head.weight"
    return out


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def load_hf_llama(folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  max_seq_len: int | None = None) -> Transformer:
    """The Llama checkpoint in ``folder`` as a reference :class:`Transformer` in ``dtype`` on
    ``device`` (eval mode).

    Raises FileNotFoundError (no config.json / safetensors), UnsupportedCheckpoint (another
    architecture or option), MissingTensor (a needed weight is absent), ValueError (a tensor of
    the wrong shape, or an unexpected tensor)."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found (expected a Hugging Face model folder)")
    cfg = config_from_hf(json.loads(cfg_path.read_text()), max_seq_len)
    tensors = read_tensors(folder)
    model = Transformer(cfg)
    names = hf_name_map(cfg)
    state = {}
    for ref_name, param in model.state_dict().items():
        hf = names[ref_name]
        if hf not in tensors:
            raise MissingTensor(f"missing tensor {hf!r} (for {ref_name}) in {folder}")
        t = tensors[hf]
        if tuple(t.shape) != tuple(param.shape):
            raise ValueError(f"tensor {hf!r} has shape {tuple(t.shape)}, expected {tuple(param.shape)} "
                             "from config.json")
        state[ref_name] = t.to(torch.float64 if dtype == torch.float64 else torch.float32)
    used = set(names.values()) | ({"lm_head.weight"} if cfg.tie_embeddings else set())
    extra = sorted(k for k in tensors if k not in used and not k.endswith(_IGNORED_SUFFIXES))
    if extra:
        raise ValueError(f"unexpected tensors in {folder}: {extra[:5]} (not a plain Llama checkpoint?)")
    model = model.to(state["embed.weight"].dtype)
    model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()
