"""The serving benchmark's records (``benchmarks/inference_engine/serving.py``) from a load generator's result, as a
history entry the gate reads, and the report's latency-against-throughput figure
(``reports/serving.py``); the load itself runs in the peers-engines environment (vLLM)."""
from __future__ import annotations

import json
import math

import pytest

from inference_conformance.benchmarks.inference_engine import serving
from inference_conformance.conformance.environment import fingerprint
from inference_conformance.perf import history
from inference_conformance.reports import serving as report_serving


def _result(n=6, failed=1):
    ttfts = [0.02 + 0.001 * i for i in range(n)]
    lat = [t + 0.31 for t in ttfts]
    return {"ttfts": ttfts, "latencies": lat, "output_lens": [32] * n, "errors": [""] * (n - failed) + ["boom"] * failed,
            "request_throughput": 3.5, "output_throughput": 112.0, "duration": 1.7}


def test_per_request_times():
    got = serving.per_request(_result())
    assert len(got["ttft"]) == len(got["e2e"]) == len(got["tpot"]) == 5      # the failed request left out
    assert got["tpot"][0] == pytest.approx(0.31 / 31)
    assert got["e2e"][0] == pytest.approx(0.33)


def test_records_form_a_history_entry_of_their_own_series(tmp_path):
    recs = serving.records(_result(), "srv", 4.0, 8, {"input_len": 16, "output_len": 32, "num_prompts": 6})
    recs += serving.records(_result(), "srv", math.inf, 8, {"input_len": 16, "output_len": 32, "num_prompts": 6})
    assert [r["name"] for r in recs[:3]] == [f"serving[srv-rate4-c8]::{m}" for m in ("ttft", "tpot", "e2e")]
    x = recs[0]["extra_info"]
    assert x["failed"] == 1 and x["rate"] == 4.0 and x["p99"] >= x["p50"] and recs[3]["extra_info"]["rate"] == "inf"
    entry = history.make_entry(fingerprint("cpu"), recs, settings={"timer": "vllm-bench-serve"})
    entry["series"] = "serving-" + entry["series"]
    path = history.append(entry, tmp_path)
    assert path.parent.name.startswith("serving-") and history.load(path)["benchmarks"][1]["stats"]["rounds"] == 5
    assert history.newest_series(entry["fingerprint"], tmp_path) != path.parent.name   # never the kernels' series


def test_report_draws_the_newest_serving_entry(tmp_path):
    assert report_serving.plot_latency_throughput(tmp_path, tmp_path / "plots")["file"] is None
    recs = [r for rate in (1.0, 4.0) for r in serving.records(_result(), "srv", rate, 8, {"input_len": 16})]
    entry = history.make_entry(fingerprint("cpu"), recs, settings={"timer": serving_timer()})
    folder = tmp_path / "serving-x"
    folder.mkdir()
    (folder / "20261206T000000-abc.json").write_text(json.dumps(entry))
    got = report_serving.plot_latency_throughput(tmp_path, tmp_path / "plots")
    assert got["file"] == "serving_latency.png" and (tmp_path / "plots" / "serving_latency.png").stat().st_size > 1000
    pts = report_serving.points(entry)["srv"]
    assert [p["rate"] for p in pts] == [1.0, 4.0] and pts[0]["tpot_p50"] == pytest.approx(10.0, rel=0.01)


def serving_timer():
    return report_serving.LOAD_GENERATOR


def test_bad_arguments_say_which(capsys):
    with pytest.raises(SystemExit):
        serving.main(["--url", "http://h:1/v1"])
    assert "--tokenizer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serving.main(["--vllm", "--rates", "0"])
    assert "rate must be > 0" in capsys.readouterr().err
