"""A batch of traces shares one sandboxed child (filters/sandbox/trace_batch.py): a task that
changes the process for the tasks after it must be seen, wherever in torch it changes it.
Each attack below made a later task's conv or silu trace as something else, unseen by the
batch's guards before they read every torch namespace and the dispatcher."""
import textwrap

import pytest
import torch

VICTIM = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)

        def forward(self, x):
            return F.silu(self.conv(x)).sum(-1)


    def get_inputs():
        return [torch.rand(2, 3, 10, 10)]


    def get_init_inputs():
        return []
    """)

# Each runs when its task loads (an external task has passed no static check).
STEERING = {
    "nn.Conv2d's module global F": """
        import types
        import torch.nn.modules.conv as conv
        conv.F = types.SimpleNamespace(conv2d=lambda x, w, b, *settings: torch.tanh(x[:, :1, 1:-1, 1:-1]).expand(
            -1, w.shape[0], -1, -1))
        """,
    "a global forward hook": """
        import torch.nn.modules.module as module
        module.register_module_forward_hook(
            lambda layer, args, out: torch.sigmoid(out) if type(layer).__name__ == "Conv2d" else None)
        """,
    "a C function F.silu calls": "torch._C._nn.silu = lambda x, *rest: torch.relu(x)",
    "a dispatcher kernel": """
        import torch.nn.modules.module as module
        module.kept = torch.library.Library("aten", "IMPL")
        module.kept.impl("silu", lambda x: torch.ops.aten.relu.default(x), "CPU")
        """,
    "a name new to nn.Conv2d": "nn.Conv2d.__call__ = lambda self, x: torch.sigmoid(self._conv_forward(x, self.weight, self.bias))",
    # a thread could change what later traces read while they run; one running C holds no frame
    "a thread of its own": """
        import threading, time
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        """,
    "a raw thread running C": """
        import _thread, time
        _thread.start_new_thread(time.sleep, (60,))
        """,
}


def steering_task(header: str) -> str:
    return textwrap.dedent("""\
        import torch
        import torch.nn as nn
        {header}

        class Model(nn.Module):
            def forward(self, x):
                return x * 3.0


        def get_inputs():
            return [torch.rand(4, 8)]


        def get_init_inputs():
            return []
        """).format(header=textwrap.dedent(header))


def traced_batch(pool, codes: list[str]) -> dict:
    [result] = pool.run_many([{"code": "", "config": {"trace_batch": codes}}])
    assert result["passed"], result
    return result["metrics"]


def test_a_batch_that_no_task_changed_keeps_every_trace(pool):
    metrics = traced_batch(pool, [VICTIM, VICTIM.replace("(2, 3", "(3, 3")])
    assert metrics["traced"] == 2 and not metrics["steered"], metrics
    assert metrics["op_graph_0"] == metrics["op_graph_1"] == "convolution2d silu sum"


@pytest.mark.parametrize("attack", STEERING)
def test_a_task_that_steers_torch_for_later_tasks_is_seen(pool, attack):
    metrics = traced_batch(pool, [steering_task(STEERING[attack]), VICTIM, VICTIM.replace("(2, 3", "(3, 3")])
    assert metrics["steered"] and metrics["traced"] == 0, metrics



# A task whose model takes seconds to build (four times the limit the test sets, or more): a
# network too large to trace in a trace's time, as some of KernelBench L3 are on 2 cores.
# slow on any machine: 150 products of 512 x 512 took under the 0.5 s limit on a faster CPU
SLOW = VICTIM.replace("super().__init__()", "super().__init__()\n        w, began = torch.rand(512, 512), time.monotonic()\n"
                                            "        while time.monotonic() - began < 5:\n            w = torch.tanh(w @ w)"
                      ).replace("import torch\n", "import time\nimport torch\n", 1)


def test_a_task_that_runs_out_of_its_time_costs_its_batch_no_trace(pool):
    """One slow task had run its batch's child out of time, and every trace of the batch was
    lost. Stopped at its own limit, it is named (`timed_out`), and the batch ends with its
    checks done and the traces before it kept."""
    [result] = pool.run_many([{"code": "", "config": {
        "trace_batch": [VICTIM, SLOW, VICTIM.replace("(2, 3", "(3, 3")], "task_limit_s": 0.5}}])
    assert result["passed"], result
    metrics = result["metrics"]
    assert metrics["timed_out"] == 1 and metrics["traced"] == 1 and not metrics["steered"], metrics
    assert metrics["op_graph_0"] == "convolution2d silu sum" and "op_graph_1" not in metrics



# A model that keeps address space in a reference cycle the collector has not reached (its
# junk moves the cycle to the oldest generation), and a victim that needs what it keeps: a red
# team's 5.8 GiB cycle left a later task's trace too little of the child's 6 GiB limit, and the
# victim was read on the meta device instead, `mm add mul relu mul`, and cached.
HOLDING = steering_task("").replace("    def forward", "    def __init__(self):\n        super().__init__()\n"
                                    "        self.keep = [torch.empty(GIB), self]\n"
                                    "        self.junk = [[i] for i in range(30000)]\n\n    def forward")
NEEDS_MEMORY = steering_task("").replace("    def forward(self, x):\n        return x * 3.0", """\
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8192, 8192)

    def forward(self, x):
        return torch.relu(self.lin(x) * 4.0) * 0.25""").replace("torch.rand(4, 8)", "torch.randn(4, 8192)")


def test_memory_a_task_leaves_in_garbage_costs_the_next_task_in_its_batch_nothing(pool):
    from pipeline.dedupe import shareable
    holding = HOLDING.replace("GIB", "23 << 26")  # 5.75 GiB of float32
    assert shareable([holding, NEEDS_MEMORY]) == ([holding, NEEDS_MEMORY], [])  # no task the policy refuses
    metrics = traced_batch(pool, [holding, NEEDS_MEMORY])
    assert metrics["traced"] == 2 and not metrics["steered"], metrics
    assert metrics["op_graph_0"] == "mul" and metrics["op_graph_1"] == "mm add relu"


def test_a_batch_ends_where_its_tasks_hold_memory_the_collector_cannot_free():
    from filters.sandbox.trace_batch import HELD_BYTES, holds_memory, memory_in_use
    room = memory_in_use()
    assert room > 0  # glibc's mallinfo2: the guard is not off here
    kept = torch.ones(2 * HELD_BYTES // 4)
    assert holds_memory(room)
    del kept
    assert not holds_memory(room)
