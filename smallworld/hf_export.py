"""Write the small world's checkpoints as Hugging Face Llama folders (the inverse of
:mod:`inference_conformance.smallworld.hf_llama`), so that real engines load them.

A folder holds ``config.json`` (``model_type`` "llama", ``LlamaForCausalLM``, the special ids
of :mod:`inference_conformance.smallworld.tokenizer`: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2) and
``model.safetensors`` with transformers' tensor names (:func:`hf_llama.hf_name_map`), float32;
tied embeddings store ``model.embed_tokens.weight`` only. The weights are the checkpoint's, byte
for byte.

Head-dim padding (:func:`pad_head_dim`): a model of head dim D becomes the same function at
head dim D' = r·D (r a power of two, so that RoPE's frequencies theta^(-2i/D) equal theta^(-2ri/D')
exactly): original feature i of each half of a head goes to feature r·i of the same half, every
other feature is zero in wq, wk, wv and in wo's columns, and wq is multiplied by sqrt(r) so that
q·k / sqrt(D') = q·k / sqrt(D). Some engines refuse small head dims (vLLM's CPU attention takes
32, 64, ...; the shipped drafts have 16). :func:`check_export` reloads a folder through
:func:`hf_llama.load_hf_llama` and measures the float64 logit difference from the original:
a plain export is exactly 0 (the same weights); a padding by r = 4, 16, ... (sqrt(r) a power of
two, so the scaled weights are exact) differs only by float64 summation order (the matmuls add
zeros in other places; bound :data:`SUMMATION_BOUND`); r = 2 scales wq by sqrt(2), which float32
rounds, so its bound is float32's (:data:`ROUNDED_BOUND`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from inference_conformance.reference.transformer import Transformer, TransformerConfig
from inference_conformance.smallworld import checkpoints
from inference_conformance.smallworld.hf_llama import hf_name_map, load_hf_llama

#: The special ids of the suite's tokenizer (``smallworld/tokenizer.py``).
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
#: The draft head dims :func:`export_world` writes besides the drafts' own.
DRAFT_HEAD_DIMS = (32, 64)
#: Largest float64 logit difference of an exact padding: only the summation order differs
#: (logits are O(10), float64's unit roundoff 1.1e-16, sums of at most a few hundred terms).
SUMMATION_BOUND = 1e-12
#: Largest float64 logit difference of a padding whose wq scale float32 rounds (r = 2): wq's
#: relative error 2^-24 through |q·k| of O(10) and the softmax, a few 1e-6 at most.
ROUNDED_BOUND = 1e-5


def hf_config(cfg: TransformerConfig) -> dict:
    """The ``config.json`` dict of a reference config (float32 weights, no RoPE scaling)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.hd,
        "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "torch_dtype": "float32",
    }


def hf_state(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, float32, contiguous, on the CPU."""
    names = hf_name_map(model.cfg)
    return {names[k]: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}


def pad_head_dim(model: Transformer, head_dim: int) -> Transformer:
    """``model`` at head dim ``head_dim`` computing the same function (see the module docstring),
    in ``model``'s dtype. Raises ValueError unless head_dim / D is a power of two >= 1."""
    cfg = model.cfg
    D = cfg.hd
    r = head_dim // D if head_dim % D == 0 else 0
    if r < 1 or r & (r - 1):
        raise ValueError(f"head_dim must be the model's head dim {D} times a power of two, got {head_dim}")
    new_cfg = TransformerConfig(**{**cfg.to_dict(), "head_dim": head_dim})
    half, new_half = D // 2, head_dim // 2
    index = torch.cat([torch.arange(half) * r, new_half + torch.arange(half) * r])   # (D,) feature -> new feature
    out = Transformer(new_cfg).to(dtype=next(model.parameters()).dtype)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def rows(w: torch.Tensor, heads: int, scale: float = 1.0) -> torch.Tensor:   # (heads·D, d) -> (heads·D', d)
        w = w.view(heads, D, -1)
        new = w.new_zeros(heads, head_dim, w.shape[-1])
        new[:, index] = w * scale
        return new.reshape(heads * head_dim, -1)

    for i in range(cfg.n_layers):
        p = f"blocks.{i}.attn."
        state[p + "wq.weight"] = rows(state[p + "wq.weight"], cfg.n_heads, math.sqrt(r))
        state[p + "wk.weight"] = rows(state[p + "wk.weight"], cfg.n_kv_heads)
        state[p + "wv.weight"] = rows(state[p + "wv.weight"], cfg.n_kv_heads)
        state[p + "wo.weight"] = rows(state[p + "wo.weight"].t().contiguous(), cfg.n_heads).t().contiguous()
    out.load_state_dict(state)
    return out.eval()


def tokenizer_json() -> dict:
    """The suite's word-level vocabulary as a ``tokenizer.json`` (tokenizers' WordLevel model,
    split on whitespace), for engines that insist on a tokenizer (CTranslate2's converter reads
    the token strings from it); ids are the suite's, so token ids round-trip."""
    from inference_conformance.smallworld.tokenizer import tokenizer

    tok = tokenizer()
    specials = [{"id": i, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for i, w in enumerate(tok.itos[:4])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": specials, "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
            "decoder": None, "model": {"type": "WordLevel", "vocab": dict(tok.stoi), "unk_token": "<unk>"}}


def write_folder(model: Transformer, folder: str | Path) -> Path:
    """Write ``model`` as a Hugging Face Llama folder (config.json, model.safetensors, and the
    word-level tokenizer.json with its tokenizer_config.json); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(hf_state(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(model.cfg), indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False}, indent=2) + "\n")
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
         "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": model.cfg.max_seq_len}, indent=2) + "\n")
    return folder


def probe_tokens(vocab_size: int, seed: int = 0, batch: int = 4, length: int = 48) -> torch.Tensor:
    """A fixed (batch, length) int64 batch of ids in [0, vocab_size) starting with ``<bos>``."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(3, vocab_size, (batch, length), generator=g)
    t[:, 0] = BOS_ID
    return t


@torch.no_grad()
def check_export(folder: str | Path, model: Transformer) -> float:
    """The largest float64 |logit difference| between the folder reloaded through
    :func:`hf_llama.load_hf_llama` and ``model`` (the unpadded original), on
    :func:`probe_tokens`. 0 for a plain export and for an exact head-dim padding."""
    reloaded = load_hf_llama(folder, dtype=torch.float64, max_seq_len=model.cfg.max_seq_len)
    tokens = probe_tokens(model.cfg.vocab_size, length=min(48, model.cfg.max_seq_len))
    want = model.to(torch.float64)(tokens)
    return float((reloaded(tokens) - want).abs().max())


def padding_bound(head_dim: int | None, own: int) -> float:
    """The float64 logit difference :func:`check_export` allows an export at ``head_dim`` of a
    model of head dim ``own``: 0 for the model's own, else :data:`SUMMATION_BOUND` where sqrt(r)
    is a power of two and :data:`ROUNDED_BOUND` otherwise."""
    if head_dim is None or head_dim == own:
        return 0.0
    r = head_dim // own
    return SUMMATION_BOUND if math.sqrt(r) == 2 ** round(math.log2(math.sqrt(r))) else ROUNDED_BOUND


def export_model(name: str, out: str | Path, head_dim: int | None = None) -> tuple[Path, float]:
    """Export the shipped checkpoint ``name`` (or a checkpoint path) to ``out``, at ``head_dim``
    when given (:func:`pad_head_dim`). Returns (the folder, :func:`check_export`'s difference).
    Raises FileNotFoundError for an unknown checkpoint, ValueError for a bad head_dim."""
    model = checkpoints.load_model(name, dtype=torch.float32)
    exported = model if head_dim is None or head_dim == model.cfg.hd else pad_head_dim(model, head_dim)
    folder = write_folder(exported, out)
    return folder, check_export(folder, model)


def folder_bound(key: str) -> float:
    """The bound :func:`padding_bound` gives the folder ``key`` of :func:`export_world` ("NAME" or
    "NAME-hdD")."""
    name, _, hd = key.partition("-hd")
    cfg = checkpoints.load_card(name)["config"]
    return padding_bound(int(hd) if hd else None, cfg["head_dim"] or cfg["d_model"] // cfg["n_heads"])


def export_world(out: str | Path, names: tuple[str, ...] = checkpoints.NAMES,
                 draft_head_dims: tuple[int, ...] = DRAFT_HEAD_DIMS) -> dict[str, tuple[Path, float]]:
    """Every shipped checkpoint as ``out/NAME``, and each draft also as ``out/NAME-hdD`` for D in
    ``draft_head_dims``. Returns folder name -> (path, float64 logit difference). Raises
    ValueError when a difference exceeds :func:`padding_bound` (not the same model)."""
    out = Path(out)
    done: dict[str, tuple[Path, float]] = {}
    for name in names:
        done[name] = export_model(name, out / name)
        if name != "target":
            for hd in draft_head_dims:
                done[f"{name}-hd{hd}"] = export_model(name, out / f"{name}-hd{hd}", hd)
    bad = {key: d for key, (_, d) in done.items() if d > folder_bound(key)}
    if bad:
        raise ValueError(f"exported folders differ from the reference in float64 logits: {bad}")
    return done


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``inference-conformance export-model OUT [--names ...] [--head-dims 32 64]``: write the
    folders and print each one's float64 logit difference against its bound (:func:`folder_bound`)
    and the verdict. Exit 0, or 1 when one exceeds its bound."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description="Write the small world's checkpoints as Hugging Face "
                                 "Llama folders (drafts also zero-padded to larger head dims), each checked "
                                 "against the float64 reference.")
    ap.add_argument("out", help="folder to write OUT/NAME into")
    ap.add_argument("--names", nargs="+", default=list(checkpoints.NAMES), choices=list(checkpoints.NAMES))
    ap.add_argument("--head-dims", nargs="*", type=int, default=list(DRAFT_HEAD_DIMS),
                    help="draft head dims to write besides the drafts' own (default: 32 64)")
    args = ap.parse_args(argv)
    try:
        done = export_world(args.out, tuple(args.names), tuple(args.head_dims))
    except ValueError as exc:
        print(f"error: {exc}")
        return 1
    for key, (path, diff) in done.items():
        print(f"{key}: {path} (float64 logit difference {diff:.3g} <= bound {folder_bound(key):.3g}: the same model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
