"""The ``drafter`` contract: what proposes the tokens speculative decoding tries (lecture 002 §2 and
§6.6; a draft model's chain or tree, Medusa-style heads, self-speculation, prompt lookup; claims
SD-12, SD-14).

    propose(context, hidden, target) -> (parents, tokens)

Each round of greedy tree speculation asks the drafter for a token tree to try after the
committed tokens; the target scores the tree in one forward and keeps the longest branch whose
every token is its own greedy choice (``speculative_tree`` contract), then emits one more token.

Arguments:

- ``context``: list of int, the committed token ids of the one sequence, prompt first, length
  >= 1, each in [0, V) (V: ``target.cfg.vocab_size``, the tokenizer's vocabulary). The drafter must not change it (the suite
  hands it a list and compares it after the call).
- ``hidden``: None, or a tensor (d_model,) in the target's dtype on its device: the target's final
  hidden state (after its last norm) at the last committed token, where the round before
  computed it; None in the first round. Draft heads, as Medusa's and EAGLE's, draft from it;
  others ignore it. The drafter must not change it (it may be a view of the engine's tensors).
- ``target``: the target model (``inference_conformance.reference.transformer.Transformer``, an
  ``nn.Module`` in eval mode): ``target(tokens)`` with tokens (1, T) int64 on its device gives
  logits (1, T, V_out) in its dtype, V_out >= V the rows of its output matrix (a real
  checkpoint pads them past the tokenizer's vocabulary, to a multiple of 64 or 128: the logits
  past V are no token's, whatever their value); ``target.cfg.vocab_size`` (V), ``target.cfg.d_model``,
  ``target.cfg.n_layers``, ``target.cfg.max_seq_len`` (the positions it was trained on);
  ``target.embed`` (the token embedding, an ``nn.Embedding``), ``target.blocks`` (an
  ``nn.ModuleList`` of its n_layers blocks, run in order between the embedding and
  ``target.norm``), ``target.norm`` (the last norm), ``target.output_weight()`` (the (V_out, d_model)
  output matrix, padded rows included). A drafter may read it (self-speculation runs a shallow copy of the module
  whose ``blocks`` is a new ``nn.ModuleList`` without some blocks, calling the copy as above;
  heads use the output matrix) and must never change it: the same object runs the verification,
  and the suite checks its mode, block list and every parameter (identity, dtype, device,
  gradient flag, in-place version) after each call.

Returns ``(parents, tokens)``, two lists of int of one length n >= 0 (n = 0: propose nothing, a
plain decode step): node i carries token ``tokens[i]`` in [0, V) and hangs under node
``parents[i]``, with ``-1 <= parents[i] < i`` (topological order; -1: a child of the last
committed token). Every token is an id of the tokenizer's vocabulary, below V, never a padded
row of the output matrix even where its logit is the largest (an argmax or top-k runs over the
first V logits). A chain of γ tokens is ``parents = [-1, 0, 1, ..., γ - 2]``. The engine tries
at most the nodes that fit its cache: the first ``room`` of them (a prefix of a topological
order is a tree).

What the proposal may be: anything of that form. What it must not do: change ``context`` or
``target``, or return a malformed tree (lengths that differ, a parent outside [-1, i), a token
outside [0, V)): the suite rejects such a drafter with the round and the offending index
(:func:`check_proposal`). ``propose`` is a function of its arguments: asked twice with the same
context, hidden state and target, it proposes the same tree, whatever it was asked in between (a
cache keyed on the whole context is fine; an index carried from one sequence to the next is not),
and a drafter that samples draws from a generator of its own, seeded from its inputs, never from
torch's or Python's global generator (the suite compares their states around each call), so that
its figures (α, tokens per target call) can be reproduced and compared across runs. The generic
checks of the tensor contracts (inputs unchanged, repeats identical) are these checks here, made
by the laws on every round.

Errors: TypeError naming ``context`` for something that is not a list or tuple of int, naming
``hidden`` for something that is neither None nor a tensor, naming ``target`` for an object
without ``cfg.vocab_size`` and ``cfg.d_model``; ValueError naming ``context`` for an empty context
or an id outside [0, V), naming ``hidden`` for a tensor of another shape than (d_model,) or a
non-floating one. :func:`validate` raises exactly these and a drafter may call it. A drafter may
raise ``NotImplementedError`` for a setting it does not support (a target it cannot draft for):
the suite reports "unsupported", never a pass, naming the round. A refusal is of a setting, so
it comes in the first round of a run or not at all (a later one fails the law). A round a
drafter has nothing for (no hidden state yet, no match) is not a refusal: it proposes nothing,
``([], [])``.

The rules:

- SD-12 (exact): greedy tree speculation with the drafter emits exactly greedy target decoding,
  token for token, and after every round the target's cache holds exactly the committed tokens'
  keys and values; whatever the drafter proposes, only the target decides. Asked on the target
  with its output matrix padded past V (294 tokens, 320 rows) at contexts where a padded row has
  the largest logit, it proposes ids below V only.
- SD-14 (figure): the drafter's α (accepted / drafted) and tokens per target call, on copy
  prompts and in free generation, recorded; the counts the engine reports equal their replay
  from the proposals alone against greedy target decoding (no engine, no cache, no tree
  forward), and asking the drafter again on every recorded round gives the same tree.

Oracle: greedy decoding of the float64 target by full forwards
(``inference_conformance.reference.transformer.generate``). Claims: SD-12, SD-14. Sources: Leviathan
et al. 2023 and Chen et al. 2023 (draft models), Miao et al. 2024 (SpecInfer token trees), Cai et
al. 2024 (Medusa heads), Zhang et al. 2024 (Draft & Verify: self-speculation), Saxena 2023
(prompt lookup decoding).
"""
from __future__ import annotations

import numbers

import torch

from inference_conformance.conformance.coverage import CoverageClass
from inference_conformance.conformance.registry_declarations import Contract


def check_target(target) -> tuple[int, int]:
    """(V, d_model) of ``target``; TypeError naming ``target`` for an object without
    ``cfg.vocab_size`` and ``cfg.d_model`` (ints)."""
    cfg = getattr(target, "cfg", None)
    V, d = getattr(cfg, "vocab_size", None), getattr(cfg, "d_model", None)
    if not isinstance(V, int) or not isinstance(d, int):
        raise TypeError(f"target must be the target model (with cfg.vocab_size and cfg.d_model), got "
                        f"{type(target).__name__}")
    return V, d


def check_context(context, vocab_size: int) -> None:
    """TypeError naming ``context`` for what is not a list or tuple of int; ValueError naming it
    when it is empty or holds an id outside [0, ``vocab_size``)."""
    if not isinstance(context, (list, tuple)):
        raise TypeError(f"context must be a list of token ids (int), got {type(context).__name__}")
    bad = next((x for x in context if not isinstance(x, int) or isinstance(x, bool)), None)
    if bad is not None:
        raise TypeError(f"context must hold token ids (int), got {type(bad).__name__} {bad!r}")
    if not context:
        raise ValueError("context must hold at least one committed token, got an empty list")
    out = next((i for i, x in enumerate(context) if not 0 <= x < vocab_size), None)
    if out is not None:
        raise ValueError(f"context[{out}] = {context[out]} is outside the vocabulary [0, {vocab_size})")


def check_hidden(hidden, d_model: int) -> None:
    """TypeError naming ``hidden`` for what is neither None nor a tensor; ValueError naming it for
    a tensor of another shape than (d_model,) or an integer one."""
    if hidden is None:
        return
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden must be None or a tensor (d_model,), got {type(hidden).__name__}")
    if tuple(hidden.shape) != (d_model,) or not hidden.is_floating_point():
        raise ValueError(f"hidden must be a floating tensor of shape ({d_model},) (d_model), got "
                         f"{hidden.dtype} {tuple(hidden.shape)}")


def validate(context, hidden, target) -> None:
    """The contract's checks of a ``propose`` call, in the order the errors are documented:
    :func:`check_target`, :func:`check_context`, :func:`check_hidden`."""
    V, d = check_target(target)
    check_context(context, V)
    check_hidden(hidden, d)


def check_proposal(proposal, vocab_size: int, who: str = "the drafter") -> tuple[list, list]:
    """The suite's check of what ``propose`` returned: ``(parents, tokens)`` as two lists (or tuples)
    of int (any ``numbers.Integral`` but bool: a NumPy integer passes, a float or a tensor does
    not); ValueError naming ``who`` and the offending index for a result that is not a pair of
    equal-length lists of int, a parent outside [-1, i) or a token outside [0, ``vocab_size``)
    (the tokenizer's V: an id of a padded row of the output matrix is no token)."""
    if not isinstance(proposal, (tuple, list)) or len(proposal) != 2:
        raise ValueError(f"{who} must return (parents, tokens), got {type(proposal).__name__}")
    parents, tokens = proposal
    for name, seq in (("parents", parents), ("tokens", tokens)):
        if not isinstance(seq, (list, tuple)):
            raise ValueError(f"{who} must return (parents, tokens) as two lists of int, got {name} as "
                             f"{type(seq).__name__}")
        bad = next((i for i, x in enumerate(seq) if not isinstance(x, numbers.Integral) or isinstance(x, bool)), None)
        if bad is not None:
            raise ValueError(f"{who} returned {name}[{bad}] = {seq[bad]!r} of type {type(seq[bad]).__name__}: the "
                             "contract asks for int (an integer value, never a float, a bool or a tensor)")
    parents, tokens = [int(p) for p in parents], [int(t) for t in tokens]
    if len(parents) != len(tokens):
        raise ValueError(f"{who} returned {len(parents)} parents for {len(tokens)} tokens")
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"{who} returned parents[{i}] = {p}: a node's parent must be -1 (the last committed "
                             f"token) or an earlier node, -1 <= parents[i] < i")
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab_size:
            raise ValueError(f"{who} returned tokens[{i}] = {t}, outside the vocabulary [0, {vocab_size}) (the "
                             "tokenizer's: an output matrix's padded rows past it are no token)")
    return parents, tokens


CONTRACT = Contract(
    technique="drafter",
    functions=("propose",),
    doc=__doc__,
    returns={"propose": (tuple, list)},
)
# The bad calls need the target model, a layer above this one: they are
# inference_conformance.properties.drafter.cases.invalid_calls, which the bad-input law finds by the technique's name.


# ----------------------------------------------------------------------------------------------
# coverage table: observations are the laws' rounds (properties/drafter/cases.py DraftRound:
# context_len, repeats (the context holds an earlier copy of its last 3 tokens), has_hidden,
# room (the nodes the engine's cache had room for))
# ----------------------------------------------------------------------------------------------

#: The laws that hand a drafter its rounds.
_LAWS = ("law_greedy_drafts_emit_greedy_decoding", "law_figures_replay_from_the_proposals")


def _coverage() -> tuple:
    return (
        CoverageClass("a one-token context (a <bos>-only prompt's first round)", _LAWS, lambda r: r.context_len == 1),
        CoverageClass("a round without the target's hidden state (the first)", _LAWS, lambda r: not r.has_hidden),
        CoverageClass("a round with the target's hidden state", _LAWS, lambda r: r.has_hidden),
        CoverageClass("a context whose last 3 tokens occurred before (a copy prompt)", _LAWS, lambda r: r.repeats),
        CoverageClass("a round with room for fewer than 4 nodes in the cache (its end: a longer tree is cut)", _LAWS,
                      lambda r: r.room < 4),
    )


#: The drafter contract's coverage table (see :class:`CoverageClass`).
COVERAGE = _coverage()
