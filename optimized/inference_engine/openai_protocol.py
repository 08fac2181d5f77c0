"""The OpenAI completions protocol as :class:`.openai_server.OpenAIServer` speaks it: request bodies
in two dialects and the answers read back as :class:`Completion` objects.

* ``"ids"`` (vLLM, SGLang, TGI): ``prompt`` the token ids, and the extensions vLLM and SGLang read:
  ``ignore_eos: true`` (the stop token does not stop generation) and ``return_token_ids: true``.
  The generated ids come from ``choices[0].token_ids``, else from ``logprobs.tokens`` written as
  ``token_id:N`` (vLLM's ``--return-tokens-as-token-ids``).
* ``"text"`` (servers that take text prompts only and refuse unknown fields, such as
  ``transformers serve``: "prompt must be a string", "Unexpected fields in the request"): the
  prompt is the ids' words of the suite's word-level vocabulary joined by spaces (the exported
  folder's ``tokenizer.json`` splits on whitespace, so the server's tokenizer gives the same ids
  back: checked against ``usage.prompt_tokens``), no extension fields, and the generated ids are
  the answer's words mapped through the same vocabulary. The stop token cannot be ignored by a
  request in this dialect: the served folder must have no ``eos_token_id`` (a short answer says so).

Both ask ``logprobs: 0`` (the chosen token's logprob) where logprobs are wanted and read
``logprobs.token_logprobs`` where the server gives them, and read
``usage.prompt_tokens_details.cached_tokens`` (vLLM's ``--enable-prompt-tokens-details``) as the
Completion's ``cached_tokens``.
"""
from __future__ import annotations

import json
from functools import lru_cache

import torch

from inference_conformance.conformance.contracts.inference_engine import Completion

DIALECTS = ("ids", "text")


class ServerError(RuntimeError):
    """A server's answer the suite cannot use (after the retries), in the server's words."""


@lru_cache(maxsize=1)
def vocabulary() -> tuple[tuple[str, ...], dict[str, int]]:
    """(id -> word, word -> id) of the suite's word-level vocabulary (the exported folder's)."""
    from inference_conformance.smallworld.tokenizer import tokenizer

    tok = tokenizer()
    return tuple(tok.itos), dict(tok.stoi)


def text_of(prompt) -> str:
    """The words of token ids ``prompt`` joined by spaces; ValueError naming ``prompt`` for an id
    outside the vocabulary."""
    itos, _ = vocabulary()
    bad = [int(t) for t in prompt if not 0 <= int(t) < len(itos)]
    if bad:
        raise ValueError(f"prompt holds ids outside the vocabulary [0, {len(itos)}): {bad[:5]}")
    return " ".join(itos[int(t)] for t in prompt)


def ids_of_text(text: str, url: str) -> list[int]:
    """The ids of the words of ``text`` (an answer); ServerError for a word outside the vocabulary."""
    _, stoi = vocabulary()
    words = text.split()
    unknown = [w for w in words if w not in stoi]
    if unknown:
        raise ServerError(f"the server at {url} answered words outside the served vocabulary ({unknown[:5]}): "
                          "serve the folder `inference-conformance export-model` wrote (or its detokenizer joins "
                          "tokens)")
    return [stoi[w] for w in words]


def body(dialect: str, model: str, prompt, max_tokens: int, temperature: float, top_p: float, seed=None,
         logprobs: bool = True) -> dict:
    """One ``/v1/completions`` request body in ``dialect`` (module docstring)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
    out = {"model": model, "prompt": list(prompt) if dialect == "ids" else text_of(prompt),
           "max_tokens": max_tokens, "temperature": float(temperature)}
    if temperature > 0:
        out["top_p"] = float(top_p)
    if dialect == "ids":
        out |= {"top_p": out.get("top_p", 1.0), "ignore_eos": True, "return_token_ids": True}
    if logprobs:
        out["logprobs"] = 0
    if seed is not None:
        out["seed"] = seed
    return out


def words(answer) -> str:
    """The server's words in an error answer (``error.message``, ``detail``, or the answer)."""
    err = answer.get("error", answer.get("detail", answer)) if isinstance(answer, dict) else answer
    if isinstance(err, dict):
        err = err.get("message", err)
    return str(err)[:500]


def short(request: dict) -> str:
    """A request body for an error message, its prompt as its length."""
    return json.dumps({k: v for k, v in request.items() if k != "prompt"} | {"prompt_len": len(request["prompt"])})


def parse(answer: dict, url: str, dialect: str = "ids") -> tuple[list[int], list[float] | None, int | None]:
    """(generated ids, their logprobs or None, cached prompt tokens or None) of one answer."""
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ServerError(f"{url}/completions answered without choices: {words(answer)}") from None
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    tokens = lp.get("tokens") or []
    if ids is None and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    if ids is None and dialect == "text":
        ids = ids_of_text(choice.get("text") or "", url)
    if ids is None:
        raise ServerError(f"the server at {url} returns no token ids (no choices[0].token_ids, no logprobs "
                          "tokens as token_id:N): start vLLM with --return-tokens-as-token-ids")
    logprobs = lp.get("token_logprobs")
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return [int(x) for x in ids], None if logprobs is None else [float(x) for x in logprobs], cached


def completion(answer: dict, max_new_tokens: int, url: str, dialect: str = "ids", prompt_len: int | None = None
               ) -> Completion:
    """One answer as a Completion; ServerError where it cannot be judged: fewer tokens than
    ``max_new_tokens`` (the stop token stopped it), or (text dialect) another prompt length read."""
    ids, logprobs, cached = parse(answer, url, dialect)
    read = (answer.get("usage") or {}).get("prompt_tokens")
    if dialect == "text" and prompt_len is not None and read is not None and int(read) != prompt_len:
        raise ServerError(f"the server at {url} answered {read} prompt tokens for the text of {prompt_len} ids: its "
                          "tokenizer is not the exported folder's word-level one, or the answer is another request's")
    if len(ids) != max_new_tokens:
        reason = answer["choices"][0].get("finish_reason")
        if len(ids) < max_new_tokens and reason == "stop":
            fix = ("it does not honour ignore_eos" if dialect == "ids" else
                   "it stops at the stop token (a text-prompt server: serve a folder whose config has no eos_token_id)")
        elif dialect == "text":
            fix = "its text is not one vocabulary word per token (its detokenizer joins, splits or drops tokens)"
        else:
            fix = "it generated another number of tokens than asked"
        raise ServerError(f"the server at {url} returned {len(ids)} tokens for max_tokens={max_new_tokens} "
                          f"(finish_reason {reason!r}): {fix}")
    return Completion(torch.tensor(ids, dtype=torch.int64),
                      None if logprobs is None else torch.tensor(logprobs, dtype=torch.float64),
                      cached_tokens=None if cached is None else int(cached))
