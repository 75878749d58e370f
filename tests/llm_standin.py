"""A stand-in for an OpenAI-compatible LLM service, on 127.0.0.1, for tests only.

POST /v1/chat/completions answers with a task fusing the operators the prompt lists (or,
for a repair prompt, the operators it names), unless a scripted fault comes first. Faults,
taken in order, one per request: "429" (with Retry-After), "500", "hang" (longer than the
client's timeout), "no_code", "bad_interface", "missing_op", "refusal", "endless" (a task whose
forward never ends). Every request is
counted, so a test can assert that a rerun sends none.
"""
from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler

from tests.loopback import LoopbackServer, send_json

MODULES = {"torch.nn.Linear": "nn.Linear(features, features)"}


def fused_task(ops: list[str]) -> str:
    init = "\n".join(f"self.op{i} = {MODULES.get(op, op.replace('torch.nn.', 'nn.') + '()')}"
                     for i, op in enumerate(ops))
    forward = "\n".join(f"x = self.op{i}(x)" for i in range(len(ops)))
    return textwrap.dedent('''\
        import torch
        import torch.nn as nn

        batch_size = 256
        features = 512


        class Model(nn.Module):
            def __init__(self, features):
                super().__init__()
        {init}

            def forward(self, x):
        {forward}
                return x


        def get_inputs():
            return [torch.rand(batch_size, features) * 4 - 2]


        def get_init_inputs():
            return [features]
        ''').format(init=textwrap.indent(init, " " * 8), forward=textwrap.indent(forward, " " * 8))


class LLMStandIn(LoopbackServer):
    def __init__(self, faults: list[str] = (), hang_s: float = 5.0):
        self.faults = list(faults)
        self.hang_s = hang_s
        self.requests = 0
        self.lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with standin.lock:
                    standin.requests += 1
                    fault = standin.faults.pop(0) if standin.faults else None
                standin._answer(self, body, fault)

        return Handler

    def _answer(self, request, body, fault):
        if fault == "429":
            return self._send(request, 429, {"error": {"message": "slow down"}}, {"Retry-After": "0.2"})
        if fault == "500":
            return self._send(request, 500, {"error": {"message": "boom"}})
        if fault == "hang":
            time.sleep(self.hang_s)
            return self._send(request, 500, {"error": {"message": "too late"}})
        prompt = body["messages"][-1]["content"]
        ops = re.findall(r"^- (torch\.[\w.]+)$", prompt, re.M) or [
            op.strip() for op in re.search(r"same operators \(([^)]*)\)", prompt).group(1).split(",")]
        code = fused_task(ops)
        content = {
            None: f"Here is the task.\n```python\n{code}```\n",
            "no_code": "I would fuse them into one kernel.",
            "refusal": "I can't help with that.",
            "bad_interface": "```python\n" + code.replace("def get_inputs", "def make_inputs") + "```",
            "missing_op": "```python\n" + fused_task(ops[:1]) + "```",
            # grammatical, and endless: it holds a sandbox worker until its time limit
            "endless": "```python\n" + code.replace("        return x\n", "        for _ in range(x.shape[0] ** 9):\n"
                                                     "            x = x * 1.0\n        return x\n") + "```",
        }[fault]
        self._send(request, 200, {
            "id": "chatcmpl-standin", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(content) // 4,
                      "total_tokens": (len(prompt) + len(content)) // 4}})

    @staticmethod
    def _send(request, status, payload, headers=None):
        send_json(request, status, payload, headers)
