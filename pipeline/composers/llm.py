"""The LLM composer: an OpenAI-compatible endpoint fuses sampled op tuples into tasks.

One retry layer decides (`retry_delay`, a pure function); the `openai` client's own retries
are off. Answers are cached by a hash of the full request, so a rerun sends nothing it has
sent before. A request that exhausts its retries marks the endpoint down: later requests
fail at once with `endpoint_down`, and the run stops keeping everything finished so far.
"""
from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from filters.checks.registry import repairable
from filters.similarity.score import model_ops
from filters.store import JsonStore
from outputs.retry import retry_after
from operators.records import Candidate, OpSpec, Verdict, task_id
from operators.roles import ROLE_DUTIES, role_of

PROMPTS = Path(__file__).parent.parent / "prompts"
COMPOSE_PROMPT, REPAIR_PROMPT = "compose_v4", "repair_v2"
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
INTERFACE = ("Model", "get_inputs", "get_init_inputs")
# Rejects a model can be asked to fix: the program broke a rule it can change (the sandbox
# checks say which of theirs are; filters/checks/verdicts.py), did not parse or fit the request, or
# kept state in forward (the static check's detail says what to write instead).
REPAIRABLE = repairable() | {"bad_interface", "missing_op", "syntax_error", "impure_forward"}


@dataclass(frozen=True)
class LLMSettings:
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.7
    max_tokens: int = 4096
    timeout_s: float = 120.0
    concurrency: int = 8
    max_attempts: int = 6
    backoff_s: float = 1.0
    repair_rounds: int = 1
    target_ms: float = 3.0


log = logging.getLogger("opsynth")
RETRY_LOG_S = 10.0  # a retry is logged at most this often


class NoApiAnswer(RuntimeError):
    """The endpoint answered, with something other than the OpenAI API's JSON (a web page)."""


class EndpointDown(RuntimeError):
    """The endpoint failed a request through every retry."""


def retry_delay(error: BaseException, attempt: int, settings: LLMSettings) -> float | None:
    """Seconds to wait before retrying `error` (attempt counts from 0), or None to give up.
    Retried: 429 (honouring Retry-After), 5xx, timeouts, dropped connections."""
    import openai

    if attempt + 1 >= settings.max_attempts:
        return None
    if isinstance(error, openai.APIStatusError):
        if error.status_code != 429 and error.status_code < 500:
            return None
        return retry_after(error.response, attempt, settings.backoff_s)
    if not isinstance(error, (openai.APITimeoutError, openai.APIConnectionError)):
        return None
    return retry_after(None, attempt, settings.backoff_s)


class LLMClient:
    """The openai client, built on first use (the composer is pickled to Beam workers)."""

    def __init__(self, settings: LLMSettings, cache: JsonStore):
        self.settings, self.cache = settings, cache
        self._client = None
        self._lock = threading.Lock()
        self.down: str | None = None
        self._said = -RETRY_LOG_S  # when a retry was last logged

    def complete(self, messages: list[dict]) -> tuple[str, dict, bool]:
        """(answer text, token usage, served from cache)."""
        request = {"model": self.settings.model, "messages": messages, "temperature": self.settings.temperature,
                   "max_tokens": self.settings.max_tokens}
        key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        cached = self.cache.get(key)
        if cached is not None:
            return cached["text"], cached["usage"], True
        text, usage = self._send(request)
        self.cache.put(key, {"text": text, "usage": usage, "request": request})
        return text, usage, False

    def _send(self, request: dict) -> tuple[str, dict]:
        for attempt in range(self.settings.max_attempts):
            if self.down:
                raise EndpointDown(self.down)
            try:
                response = self._openai().chat.completions.create(**request)
            except Exception as error:  # classified by retry_delay; anything else is not retried
                delay = retry_delay(error, attempt, self.settings)
                if delay is None:
                    if _is_transient(error):  # named with the address tried: a wrong one is the usual cause
                        self.down = f"{type(error).__name__}: {str(error)[:200]} ({self._openai().base_url})"
                        raise EndpointDown(self.down) from None
                    raise
                self._say_retry(error, attempt, delay)
                time.sleep(delay)
                continue
            if not hasattr(response, "choices"):  # the client hands back a body that was no JSON as text
                raise NoApiAnswer(f"the endpoint answered {str(response)[:80]!r}, not the OpenAI API's JSON")
            usage = response.usage
            text = response.choices[0].message.content or "" if response.choices else ""
            return text, {"prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                          "completion_tokens": getattr(usage, "completion_tokens", 0) or 0}
        raise EndpointDown(self.down or "no answer")

    def _say_retry(self, error: BaseException, attempt: int, delay: float) -> None:
        """A refused connection is retried for minutes: say so, at most every RETRY_LOG_S."""
        with self._lock:
            if time.monotonic() - self._said < RETRY_LOG_S:
                return
            self._said = time.monotonic()
        log.warning("the LLM endpoint failed a request (%s: %s); retry %d of %d in %.1f s", type(error).__name__,
                    str(error)[:120], attempt + 1, self.settings.max_attempts - 1, delay)

    def _openai(self):
        with self._lock:
            if self._client is None:
                import openai
                key = os.environ.get(self.settings.api_key_env) or (
                    "not-needed" if self.settings.base_url or os.environ.get("OPENAI_BASE_URL") else None)
                self._client = openai.OpenAI(base_url=self.settings.base_url, api_key=key,
                                             timeout=self.settings.timeout_s, max_retries=0)
            return self._client


def _hint(error: BaseException) -> str:
    """What to check when the endpoint's answer was no JSON (a web page, a proxy's error)."""
    import openai
    if isinstance(error, (NoApiAnswer, json.JSONDecodeError, openai.APIResponseValidationError)):
        return "; is OPENAI_BASE_URL (llm.base_url) the API root, ending in /v1?"
    return ""


def _is_transient(error: BaseException) -> bool:
    import openai
    return isinstance(error, (openai.APITimeoutError, openai.APIConnectionError)) or (
        isinstance(error, openai.APIStatusError) and (error.status_code == 429 or error.status_code >= 500))


def check_answer(text: str, chosen: tuple[str, ...], catalog: list[OpSpec]) -> tuple[str, tuple[str, ...]] | tuple[None, str, str]:
    """(normalized code, ops the code really uses), or (None, reason, detail)."""
    import libcst as cst

    blocks = CODE_BLOCK.findall(text)
    if not blocks:
        return None, "no_code", "the answer has no ```python code block" + (
            "" if text.strip() else " (it is empty)")
    code = max(blocks, key=len).strip() + "\n"
    try:
        code = cst.parse_module(code).code
        tree = ast.parse(code)
    except (cst.ParserSyntaxError, SyntaxError) as error:
        return None, "bad_interface", f"the code does not parse: {str(error).splitlines()[0][:200]}"
    defined = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    missing = [name for name in INTERFACE if name not in defined]
    if missing:
        return None, "bad_interface", f"the code does not define {', '.join(missing)}"
    # API ops, plus classes the answer defines and instantiates: an op whose source travels
    # with the task (an inlined transformers layer) is used by its class name.
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    instantiated = {node.func.id for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes}
    used_leaves = set(model_ops(tree)) | {name.lower() for name in instantiated}
    leaf = lambda name: name.rsplit(".", 1)[-1].lower().rstrip("_")
    absent = [name for name in chosen if leaf(name) not in used_leaves]
    if absent:
        return None, "missing_op", f"the code does not use {', '.join(absent)}"
    used = tuple(sorted({spec.name for spec in catalog if leaf(spec.name) in used_leaves} | set(chosen)))
    return code, used


class LLMComposer:
    def __init__(self, catalog: list[OpSpec], settings: LLMSettings, cache_dir: Path):
        self.catalog = catalog
        self.by_name = {spec.name: spec for spec in catalog}
        self.settings = settings
        self.name = f"llm:{settings.model}"
        self.client = LLMClient(settings, JsonStore(Path(cache_dir) / "llm"))
        self._refusal_logged = False

    def compose_many(self, jobs: list[dict], run_seed: int) -> list[Candidate | tuple[Candidate, Verdict]]:
        with ThreadPoolExecutor(self.settings.concurrency) as executor:
            return list(executor.map(lambda job: self.compose(job, run_seed), jobs))

    def compose(self, job: dict, run_seed: int) -> Candidate | tuple[Candidate, Verdict]:
        ops = tuple(job["ops"])
        repair = job.get("repair_of")
        template = REPAIR_PROMPT if repair else COMPOSE_PROMPT
        prompt = self._prompt(ops, repair)
        provenance = {"index": job["index"], "prompt_version": template,
                      "prompt_hash": hashlib.sha256(prompt.encode()).hexdigest()[:16],
                      "requested_ops": list(ops), "repair_round": repair["round"] if repair else 0,
                      **({"repair_of": repair["id"]} if repair else {})}
        try:
            text, usage, cached = self.client.complete([{"role": "user", "content": prompt}])
        except EndpointDown as down:
            return self._failed(job, ops, provenance, run_seed, "endpoint_down", f"the endpoint is down: {down}", "")
        except Exception as error:  # a request the endpoint refused for good (400, 401, ...)
            detail = f"{type(error).__name__}: {str(error)[:300]}{_hint(error)}"
            if not self._refusal_logged:  # once: the progress line counts the rest as llm_error
                self._refusal_logged = True
                log.warning("the LLM endpoint failed a request for good: %s", detail)
            return self._failed(job, ops, provenance, run_seed, "llm_error", detail, "")
        provenance.update(usage, cached=cached)
        checked = check_answer(text, ops, self.catalog)
        if checked[0] is None:
            return self._failed(job, ops, provenance, run_seed, checked[1], checked[2], text)
        code, used = checked
        libraries = {self.by_name[n].library for n in used if n in self.by_name} - {"torch"}
        return Candidate(task_id(code), used, f"{sorted(libraries)[0] if libraries else 'torch'}#{len(used)}",
                         code, self.name, run_seed, provenance)

    def _prompt(self, ops: tuple[str, ...], repair: dict | None) -> str:
        if repair:
            return (PROMPTS / f"{REPAIR_PROMPT}.txt").read_text().format(
                stage=repair["stage"], reason=repair["reason"], detail=repair["detail"], code=repair["code"].strip(),
                op_names=", ".join(ops))
        seeds = "\n\n".join(f"# {name}\n```python\n{self.by_name[name].seed_code.strip()}\n```" for name in ops)
        return (PROMPTS / f"{COMPOSE_PROMPT}.txt").read_text().format(
            op_list=op_list(ops), seed_tasks=seeds, target_ms=self.settings.target_ms)

    def _failed(self, job, ops, provenance, run_seed, reason, detail, text):
        candidate = Candidate(f"{self.name}-{job['index']}-{reason}", ops, f"torch#{len(ops)}", text, self.name,
                              run_seed, provenance)
        return candidate, Verdict(candidate.id, "compose", False, reason, detail)


def op_list(ops: tuple[str, ...]) -> str:
    """The ops a prompt asks for, in the order the tuple was drawn (a layer's order), each
    with its role in the layer (operators/roles.py) on the line below its name."""
    return "\n".join(f"- {name}\n  {ROLE_DUTIES[role_of(name)]}" for name in ops)
