"""The HTTP engine (``optimized/inference_engine/openai_server.py``, ``--engine-url``) against real
servers on 127.0.0.1 (``serve_http.EngineServer``: the reference engine, and the zoo's engines,
behind the OpenAI completions protocol): a correct engine passes the engine laws through HTTP, a
known-bad one is rejected by the same law's comparison, capabilities are what the server answers,
and every failure of the transport says what and where."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("httpx")

from inference_conformance.conformance import registry  # noqa: E402
from inference_conformance.conformance.contracts.inference_engine import Params, Request  # noqa: E402
from inference_conformance.conformance.zoo import expect_rejected  # noqa: E402
from inference_conformance.optimized.inference_engine import openai_protocol, openai_server  # noqa: E402
from inference_conformance.optimized.inference_engine.serve_http import EngineServer  # noqa: E402
from inference_conformance.optimized.inference_engine.suite import load, reference_engine  # noqa: E402
from inference_conformance.optimized.inference_engine.server_process import ServerProcess, ServerStartError, free_port  # noqa: E402
from inference_conformance.properties.inference_engine import cases  # noqa: E402
from inference_conformance.properties.inference_engine.laws import engine as engine_laws  # noqa: E402
from inference_conformance.properties.inference_engine import zoo  # noqa: E402


@pytest.fixture
def served():
    """Start EngineServer(engine) on a free port; stopped however the test ends."""
    servers = []

    def start(engine, text_only=False):
        servers.append(EngineServer(engine, cases.folders()["target"], text_only=text_only).start())
        return servers[-1].url

    yield start
    for s in servers:
        s.stop()


def _impl(url, origin="outside", name=None):
    return registry.from_object("inference_engine", name or url, openai_server.OpenAIServer(url), origin, target=url)


def test_reference_over_http_passes_the_engine_laws(served):
    """EN-1, EN-2 (concurrent requests at drawn arrival times) and KV-2 through HTTP on the reference."""
    impl = _impl(served(reference_engine()))
    for law in (engine_laws.EN1, engine_laws.EN2, engine_laws.KV2):
        run = law(impl, "cpu")
        assert run.ran >= 1 and not run.refused, (law.name, run.refused)


def test_text_only_server_judged_in_the_text_dialect(served):
    """A server refusing id prompts and vLLM's fields (as ``transformers serve`` does) is spoken to
    in text: the probe records the refusal, EN-1 and KV-2 pass on the reference, and a prompt
    the server reads to another length, or an answer outside the vocabulary, is an error."""
    engine = openai_server.OpenAIServer(served(reference_engine(), text_only=True))
    impl = registry.from_object("inference_engine", "text", engine, "outside", target=engine.url)
    for law in (engine_laws.EN1, engine_laws.KV2):
        run = law(impl, "cpu")
        assert run.ran >= 1 and not run.refused, (law.name, run.refused)
    assert engine.dialect == "text" and engine.environment()["probes"]["prompts"].startswith("text (ids refused: HTTP 422")
    assert engine.capabilities().logprobs is False
    answer = {"choices": [{"text": "a ant", "finish_reason": "length"}], "usage": {"prompt_tokens": 4}}
    with pytest.raises(openai_server.ServerError, match="answered 4 prompt tokens for the text of 3 ids"):
        openai_protocol.completion(answer, 2, "u", "text", 3)
    with pytest.raises(openai_server.ServerError, match="outside the served vocabulary"):
        openai_protocol.parse({"choices": [{"text": "the zebraXYZ"}]}, "u", "text")
    short = {"choices": [{"text": "a", "finish_reason": "stop"}]}
    with pytest.raises(openai_server.ServerError, match="no eos_token_id"):
        openai_protocol.completion(short, 2, "u", "text")
    glued = {"choices": [{"text": "a", "finish_reason": "length"}]}
    with pytest.raises(openai_server.ServerError, match="not one vocabulary word per token"):
        openai_protocol.completion(glued, 2, "u", "text")
    with pytest.raises(ValueError, match="dialect"):
        openai_server.OpenAIServer("http://h/v1", dialect="json")


@pytest.mark.parametrize("bad, law", [("Unseeded", "KV2"), ("ProcessedLogprobs", "EN1S")])
def test_zoo_over_http_rejected_by_the_same_law(served, bad, law):
    """A known-bad engine behind the server: its law rejects it through HTTP by its own comparison."""
    impl = _impl(served(getattr(zoo, bad)(load)), origin="zoo", name=f"http_{bad}")
    assert expect_rejected(getattr(engine_laws, law), impl, "cpu")


class _RefusesSeeds(type(reference_engine())):
    def generate(self, requests, params):
        if any(r.seed is not None for r in requests):
            raise NotImplementedError("this engine takes no seed")
        return super().generate(requests, params)


def test_capabilities_are_what_the_server_answers(served):
    eng = openai_server.OpenAIServer(served(_RefusesSeeds(load)))
    caps = eng.capabilities()
    assert caps.seeded_sampling == "none" and caps.logprobs and caps.top_p and caps.batching
    env = eng.environment()
    assert env["probes"]["seed"].startswith("HTTP 400") and "no seed" in env["probes"]["seed"]
    assert env["model"]["id"] == cases.folders()["target"]


def test_server_settings_are_refused_not_faked(served):
    eng = openai_server.OpenAIServer(served(reference_engine()))
    for kw in (dict(prefix_caching=True), dict(chunked_prefill=4), dict(speculative="ngram"), dict(padding="left")):
        with pytest.raises(NotImplementedError, match="server's own setting"):
            eng.generate([Request((1, 5, 6), 2)], cases.params(**kw))
    with pytest.raises(ValueError, match="prompt"):
        eng.generate([Request((1, 10 ** 6), 2)], cases.params())


def test_unreachable_server_fails_after_bounded_retries():
    eng = openai_server.OpenAIServer(f"http://127.0.0.1:{free_port()}/v1", retries=1, timeout=5)
    with pytest.raises(openai_server.ServerError, match="after 2 tries.*ConnectError"):
        eng.capabilities()


@pytest.mark.parametrize("url, match", [("localhost:8000", "http"), ("ftp://h/v1", "http"), (8000, "str")])
def test_bad_url_names_url(url, match):
    with pytest.raises((ValueError, TypeError), match=f"url.*{match}|{match}.*url"):
        openai_server.OpenAIServer(url)


def test_bad_settings_name_themselves():
    with pytest.raises(ValueError, match="dtype"):
        openai_server.OpenAIServer("http://h/v1", dtype="int8")
    with pytest.raises(ValueError, match="retries"):
        openai_server.OpenAIServer("http://h/v1", retries=-1)
    assert openai_server.base_url("http://h:1") == "http://h:1/v1" == openai_server.base_url("http://h:1/v1/")


def test_answers_the_suite_cannot_use_say_why():
    no_ids = {"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0]}}]}
    with pytest.raises(openai_server.ServerError, match="no token ids.*return-tokens-as-token-ids"):
        openai_protocol.parse(no_ids, "http://h/v1")
    as_text = {"choices": [{"logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-1.0, -2.0]}}]}
    assert openai_protocol.parse(as_text, "u")[:2] == ([7, 9], [-1.0, -2.0])
    short = {"choices": [{"token_ids": [7], "finish_reason": "stop"}]}
    with pytest.raises(openai_server.ServerError, match="1 tokens for max_tokens=3.*ignore_eos"):
        openai_protocol.completion(short, 3, "u")
    with pytest.raises(openai_server.ServerError, match="without choices"):
        openai_protocol.parse({"error": "x"}, "u")


def test_server_process_starts_stops_and_says_why_it_did_not():
    """The launcher: health wait, stop of the whole process group; a start-up failure is refused
    only where the configuration check said no, else an error, each with the log's tail."""
    argv = [sys.executable, "-m", "inference_conformance.optimized.inference_engine.serve_http", cases.folders()["target"]]
    with ServerProcess(argv, deadline=120) as proc:
        out = openai_server.OpenAIServer(proc.url).generate([Request((1, 5, 6), 3)], cases.params())
        assert out[0].tokens.numel() == 3
    assert not proc.alive()
    refused = "import sys; print('ValueError: bad budget (create_engine_config)'); sys.exit(1)"
    with pytest.raises(ServerStartError, match="bad budget") as exc:
        ServerProcess([sys.executable, "-c", refused], deadline=60)
    assert exc.value.refused
    with pytest.raises(ServerStartError, match="out of memory") as exc:
        ServerProcess([sys.executable, "-c", "raise MemoryError('out of memory')"], deadline=60)
    assert not exc.value.refused


def test_engine_url_option_runs_the_laws_on_the_server(served, tmp_path):
    """``pytest --engine-url URL`` judges the server as an outside engine and records it; a bad URL,
    and a server that does not answer, is a usage error before any law runs."""
    url = served(reference_engine())
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "--results", str(tmp_path),
           "properties/inference_engine/laws/engine.py", "-k", "en1_greedy", "--engine-url", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(cases.__file__).rsplit("/properties/", 1)[0])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]
    impls = "".join(p.read_text() for p in tmp_path.glob("impls-*.json"))
    assert url in impls and '"probes"' in impls
    bad = subprocess.run(cmd[:-1] + ["localhost:1"], capture_output=True, text=True, timeout=120,
                         cwd=str(cases.__file__).rsplit("/properties/", 1)[0])
    assert bad.returncode == 4 and "url must be an http(s) address" in bad.stderr, bad.stderr[-1000:]
    gone = subprocess.run(cmd[:-1] + [f"http://127.0.0.1:{free_port()}/v1"], capture_output=True, text=True,
                          timeout=120, cwd=str(cases.__file__).rsplit("/properties/", 1)[0])
    assert gone.returncode == 4 and "/v1/models failed after 3 tries" in gone.stderr, gone.stderr[-1000:]


def test_params_are_sent_as_the_protocol_says(served):
    """Temperature, top-p and the seed reach the server: the same seeded request twice repeats, and
    the reference's own sampled tokens are what HTTP returns."""
    eng = openai_server.OpenAIServer(served(reference_engine()))
    req = [Request((1, 5, 6), 6, seed=11, temperature=0.8, top_p=0.9)]
    a, b = eng.generate(req, cases.params()), eng.generate(req, cases.params())
    direct = reference_engine().generate(req, Params(cases.folders()["target"]))
    assert a[0].tokens.tolist() == b[0].tokens.tolist() == direct[0].tokens.tolist()
