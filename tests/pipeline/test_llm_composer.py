"""The LLM composer against a stand-in OpenAI-compatible server on 127.0.0.1, through the
real `openai` client: faults, bad answers, caching, and a dead endpoint."""
import json
import logging
import os
import subprocess
import sys
from collections import Counter

import openai
import pyarrow.parquet as pq
import pytest

from operators.roles import ANCHOR, COMPUTE_HEAVY, role_of
from pipeline.composers.template import TemplateComposer
from pipeline.composers.llm import LLMComposer, LLMSettings, check_answer, retry_delay
from pipeline.sampling import NoOpsSelected, sample_tuples, select_ops
from tests.llm_standin import LLMStandIn, fused_task

try:  # the HTTP package the installed openai client is built on
    import httpx2 as httpx
except ImportError:
    import httpx

OPS = ["torch.nn.Linear", "torch.nn.ReLU", "torch.nn.GELU"]


@pytest.fixture(scope="module")
def catalog(torch_catalog):
    return select_ops(torch_catalog[0], OPS)


def settings(base_url, **overrides):
    return LLMSettings(**{"model": "standin-1", "base_url": base_url, "concurrency": 1, "backoff_s": 0.05,
                          "timeout_s": 1.0, "max_attempts": 5, **overrides})


def test_faults_are_retried_and_bad_answers_become_rejects_with_reasons(catalog, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    faults = ["429", "500", "hang", "no_code", "bad_interface", "missing_op", "refusal"]
    tuples = [OPS[:2], OPS[1:], [OPS[2], OPS[0]], OPS[:1], [OPS[1], OPS[0]]]
    jobs = [{"index": i, "ops": ops} for i, ops in enumerate(tuples)]
    with LLMStandIn(faults, hang_s=3.0) as llm:
        composer = LLMComposer(catalog, settings(llm.base_url), tmp_path)
        results = composer.compose_many(jobs, run_seed=0)
        assert llm.requests == 8  # the first job retries a 429, a 500 and a timeout, then one request each
    assert [r[1].reason for r in results[:4]] == ["no_code", "bad_interface", "missing_op", "no_code"]
    assert all(r[1].stage == "compose" for r in results[:4])
    last = results[4]
    assert last.ops == ("torch.nn.Linear", "torch.nn.ReLU") and last.composer == "llm:standin-1"
    assert last.provenance["prompt_tokens"] > 0 and last.provenance["prompt_version"] == "compose_v4"


def test_a_rerun_is_served_from_the_cache(catalog, tmp_path):
    jobs = [{"index": i, "ops": ops} for i, ops in enumerate([OPS[:2], OPS[1:], OPS])]
    with LLMStandIn() as llm:
        first = LLMComposer(catalog, settings(llm.base_url, concurrency=3), tmp_path).compose_many(jobs, 0)
        sent = llm.requests
        again = LLMComposer(catalog, settings(llm.base_url, concurrency=3), tmp_path).compose_many(jobs, 0)
        assert sent == 3 and llm.requests == 3
    assert [c.code for c in first] == [c.code for c in again]
    assert all(c.provenance["cached"] for c in again)


def test_an_endpoint_that_stays_down_fails_fast_after_the_first_exhausted_request(catalog, tmp_path):
    with LLMStandIn(["500"] * 10) as llm:
        composer = LLMComposer(catalog, settings(llm.base_url, max_attempts=3), tmp_path)
        results = composer.compose_many([{"index": i, "ops": OPS[:1]} for i in range(4)], 0)
        assert llm.requests == 3  # one request's three attempts; the rest never sent
    assert {r[1].reason for r in results} == {"endpoint_down"}


def test_retry_decisions_are_a_pure_function():
    s = settings("http://x", max_attempts=4, backoff_s=1.0)
    request = httpx.Request("POST", "http://x/v1/chat/completions")

    def status(code, headers=None):
        response = httpx.Response(code, headers=headers or {}, request=request)
        return openai.APIStatusError("e", response=response, body=None)

    assert retry_delay(status(429, {"retry-after": "3"}), 0, s) == 3.0
    assert retry_delay(status(503), 2, s) == 4.0
    assert retry_delay(status(400), 0, s) is None and retry_delay(status(401), 0, s) is None
    assert retry_delay(openai.APITimeoutError(request=request), 0, s) == 1.0
    assert retry_delay(openai.APIConnectionError(request=request), 1, s) == 2.0
    assert retry_delay(status(500), 3, s) is None  # the last attempt
    assert retry_delay(ValueError("bug"), 0, s) is None


def test_answers_are_checked_by_ast_and_record_the_ops_really_used(catalog):
    code = fused_task(["torch.nn.Linear", "torch.nn.ReLU"]).replace("x = self.op1(x)", "x = torch.relu(x)")
    checked = check_answer(f"```python\n{code}```", ("torch.nn.Linear", "torch.nn.ReLU"), catalog)
    assert checked[1] == ("torch.nn.Linear", "torch.nn.ReLU")  # torch.relu counts as ReLU
    assert check_answer("```python\ndef (:\n```", ("torch.nn.ReLU",), catalog)[1] == "bad_interface"
    assert check_answer("", ("torch.nn.ReLU",), catalog)[1] == "no_code"


def test_an_inlined_layer_counts_as_used_when_the_answer_defines_and_builds_it(catalog):
    norm = "transformers.models.llama.modeling_llama.LlamaRMSNorm"
    layer = ("class LlamaRMSNorm(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
             "        self.weight = nn.Parameter(torch.ones(n))\n\n    def forward(self, x):\n"
             "        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n\n\n")
    code = fused_task(["torch.nn.ReLU"])
    built = layer + code.replace("x = self.op0(x)", "x = self.norm(self.op0(x))").replace(
        "super().__init__()", "super().__init__()\n        self.norm = LlamaRMSNorm(256)")
    checked = check_answer(f"```python\n{built}```", (norm, "torch.nn.ReLU"), catalog)
    assert checked[1] == ("torch.nn.ReLU", norm), checked
    unused = check_answer(f"```python\n{layer + code}```", (norm, "torch.nn.ReLU"), catalog)
    assert unused[1] == "missing_op" and "LlamaRMSNorm" in unused[2]


def test_tuples_are_drawn_as_layers_weighted_by_usage_and_never_repeat(torch_catalog):
    catalog = torch_catalog[0]
    mix = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}
    tuples = sample_tuples(catalog, 300, mix, {}, seed=3)
    assert len(set(tuples)) == len(tuples) == 300
    assert tuples == sample_tuples(catalog, 300, mix, {}, seed=3)  # a pure function: reruns agree
    # The template composer's layers, drawn by the template composer (repeats skipped).
    layers = TemplateComposer(catalog, mix, numeric_screen=False, checks_screen=False).compose_many([{"index": i} for i in range(40)], 3)
    assert tuples[:40] == [candidate.ops for candidate in layers]
    longer = [ops for ops in tuples if len(ops) > 1]
    led = [ops for ops in longer if role_of(ops[0]) in COMPUTE_HEAVY or role_of(ops[1]) == ANCHOR]
    assert len(led) >= 0.95 * len(longer)  # a layer leads with its compute-heavy op (padding may go first)
    # The template composer's weights: ops real code calls often lead more layers.
    called = {"torch.nn.Conv2d": 5000, "torch.nn.Linear": 0}
    favoured = Counter(ops[0] for ops in sample_tuples(catalog, 200, {2: 1.0}, {}, seed=4, usage=called))
    assert favoured["torch.nn.Conv2d"] > 2 * favoured["torch.nn.Linear"], favoured
    later = sample_tuples(catalog, 50, mix, {}, seed=3, start=300, drawn=frozenset(tuples))
    assert not set(later) & set(tuples)  # a later round draws none an earlier one did


def test_sampling_stops_when_the_catalog_has_no_new_tuple(torch_catalog):
    small = sample_tuples(select_ops(torch_catalog[0], OPS), 100, {2: 1.0}, {}, seed=0)
    assert 2 <= len(small) == len(set(small)) <= 6  # what three ops allow, then it stops
    assert ("torch.nn.Linear", "torch.nn.ReLU") in small


def test_library_mix_and_op_globs(torch_catalog):
    catalog = list(torch_catalog[0])
    gelu = next(spec for spec in catalog if spec.name == "torch.nn.functional.gelu")
    plugin = [gelu.__class__(**{**gelu.__dict__, "name": "torch.nn.functional.silu", "library": "mylib"})]
    catalog = [spec for spec in catalog if spec.name != plugin[0].name] + plugin
    tuples = sample_tuples(catalog, 200, {2: 1.0}, {"mylib": 0.05}, seed=1)
    led = [t[0].startswith("torch.nn.functional.silu") for t in tuples]
    assert 8 <= sum(led) <= 11  # its share of the draws, to within one
    # the library's ops appear only in the tuples it leads, never as a torch tuple's partner
    assert not any("torch.nn.functional.silu" in t[1:] for t in tuples)
    assert {s.name for s in select_ops(catalog, ["torch.nn.Conv?d"])} == {
        "torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d"}
    with pytest.raises(NoOpsSelected, match="matches no operator"):
        select_ops(catalog, ["nothing.*"])


def test_the_prompt_names_each_ops_role_in_the_layer(catalog, tmp_path):
    composer = LLMComposer(catalog, settings("http://127.0.0.1:9"), tmp_path)
    prompt = composer._prompt(("torch.nn.Linear", "torch.nn.GELU"), None)
    assert "- torch.nn.Linear\n  anchor: the compute-heavy op" in prompt
    assert "- torch.nn.GELU\n  epilogue:" in prompt


@pytest.mark.slow
def test_run_with_the_llm_composer_through_faults_then_a_rerun_sends_nothing(tmp_path, cache_dir):
    faults = ["429", "500", "no_code", "missing_op", "bad_interface", "hang"]
    out = tmp_path / "llm-run"
    with LLMStandIn(faults, hang_s=4.0) as llm:
        env = {**os.environ, "OPENAI_BASE_URL": llm.base_url}
        env.pop("OPENAI_API_KEY", None)
        command = [sys.executable, "-m", "pipeline.cli", "run", "--composer", "llm", "--llm-model", "standin-1",
                   "--ops", ",".join(OPS), "--num-samples", "4", "--max-candidates", "20", "--out", str(out),
                   "--cache-dir", str(cache_dir), "--workers", "2", "--library", "torch",
                   "--config", str(_fast_llm_config(tmp_path))]
        first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        assert first.returncode == 0, first.stderr[-3000:]
        sent = llm.requests
        again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert llm.requests == sent  # the rerun sends zero requests
    samples = pq.read_table(out / "data").to_pylist()
    assert len(samples) >= 4 and all(row["composer"] == "llm:standin-1" for row in samples)
    assert all(set(row["ops"]) <= set(OPS) for row in samples)
    rejects = {row["reason"] for row in pq.read_table(out / "rejects").to_pylist()}
    assert {"no_code", "missing_op", "bad_interface"} <= rejects
    stats = json.loads((out / "stats.json").read_text())
    assert stats["llm"]["tokens_per_accepted"] > 0 and stats["llm"]["answers"] >= stats["composed"] - 1
    assert stats["composed"] == stats["accepted"] + stats["held_back"] + stats["rejected"]


def test_a_fixable_reject_goes_back_with_its_verdict_and_provenance_records_the_round(catalog, tmp_path):
    from types import SimpleNamespace

    from operators.records import Candidate, Verdict
    from pipeline.planning import plan_jobs

    rejected = Candidate("c1", tuple(OPS[:2]), "torch#2", fused_task(OPS[:1]), "llm:standin-1", 0,
                         {"index": 0, "requested_ops": OPS[:2], "repair_round": 0})
    records = [(rejected, Verdict("c1", "compose", False, "missing_op", "the code does not use torch.nn.ReLU"))]
    cfg = SimpleNamespace(composer="llm", llm={"repair_rounds": 1}, op_count_mix={2: 1.0}, library_mix={}, seed=0)
    jobs = plan_jobs(cfg, catalog, records, next_index=1, size=2)
    assert jobs[0]["repair_of"]["id"] == "c1" and jobs[0]["repair_of"]["reason"] == "missing_op"
    assert jobs[0]["index"] == 1 and "repair_of" not in jobs[1]
    with LLMStandIn() as llm:
        [repaired] = LLMComposer(catalog, settings(llm.base_url), tmp_path).compose_many(jobs[:1], 0)
    assert repaired.provenance["repair_of"] == "c1" and repaired.provenance["repair_round"] == 1
    assert repaired.provenance["prompt_version"] == "repair_v2" and set(repaired.ops) == set(OPS[:2])
    records.append((repaired, Verdict(repaired.id, "accepted", True)))
    assert not [job for job in plan_jobs(cfg, catalog, records, 3, 2) if "repair_of" in job]  # repaired once


def _fast_llm_config(tmp_path):
    path = tmp_path / "llm.yaml"
    path.write_text("llm:\n  timeout_s: 2\n  backoff_s: 0.05\n  concurrency: 4\n")
    return path


def test_a_dead_endpoint_ends_the_run_with_a_clear_message_and_keeps_nothing_half_done(tmp_path, cache_dir):
    out = tmp_path / "down"
    env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    config = tmp_path / "down.yaml"
    config.write_text("llm:\n  timeout_s: 1\n  backoff_s: 0.01\n  max_attempts: 2\n")
    command = [sys.executable, "-m", "pipeline.cli", "run", "--composer", "llm", "--llm-model", "m", "--ops",
               ",".join(OPS), "--num-samples", "2", "--out", str(out), "--cache-dir", str(cache_dir),
               "--library", "torch", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 3 and "the LLM endpoint stayed down" in done.stderr
    assert "http://127.0.0.1:9/v1" in done.stderr  # the address it tried
    assert "run the same command again" in done.stderr
    assert "the LLM endpoint failed a request (APIConnectionError" in done.stderr  # the retry said so
    assert "Traceback" not in done.stderr and "HTTP Request:" not in done.stderr  # nor a line per request
    assert json.loads((out / "stats.json").read_text())["composed"] == 0


def test_llm_composer_needs_a_model_and_an_endpoint(tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["run", "--composer", "llm", "--out", str(tmp_path), "--cache-dir", str(tmp_path)]) == 2
    assert "needs a model" in capsys.readouterr().err
    assert main(["run", "--composer", "llm", "--llm-model", "m", "--out", str(tmp_path), "--cache-dir",
                 str(tmp_path)]) == 2
    assert "needs an endpoint" in capsys.readouterr().err


def test_the_prompts_ask_for_inputs_in_each_ops_domain_and_moderate_outputs(catalog, tmp_path):
    composer = LLMComposer(catalog, settings("http://127.0.0.1:9"), tmp_path)
    ops = tuple(spec.name for spec in catalog[:2])
    compose = composer._prompt(ops, None)
    repair = composer._prompt(ops, {"stage": "eager", "reason": "nan_or_inf", "detail": "", "code": "x = 1"})
    for prompt in (compose, repair):
        assert "domain" in prompt and "1e4" in prompt and "torch.eye(n)" in prompt
    assert "well-conditioned" in compose and "atan2 of a computed value" in compose


def test_an_endpoint_that_answers_no_json_gets_a_hint(catalog, tmp_path, caplog):
    """A web page where the API should be (a base URL without /v1, a proxy's login page): the
    hint is in the verdict and, once, in the run's log (not only in `opsynth rejects`)."""
    from http.server import BaseHTTPRequestHandler

    from tests.loopback import LoopbackServer

    class Page(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = b"<html>sign in</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with LoopbackServer(Page) as page:
        composer = LLMComposer(catalog, settings(f"http://127.0.0.1:{page.port}", max_attempts=1), tmp_path)
        with caplog.at_level(logging.WARNING, logger="opsynth"):
            verdicts = [verdict for _, verdict in composer.compose_many([{"index": i, "ops": OPS[:1]} for i in range(3)], 0)]
    assert all(v.reason == "llm_error" and "is OPENAI_BASE_URL (llm.base_url) the API root" in v.detail for v in verdicts)
    said = [record.getMessage() for record in caplog.records if "failed a request for good" in record.getMessage()]
    assert len(said) == 1 and "is OPENAI_BASE_URL (llm.base_url) the API root" in said[0]
