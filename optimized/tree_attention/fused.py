"""The "triton" built-in of the ``tree_attention`` contract: tree attention in Triton (SpecInfer's
topology-aware causal mask; claim SD-10).

A token tree of n_nodes draft nodes, given by parent pointers, is scored in one target forward:
the nodes' keys and values are written to the cache right after each sequence's cached prefix,
and node i attends to the prefix and to its own ancestors and itself, nothing else. One program
per (sequence, query head) holds all the nodes' queries (n_nodes <= BLOCK_M): it streams the
prefix's keys in BLOCK_N tiles with the online softmax (``tile_loop``), then one tile of the
tree's own keys under the tree mask, which it builds in registers from the parent pointers: the
ancestor set of every node by DEPTH steps of ``cur = parents[cur]``. RoPE positions are the
caller's (depth-based: the tree engine's ``TreeCachedModel.node_positions``).

Layout: q (B, Hq, n_nodes, D); k_cache, v_cache (B, Hkv, S_max, D), contiguous per sequence,
prefix at slots [0, prefix_lens[b]), the tree at [prefix_lens[b], prefix_lens[b] + n_nodes);
parents (n_nodes,) int (-1: the root); prefix_lens (B,) int. Returns (B, Hq, n_nodes, D) in q's
dtype. GQA: query head h reads KV head h // G.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference_conformance.conformance.contracts.speculative_tree import depths
from inference_conformance.conformance.contracts.tree_attention import validate
from inference_conformance.optimized.triton_shared import check_device, dot_mode, flat_grid, tile_loop

#: Most nodes of one tree (one tile of queries per program).
MAX_NODES = 64


@triton.jit
def _scores(q, k, DOT_MODE: tl.constexpr):
    """(BLOCK_M, BLOCK_D) x (BLOCK_N, BLOCK_D) -> (BLOCK_M, BLOCK_N) in the accumulator dtype."""
    if DOT_MODE == 2:
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
    elif DOT_MODE == 0:
        s = tl.dot(q, tl.trans(k))
    else:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    return s


@triton.jit
def _weighted(p, v, DOT_MODE: tl.constexpr):
    """(BLOCK_M, BLOCK_N) x (BLOCK_N, BLOCK_D) -> (BLOCK_M, BLOCK_D)."""
    if DOT_MODE == 2:
        o = tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    elif DOT_MODE == 0:
        o = tl.dot(p.to(v.dtype), v)
    else:
        o = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return o


@triton.jit
def _prefix_tile(state, args, start_n, CONSTS: tl.constexpr):
    """One BLOCK_N tile of the cached prefix: keys < prefix_len visible to every node."""
    acc, m_i, l_i = state
    q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, prefix_len, scale = args
    DOT_MODE: tl.constexpr = CONSTS[0]
    BLOCK_N: tl.constexpr = CONSTS[1]
    BLOCK_D: tl.constexpr = CONSTS[2]
    D = CONSTS[3]
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (cols[:, None] < prefix_len) & (offs_d[None, :] < D)
    k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    s = _scores(q, k, DOT_MODE) * scale
    s = tl.where(cols[None, :] < prefix_len, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _weighted(p, v, DOT_MODE)
    return acc, m_new, l_i


@triton.jit
def tree_attention_kernel(
        Q_ptr, K_ptr, V_ptr, O_ptr, PAR_ptr, LEN_ptr,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        Hq, n_nodes, D, GROUP, scale,
        DEPTH: tl.constexpr, DOT_MODE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """1-D grid of B · Hq programs: program b · Hq + h attends every node of sequence b's tree
    for query head h (prefix tiles, then the tree tile under the ancestor mask)."""
    pid = tl.program_id(0)
    b = (pid // Hq).to(tl.int64)
    h = pid % Hq
    kvh = (h // GROUP).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    io_mask = (offs_m[:, None] < n_nodes) & (offs_d[None, :] < D)
    q = tl.load(Q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=io_mask, other=0.0)
    if DOT_MODE == 2:
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float64)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    prefix_len = tl.load(LEN_ptr + b).to(tl.int64)
    k_base = K_ptr + b * stride_kb + kvh * stride_kh
    v_base = V_ptr + b * stride_vb + kvh * stride_vh
    acc, m_i, l_i = tile_loop((acc, m_i, l_i),
                              (q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, prefix_len, scale),
                              0, prefix_len, BLOCK_N, _prefix_tile, (DOT_MODE, BLOCK_N, BLOCK_D, D))
    # the tree's own keys: node i sees node t iff t is i or one of its ancestors
    offs_t = tl.arange(0, BLOCK_M)
    cur = offs_m
    visible = offs_m[:, None] == offs_t[None, :]
    for _ in tl.static_range(DEPTH):
        cur = tl.load(PAR_ptr + cur, mask=(cur >= 0) & (cur < n_nodes), other=-1)
        visible = visible | ((cur[:, None] == offs_t[None, :]) & (cur[:, None] >= 0))
    visible = visible & (offs_t[None, :] < n_nodes) & (offs_m[:, None] < n_nodes)
    kv_mask = (offs_t[:, None] < n_nodes) & (offs_d[None, :] < D)
    slots = prefix_len + offs_t
    k = tl.load(k_base + slots[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(v_base + slots[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    s = _scores(q, k, DOT_MODE) * scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _weighted(p, v, DOT_MODE)
    out = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
    tl.store(O_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(O_ptr.dtype.element_ty), mask=io_mask)


def tree_attention(q, k_cache, v_cache, parents, prefix_lens, *, scale: float, block_n: int = 16) -> torch.Tensor:
    """The ``tree_attention`` contract (``conformance/contracts/tree_attention.py``) by the Triton
    kernel: attention of a token tree's nodes over the cached prefix and their own ancestors.

    q (B, Hq, n_nodes, D); k_cache, v_cache (B, Hkv, S_max, D) with the tree's keys and values
    at slots [prefix_lens[b], prefix_lens[b] + n_nodes); parents (n_nodes,) int; prefix_lens (B,)
    int. Returns (B, Hq, n_nodes, D) in q's dtype (float64, float32, float16, bfloat16). Raises
    TypeError / ValueError naming the argument (the contract's ``validate``) before any launch,
    and NotImplementedError for more than :data:`MAX_NODES` nodes (one tile of queries).
    """
    shape = validate(q, k_cache, v_cache, parents, prefix_lens, scale)
    if shape.n_nodes > MAX_NODES:
        raise NotImplementedError(f"the Triton tree kernel holds at most {MAX_NODES} nodes in one tile, "
                                  f"got n_nodes = {shape.n_nodes}")
    check_device(q)
    B, Hq, n, D = q.shape
    par = [int(x) for x in parents.tolist()]
    mode = dot_mode(q.dtype)
    BLOCK_M = max(16, triton.next_power_of_2(n))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    out = torch.empty_like(q)
    par_t = torch.tensor(par, dtype=torch.int32, device=q.device)
    lens = prefix_lens.to(torch.int32)
    tree_attention_kernel[flat_grid(B * Hq)](
        q, k_cache, v_cache, out, par_t, lens, *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        Hq, n, D, Hq // shape.Hkv, float(scale),
        DEPTH=max(depths(par)), DOT_MODE=mode, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D)
    return out


def compile_variants():
    """The tree kernel in fp16 (tl.dot tiles, the prefix's tile loop a ``for``)."""
    from inference_conformance.optimized.triton_shared import DOT_NATIVE, CompileVariant

    return [CompileVariant("tree_attention fp16 depth 3", tree_attention_kernel,
                           {"Q_ptr": "*fp16", "K_ptr": "*fp16", "V_ptr": "*fp16", "O_ptr": "*fp16",
                            "PAR_ptr": "*i32", "LEN_ptr": "*i32", "scale": "fp32"},
                           dict(DEPTH=3, DOT_MODE=DOT_NATIVE, BLOCK_M=16, BLOCK_N=32, BLOCK_D=64), min_for_loops=1)]


def smoke_calls(device: str):
    """A binary tree of depth 2 over a 21-token prefix, float32, against the float64 reference."""
    from inference_conformance.optimized.triton_shared import SmokeCall

    def run():
        from inference_conformance.conformance.tolerance import check_close
        from inference_conformance.reference.tree_attention import tree_attention as reference_tree_attention

        g = torch.Generator().manual_seed(0)
        q = torch.randn(2, 4, 6, 32, generator=g, dtype=torch.float64)
        k = torch.randn(2, 2, 40, 32, generator=g, dtype=torch.float64)
        v = torch.randn(2, 2, 40, 32, generator=g, dtype=torch.float64)
        par = torch.tensor([-1, -1, 0, 0, 1, 1])
        lens = torch.tensor([21, 9])
        out_ref = reference_tree_attention(q, k, v, par, lens, scale=32 ** -0.5)
        out = tree_attention(q.float().to(device), k.float().to(device), v.float().to(device), par.to(device),
                             lens.to(device), scale=32 ** -0.5)
        return check_close(out, out_ref, what="tree_attention float32 vs float64 reference")

    return [SmokeCall("tree_attention float32 binary tree prefix 21/9", run)]
