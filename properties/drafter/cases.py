"""Runs of a ``drafter`` implementation for the laws of SD-12 and SD-14 (``conformance/contracts/
drafter.py``): greedy tree speculation of the small world's shipped target
(``optimized/speculative_tree/engine.py``) with the drafter under test, each of its calls watched
(:class:`Watched`: the context unchanged, the tree well formed, the round recorded), judged against
greedy decoding of the float64 target by full forwards; the replay of the engine's counts from the
recorded proposals alone (:func:`replay`); the prompts; the contract's bad calls
(:func:`invalid_calls`, which need the target model).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from inference_conformance.conformance.contracts.drafter import check_proposal
from inference_conformance.conformance.registry import InvalidCall
from inference_conformance.conformance.tolerance import assert_close, assert_exact

#: The known-bad drafters (``properties/drafter/zoo.py``) SD-12's law must reject, and SD-14's.
ZOO_SD12 = ("skips_layers_in_place", "parents_counted_from_the_pending_token", "extends_the_context_in_place",
            "samples_with_the_global_generator")
ZOO_SD14 = ("samples_with_the_global_generator", "index_kept_across_sequences")
#: The known-bad drafters the padded-vocabulary law (SD-12's proposals) must reject.
ZOO_PADDED = ("heads_argmax_over_padded_rows",)


@dataclass(frozen=True)
class DraftRound:
    """One call of the drafter in a law's run (its coverage observation): ``context_len`` the
    committed tokens, ``repeats`` whether the context's last 3 tokens occurred before,
    ``has_hidden`` whether the target's hidden state was given, ``room`` the nodes the engine's
    cache had room for; the replayed counts of the round (``task``: "copy" or "free", ``drafted``
    nodes tried, ``accepted``, ``emitted``)."""

    context_len: int
    repeats: bool
    has_hidden: bool
    room: int
    task: str = ""
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0


def fresh_target(device: str = "cpu") -> torch.nn.Module:
    """The shipped target in float64 on ``device``, loaded anew (a drafter that changes its target
    changes this one only)."""
    from inference_conformance.smallworld.checkpoints import load_model

    return load_model("target", torch.float64, device)


@lru_cache(maxsize=None)
def greedy_tokens(prompt: tuple, n_tokens: int) -> tuple:
    """Greedy decoding of the float64 shipped target by full forwards (no cache): ``prompt`` then
    ``n_tokens`` tokens, as a tuple of ids (the laws' oracle)."""
    from inference_conformance.properties.speculative.sd14_cases import sd14_target
    from inference_conformance.reference.transformer import generate

    return tuple(generate(sd14_target(), torch.tensor([prompt]), n_tokens)[0][0].tolist())


#: A padded row's entry: the padded rows of :func:`padded_target` are ±PAD_SCALE times unit vectors.
PAD_SCALE = 100.0


def padded_target(device: str = "cpu") -> torch.nn.Module:
    """The shipped float64 target as a real checkpoint ships it: its output matrix (tied to the
    embedding) padded past the tokenizer's V = ``cfg.vocab_size`` = 294 tokens to the next
    multiple of 64 (320 rows: logits (1, T, 320)), the padded rows ±:data:`PAD_SCALE` times the
    unit vectors of the first 13 hidden dimensions, so that at the final hidden states of the
    laws' contexts a padded row has the largest logit (a drafter's argmax over every row picks an
    id that is no token). ``cfg`` still says V = 294."""
    target = fresh_target(device)
    V, d = target.cfg.vocab_size, target.cfg.d_model
    n_pad = (V // 64 + 1) * 64 - V
    k = torch.arange(n_pad)
    pad = torch.zeros(n_pad, d, dtype=torch.float64)
    pad[k, (k // 2) % d] = PAD_SCALE * (1 - 2 * (k % 2)).double()
    for module in (target.embed, target.head):
        if module is not None:
            w = module.weight
            module.weight = torch.nn.Parameter(torch.cat([w.detach(), pad.to(w)]), requires_grad=w.requires_grad)
    target.embed.num_embeddings = V + n_pad
    return target


def prompt_for(kind: str, seed: int) -> list:
    """A prompt (list of ids): "bos" (<bos> alone), "copy" (validation document ``seed`` % 12
    without its end, then its first 4 tokens again) or "words" (<bos>, 6 random ids drawn from
    ``seed``, then the first 3 of them again)."""
    from inference_conformance.properties.speculative.sd14_cases import copy_prompts
    from inference_conformance.smallworld.tokenizer import tokenizer

    tok = tokenizer()
    if kind == "bos":
        return [tok.bos_id]
    if kind == "copy":
        return copy_prompts(seed % 12 + 1)[seed % 12][0].tolist()
    words = torch.randint(4, tok.vocab_size, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [tok.bos_id] + words + words[:3]


def fingerprint(target) -> dict:
    """What a drafter must leave as it found it in ``target`` (the contract: read, never change):
    its mode, its block list, and each parameter's identity, dtype, device, gradient flag and
    version counter (an in-place change bumps it)."""
    blocks = getattr(target, "blocks", ())
    out = {"training": target.training, "blocks": tuple(id(b) for b in blocks)}
    for name, p in target.named_parameters():
        out[name] = (p.data_ptr(), p.dtype, str(p.device), p.requires_grad, p._version)
    return out


def _changed(before: dict, after: dict) -> str:
    keys = [k for k in before.keys() | after.keys() if before.get(k) != after.get(k)]
    return ", ".join(sorted(keys)[:4]) + (" ..." if len(keys) > 4 else "")


def global_rng_state() -> tuple:
    """torch's and Python's global generators' states (a drafter draws from a generator of its own)."""
    import random

    return torch.get_rng_state(), random.getstate()


class Watched:
    """The drafter ``impl`` as the engine calls it, each call checked by the law (AssertionError
    naming the round, the law's own check): its context, hidden state and target come back
    unchanged (:func:`fingerprint`), torch's and Python's global generators are not drawn from, and
    its tree is well formed; a refusal (NotImplementedError) names the round, and is one only in
    the first round (later it fails: a round with nothing to propose returns nothing). Each call
    is kept in ``calls`` as (context, hidden, parents, tokens, room), the target it was given in
    ``target``."""

    def __init__(self, impl, max_seq_len: int, claim: str):
        self.impl, self.max_seq_len, self.claim, self.calls, self.target = impl, max_seq_len, claim, [], None

    def propose(self, context, hidden, target):
        self.target = target
        before, r = list(context), len(self.calls)
        kept = None if hidden is None else hidden.clone()
        state, rng = fingerprint(target), global_rng_state()
        where = f"round {r} (context of {len(before)} tokens, hidden {'None' if hidden is None else 'given'})"
        claim = self.claim
        try:
            proposal = self.impl.propose(context, hidden, target)
        except NotImplementedError as exc:
            assert not self.calls, (f"{claim}: the drafter refused {where} after drafting in the rounds before "
                                    f"({exc}): a refusal is of a setting, made in the first round; a round with "
                                    "nothing to propose returns ([], [])")
            raise NotImplementedError(f"{where}: {exc}") from None
        assert list(context) == before, (f"{claim}: the drafter changed the context it was given in {where}: "
                                         f"length {len(before)} became {len(context)}; the contract forbids it")
        assert hidden is None or torch.equal(hidden, kept), \
            f"{claim}: the drafter changed the hidden state it was given in {where}; the contract forbids it"
        after = fingerprint(target)
        assert after == state, (f"{claim}: the drafter changed the target in {where} ({_changed(state, after)}): "
                                "a drafter reads the target, never changes it")
        now = global_rng_state()
        assert torch.equal(now[0], rng[0]) and now[1] == rng[1], (
            f"{claim}: the drafter drew from torch's or Python's global generator in {where}: a drafter that "
            "samples draws from a generator of its own, so that it proposes as a function of its arguments")
        try:
            parents, tokens = check_proposal(proposal, target.cfg.vocab_size, who="the drafter")
        except ValueError as exc:
            raise AssertionError(f"{claim}: malformed tree in {where}: {exc}") from None
        self.calls.append((before, kept, parents, tokens, self.max_seq_len - len(before)))
        return parents, tokens


def cache_matches(engine, committed: list) -> None:
    """After a round: the target's cache holds the committed tokens but the pending one, its keys
    and values those of recomputing over exactly those tokens (float64 rule), NaN past them."""
    from inference_conformance.reference.transformer import layer_kv

    m = engine.target
    n = len(committed) - 1
    assert_exact(m.lengths()[:1].cpu(), torch.tensor([n]), what="SD-12: target cache length after the round")
    for layer, (k, v) in enumerate(layer_kv(m.model, torch.tensor([committed[:n]], device=m.device))):
        for name, got, want in (("k", m.cache.k[layer, 0, :, :n], k[0]), ("v", m.cache.v[layer, 0, :, :n], v[0])):
            assert_close(got.cpu(), want.cpu(), what=f"SD-12: layer {layer} cached {name} vs recomputed over the "
                                                     "committed tokens")
        assert bool(torch.isnan(m.cache.k[layer, 0, :, n:n + 8]).all()), \
            "SD-12: cache slots past the committed tokens must be forgotten (NaN)"


def speculate(drafter, prompt: list, n_tokens: int, *, max_seq_len: int, device: str = "cpu", claim: str = "SD-12",
              engine_cls=None, attention: str = "torch", check_cache: bool = True):
    """Greedy tree speculation of a fresh float64 target with ``drafter`` (watched), ``n_tokens``
    after ``prompt``, the cache checked after every round; returns (output ids, engine stats,
    :class:`Watched`). ``engine_cls``: the engine (a known-bad one in its zoo test)."""
    from inference_conformance.optimized.speculative_tree.engine import TreeSpeculativeEngine

    watched = Watched(drafter, max_seq_len, claim)
    engine = (engine_cls or TreeSpeculativeEngine)(fresh_target(device), watched, max_seq_len=max_seq_len,
                                                   attention=attention, nan_fill=True)
    out, stats = engine.generate(torch.tensor([prompt], device=device), n_tokens,
                                 on_round=cache_matches if check_cache else None)
    return out[0].tolist(), stats, watched


def replay(calls: list, want: tuple, task: str = "") -> list:
    """The rounds of greedy tree speculation replayed from the proposals alone: round r tries the
    first ``room`` nodes of its tree; a node is accepted when its token and its ancestors' equal
    greedy decoding ``want`` (prompt and continuation ids) at their depths; the round emits its
    longest accepted path and one more token. Returns one :class:`DraftRound` per call. Raises
    AssertionError when a call's context is not greedy decoding's prefix the rounds before left."""
    rounds, length = [], len(calls[0][0]) if calls else 0
    for r, (ctx, hidden, parents, tokens, room) in enumerate(calls):
        assert tuple(ctx) == want[:length], (f"SD-14: round {r}'s context is not the {length} tokens greedy decoding "
                                             f"and the earlier rounds committed")
        n = min(len(tokens), room)
        depth: dict = {-1: 0}
        for i in range(n):
            ok = parents[i] in depth and length + depth[parents[i]] < len(want) \
                and tokens[i] == want[length + depth[parents[i]]]
            if ok:
                depth[i] = depth[parents[i]] + 1
        accepted = max(depth.values())
        tail = ctx[-3:]
        repeats = len(ctx) > 3 and any(ctx[s:s + 3] == tail for s in range(len(ctx) - 3))
        rounds.append(DraftRound(len(ctx), repeats, hidden is not None, room, task, n, accepted, accepted + 1))
        length += accepted + 1
    return rounds


def totals(rounds) -> dict:
    """The engine's statistics of ``rounds`` (DraftRound): rounds, emitted, accepted, drafted."""
    rounds = list(rounds)
    return {"rounds": len(rounds), "emitted": sum(r.emitted for r in rounds),
            "accepted": sum(r.accepted for r in rounds), "drafted": sum(r.drafted for r in rounds)}


def invalid_calls(device) -> list:
    """The drafter contract's bad calls on the float64 shipped target (V = 294, d_model = 128)."""
    from inference_conformance.smallworld.checkpoints import load_model

    target = load_model("target", torch.float64, device)
    V, d = target.cfg.vocab_size, target.cfg.d_model
    ok_hidden = torch.zeros(d, dtype=torch.float64, device=device)
    return [
        InvalidCall("empty context", ([], None, target), raises=(ValueError,), argument="context"),
        InvalidCall("context id = V", ([1, 5, V], ok_hidden, target), raises=(ValueError,), argument="context"),
        InvalidCall("negative context id", ([1, -3], ok_hidden, target), raises=(ValueError,), argument="context"),
        InvalidCall("context as a tensor", (torch.tensor([1, 5]), None, target), raises=(TypeError,),
                    argument="context"),
        InvalidCall("context of floats", ([1.0, 5.0], None, target), raises=(TypeError,), argument="context"),
        InvalidCall("hidden of shape (d_model + 1,)", ([1, 5], torch.zeros(d + 1, dtype=torch.float64), target),
                    raises=(ValueError,), argument="hidden"),
        InvalidCall("hidden as a list", ([1, 5], [0.0] * d, target), raises=(TypeError,), argument="hidden"),
        InvalidCall("target not a model", ([1, 5], None, "target"), raises=(TypeError,), argument="target"),
        InvalidCall("hidden of integers", ([1, 5], torch.zeros(d, dtype=torch.int64), target), raises=(ValueError,),
                    argument="hidden"),
        InvalidCall("target without cfg.d_model", ([1, 5], None, _WithoutDModel(V)), raises=(TypeError,),
                    argument="target"),
    ]


class _WithoutDModel:
    """An object with ``cfg.vocab_size`` and no ``cfg.d_model`` (not a target model)."""

    def __init__(self, vocab_size: int):
        import types

        self.cfg = types.SimpleNamespace(vocab_size=vocab_size)
