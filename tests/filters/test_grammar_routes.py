"""The routes a red team took past the grammar when it judged names by their spelling, each
moved to every place a task could put it, and what a consumer sees: all refused before any of
the task runs, with the consumer's process as it was. Beside them, the legitimate code that
looks closest, which the allowlist must let through."""
import textwrap

import pytest
import torch

from filters.grammar import static_check
from filters.grammar.allowlist import allowlist
from outputs.load import UnsafeTask, load_task
from tests.conftest import make_task

F = "import torch.nn.functional as F"
# What sets the state of the process that runs a task, or hands it the interpreter: each was
# reachable under another spelling of torch (`F.torch.manual_seed`), or was never listed.
SETTERS = {
    "get_device_module": "get_device_module('cuda')",
    "set_default_dtype": "set_default_dtype(torch.float64)",
    "manual_seed": "manual_seed(0)",
    "compile": "compile(torch.relu)",
    "use_deterministic_algorithms": "use_deterministic_algorithms(False)",
    "set_flush_denormal": "set_flush_denormal(True)",
    "set_autocast_enabled": "set_autocast_enabled('cuda', True)",
    "set_grad_enabled": "set_grad_enabled(False)",
    "set_num_threads": "set_num_threads(1)",
    "set_float32_matmul_precision": "set_float32_matmul_precision('medium')",
    "ParameterDict": "nn.ParameterDict()",
}
# Each spelling of torch a task can write.
SPELLINGS = {
    "torch": ("", "torch."),
    "F.torch": (F, "F.torch."),
    "torch.nn.init.torch": ("", "torch.nn.init.torch."),
    "torch.nn.functional.torch": ("", "torch.nn.functional.torch."),
    "from F import torch": ("from torch.nn.functional import torch as T", "T."),
    "import torch as T": ("import torch as T", "T."),
}
PLACES = ("forward", "__init__", "get_inputs", "get_init_inputs")


def _in_place(place: str, statement: str, header: str) -> str:
    """A task with `statement` run in `place`."""
    if place == "forward":
        return make_task(f"{statement}\nreturn x", header=header)
    if place == "__init__":
        return make_task("return x", init=statement, header=header)
    code = make_task("return x", header=header)
    marker = f"def {place}():\n"
    return code.replace(marker, marker + f"    {statement}\n")


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("setter", sorted(SETTERS))
@pytest.mark.parametrize("place", PLACES)
def test_no_spelling_of_torch_reaches_what_torch_may_not(setter, spelling, place):
    header, prefix = SPELLINGS[spelling]
    call = SETTERS[setter]
    statement = call if call.startswith("nn.") else prefix + call
    verdict = static_check(_in_place(place, f"_ = {statement}", header))
    assert verdict is not None and verdict[0] in ("forbidden_call", "forbidden_import"), (setter, spelling, verdict)


def test_a_module_reached_under_another_name_is_refused_with_its_own_name():
    verdict = static_check(make_task("return F.torch.relu(x)", header=F))
    assert verdict == ("forbidden_call", "line 13: torch.nn.functional.torch is the module torch under another name: "
                                         "name it torch")


ESCAPE = "F.torch.get_device_module('cuda').os.system('touch /tmp/opsynth-marker')"
SIGNATURE = "    def forward(self, x):"


@pytest.mark.parametrize("where, code", [
    ("a default of a method never called", make_task("return x", header=F).replace(
        SIGNATURE, f"    def unused(self, a=torch.relu(torch.zeros(1))):\n        return a\n\n{SIGNATURE}")),
    ("a default of a module-level function", make_task("return x", header="def unused(a=torch.zeros(3).sum()):\n"
                                                                         "    return a\n")),
    ("a keyword-only default", make_task("return x").replace(
        SIGNATURE, f"    def unused(self, *, a=torch.ones(2)):\n        return a\n\n{SIGNATURE}")),
    ("a lambda's default", make_task("return (lambda t, s=torch.ones(1): t * s)(x)")),
    ("a return annotation", make_task("return x").replace(SIGNATURE, "    def forward(self, x) -> torch.zeros(1):")),
    ("an argument's annotation", make_task("return x").replace(SIGNATURE, "    def forward(self, x: torch.ones(1)):")),
    ("a string annotation get_type_hints runs", make_task("return x").replace(
        SIGNATURE, "    def forward(self, x: 'torch.ones(1)'):")),
    ("a string annotation naming a builtin", make_task("return x").replace(
        SIGNATURE, "    def forward(self, x: 'print'):")),
    ("a class-level annotation", make_task("return x").replace(
        "class Model(nn.Module):\n", "class Model(nn.Module):\n    width: torch.ones(1) = 3\n")),
    ("a decorator's argument", make_task("return x").replace(
        SIGNATURE, f"    @torch.no_grad(torch.ones(1))\n{SIGNATURE}")),
    ("a class decorator", make_task("return x").replace("class Model(nn.Module):", "@torch.no_grad()\nclass Model(nn.Module):")),
    ("a base class built by a call", make_task("return x").replace("class Model(nn.Module):",
                                                                   "class Model(nn.Sequential()):")),
    ("module level", make_task("return x", constants="batch_size = 64\nfeatures = 256\nprint(features)")),
])
def test_nothing_runs_when_the_code_is_loaded(where, code):
    """A consumer's exec(row["code"]) runs the module level, class bodies, decorators, defaults
    and annotations: each holds only constants, names and types (filters/grammar/exec_time.py)."""
    verdict = static_check(code)
    assert verdict is not None and verdict[0] == "forbidden_call", (where, verdict)


def test_the_issue_routes_that_ran_at_exec_time_leave_no_marker(tmp_path):
    """The two routes that left markers on the red team's host, through a consumer's loader."""
    marker = tmp_path / "marker"
    escape = ESCAPE.replace("/tmp/opsynth-marker", str(marker))
    default = make_task("return x", header=F).replace(
        SIGNATURE, f"    def unused(self, a={escape}):\n        return a\n\n{SIGNATURE}")
    annotation = make_task("return x", header=F).replace(SIGNATURE, f"    def forward(self, x) -> {escape}:")
    for code in (default, annotation):
        with pytest.raises(UnsafeTask):
            load_task(code)
    assert not marker.exists()


@pytest.mark.parametrize("forward, init", [
    ("return self.lin(x)", "self.lin = nn.Linear(256, 256)\nself.compile(backend=cheat)"),
    ("return self.lin(x)", "self.lin = nn.Linear(256, 256)\nself.lin.compile(backend=cheat)"),
    ("return torch.compile(self.lin, backend=cheat)(x)", "self.lin = nn.Linear(256, 256)"),
    ("return self.lin(x)", "self.lin = nn.Linear(256, 256)\nself.lin.register_forward_hook(cheat)"),
    ("return self.lin(x)", "self.lin = nn.Linear(256, 256)\nself.lin.register_forward_pre_hook(cheat)"),
    ("return self.lin(x)", "self.lin = nn.Linear(256, 256)\n"
                           "torch.nn.utils.parametrize.register_parametrization(self.lin, 'weight', nn.Identity())"),
    ("return self.lin(x)", "self.lin = torch.nn.utils.weight_norm(nn.Linear(256, 256))"),
    ("y = x.clone()\ny.register_hook(cheat)\nreturn y", ""),
])
def test_no_code_of_the_tasks_runs_where_the_checks_do_not_look(forward, init):
    """A compile backend, a hook or a parametrization the task writes runs inside dynamo, or
    around a layer fx keeps whole: none is on the allowlist."""
    header = "def cheat(*args):\n    return None\n"
    verdict = static_check(make_task(forward, init=init, header=header))
    assert verdict is not None and verdict[0] in ("forbidden_call", "forbidden_import"), verdict


@pytest.mark.parametrize("forward, init", [
    ("if self.training:\n    return x * 0\nreturn torch.relu(x)", ""),
    ("return x if self.training else -x", ""),
    ("return x * float(self.lin.training)", "self.lin = nn.Linear(256, 256)"),
    ("return torch.nn.functional.batch_norm(x, self.m, self.v, training=self.training)",
     "self.m = torch.zeros(256)\nself.v = torch.ones(256)"),
    ("return x", "self.training = False"),
    ("return x", "self.train()"),
    ("return x", "self.eval()"),
])
def test_no_task_reads_or_sets_its_mode(forward, init):
    """Every check builds the model and calls .eval(); a consumer that does not runs train
    mode. A forward that branches on the mode would be two programs, one of them unchecked."""
    verdict = static_check(make_task(forward, init=init))
    assert verdict is not None and verdict[0] == "forbidden_call", verdict


@pytest.mark.parametrize("name", ["storage", "numpy", "compile", "register_forward_hook", "cuda", "training", "eval"])
def test_an_own_attribute_named_like_a_refused_one_is_refused(name):
    """A task that names its own method `storage` could call a tensor's through the same name."""
    code = make_task("return x").replace(SIGNATURE, f"    def {name}(self):\n        return 1\n\n{SIGNATURE}")
    assert static_check(code)[0] == "forbidden_call"
    assert static_check(make_task("return x", init=f"self.{name} = 1"))[0] == "forbidden_call"


@pytest.mark.parametrize("forward, init, header", [
    ("return torch.relu(x)", "nn.Module.__init__(self)", ""),
    ("return F.gelu(x) + torch.nn.functional.silu(x)", "", F),
    ("return functional.gelu(x)", "", "from torch.nn import functional"),
    ("return self.lstm(x.unsqueeze(0))[0].squeeze(0) + self.lstm.weight_ih_l0.sum()",
     "self.lstm = nn.LSTM(256, 256)", ""),
    ("return torch.topk(x, 4, dim=1).values + torch.max(x, 1).indices.unsqueeze(1)", "", ""),
    ("return x.clamp(min=torch.finfo(x.dtype).min)", "", ""),
    ("return self.norm(x) * self.norm.weight + self.norm.eps", "self.norm = nn.LayerNorm(256)", ""),
    ("return x.new_zeros(x.shape) + x.unflatten(1, (16, 16)).flatten(1)", "", ""),
    ("return torch.special.expit(x) + torch.linalg.vector_norm(x, dim=1, keepdim=True)", "", ""),
    ("return x.to(torch.float64).to(torch.float32) * math.pi", "", "import math"),
])
def test_the_closest_legitimate_code_passes(forward, init, header):
    assert static_check(make_task(forward, init=init, header=header)) is None


def test_typed_defaults_and_annotations_pass():
    code = make_task("return self.scaled(x)").replace(SIGNATURE, textwrap.indent(textwrap.dedent("""\
        def scaled(self, x: torch.Tensor, scale: float = 2.0, dims: tuple[int, ...] = (1,),
                   dtype: torch.dtype = torch.float32, act=torch.relu) -> 'torch.Tensor':
            return act(x * scale).to(dtype).sum(dims, keepdim=True)

        @torch.no_grad()
        def forward(self, x: torch.Tensor) -> torch.Tensor | None:"""), "    "))
    assert static_check(code) is None


def _global_state() -> dict:
    return {"dtype": torch.get_default_dtype(), "grad": torch.is_grad_enabled(),
            "autocast_cpu": torch.is_autocast_enabled("cpu"), "autocast_cuda": torch.is_autocast_enabled("cuda"),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "seed": torch.initial_seed(),
            "threads": torch.get_num_threads(), "precision": torch.get_float32_matmul_precision(),
            "anomaly": torch.is_anomaly_enabled()}


def test_a_consumer_that_loads_an_attacker_then_a_task_sees_its_own_process():
    """Each setter in each place is refused before any of it runs; the consumer's process state
    is as it was, and a task loaded after them computes what it computes alone."""
    before = _global_state()
    victim = make_task("return torch.relu(self.lin(x))", init="self.lin = nn.Linear(256, 256)")

    def run(code):
        task = load_task(code)
        torch.manual_seed(7)
        model = task.Model(*task.get_init_inputs()).eval()
        torch.manual_seed(8)
        return model(*task.get_inputs())

    alone = run(victim)
    for setter in SETTERS:
        for place in PLACES:
            header, prefix = SPELLINGS["F.torch"]
            with pytest.raises(UnsafeTask):
                load_task(_in_place(place, f"_ = {prefix}{SETTERS[setter]}", header))
    torch.manual_seed(before["seed"])  # this test's own draws reseeded the generator
    assert _global_state() == before
    assert torch.equal(run(victim), alone)
    torch.manual_seed(before["seed"])


def test_the_allowlist_is_derived_and_holds_no_setter():
    listed = allowlist()
    assert 1_000 < len(listed.objects) < 3_000
    names = set(listed.objects.values())
    assert {"torch.relu", "torch.nn.functional.relu", "torch.nn.Linear", "torch.Tensor.add", "torch.zeros",
            "torch.nn.init.kaiming_uniform_", "math.sqrt", "torch.linalg.vector_norm"} <= names
    assert not {name for name in names if name.split(".")[-1].startswith(("set_", "manual_seed", "seed", "compile",
                                                                            "get_device_module", "use_deterministic",
                                                                            "load", "save", "register_"))}


# -- the red team's routes past the first allowlist (each accepted, and effective, before) ----

def _task(model_body: str, init_inputs: str = "return []", header: str = "") -> str:
    return (f"import torch\nimport torch.nn as nn\n{header}\n\nclass Model(nn.Module):\n"
            + textwrap.indent(textwrap.dedent(model_body), "    ")
            + "\n    def forward(self, x):\n        return x\n\n\ndef get_inputs():\n    return [torch.rand(2, 4)]\n\n\n"
            f"def get_init_inputs():\n    {init_inputs}\n")


@pytest.mark.parametrize("where, code", [
    # own class constants named like a generator's and a frame's attributes: exec from builtins
    ("a generator's frame", _task("gi_frame = 0\nf_builtins = 0\n",
                                  "(a for a in [1]).gi_frame.f_builtins.get('exec')('1')\n    return []")),
    ("a frame's globals", _task("gi_frame = 0\nf_globals = 0\n",
                                "(a for a in [1]).gi_frame.f_globals.get('torch')\n    return []")),
    # a method called through its class, with a tensor or a torch class for `self`
    ("a method given a tensor for self", _task(
        "def __init__(self):\n    super().__init__()\n    self.held = 1\n\ndef peek(self):\n    return self.held\n",
        "Model.peek(torch.zeros(4))\n    return []")),
    ("a method given torch.Tensor for self", _task(
        "def __init__(self):\n    super().__init__()\n\ndef install(self):\n    self.relu = torch.Tensor.sigmoid\n",
        "Model.install(torch.Tensor)\n    return []")),
    ("a method kept from its class", _task("def fake(self):\n    return None\n",
                                           "keep = Model.fake\n    return []")),
    ("a constructor given a layer class", _task("def __init__(self):\n    super().__init__()\n",
                                                "Model.__init__(nn.Linear)\n    return []")),
    # a store through an alias of a torch class
    ("an alias of a layer class", _task("def fake(self):\n    return None\n",
                                        "layer = nn.Linear\n    layer.reset_parameters = None\n    return []")),
    ("a class held by self", _task("def __init__(self):\n    super().__init__()\n    self.kind = nn.Linear\n"
                                   "    self.kind.reset_parameters = None\n")),
    ("a class in a list held by self", _task("def __init__(self):\n    super().__init__()\n    self.kinds = list([nn.Linear])\n"
                                             "    self.kinds[0].reset_parameters = None\n")),
    # an own private name that is a module's or a tensor's internal, and one read off a module
    ("a private internal defined", _task("def _apply(self, fn):\n    return self\n")),
    ("a module-level function named like a tensor's internal",
     _task("def peek(self):\n    return self._typed_storage()\n", header="\ndef _typed_storage():\n    return None\n")),
])
def test_the_red_teams_routes_to_the_interpreter_are_refused(where, code):
    verdict = static_check(code)
    assert verdict is not None and verdict[0] == "forbidden_call", (where, verdict)


@pytest.mark.parametrize("constant", ["9 ** 9 ** 9", "math.factorial(10 ** 7)", "[0] * 10 ** 9", "1 << 10 ** 6",
                                      "(2 ** 200) ** 2", "math.comb(10 ** 6, 5000)"])
def test_loading_the_code_computes_nothing_large(constant):
    """A constant the module computes when it loads is computed here first, within bounds:
    `math.factorial(10 ** 7)` kept a consumer's loader busy past the red team's time limit."""
    code = make_task("return x", constants=f"batch_size = 64\nfeatures = 256\nN = {constant}", header="import math")
    verdict = static_check(code)
    assert verdict is not None and verdict[0] == "forbidden_call" and "too large" in verdict[1], verdict
    default = make_task("return x", header="import math").replace(
        SIGNATURE, f"    def unused(self, a={constant}):\n        return a\n\n{SIGNATURE}")
    assert static_check(default) is not None


def test_constants_of_real_sizes_load():
    constants = ("batch_size = 64\nfeatures = 256\nhidden = features * 4\nkernel_sizes = [3, 5] * 2\n"
                 "scale = math.sqrt(features) ** -0.5\nbig = 2 ** 40\nshape = (batch_size, features // 2, 1 << 10)")
    assert static_check(make_task("return x", constants=constants, header="import math")) is None


@pytest.mark.parametrize("forward, init, header", [
    # a random op in what forward reaches, whatever the function's name
    ("return x + self.reset_parameters()", "", ""),
    ("return x + Noise().v", "", "class Noise(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                                 "        self.v = torch.randn(256)\n"),
])
def test_a_random_op_forward_reaches_is_refused_whatever_its_function_is_called(forward, init, header):
    code = make_task(forward, init=init, header=header)
    if "reset_parameters" in forward:
        code = code.replace(SIGNATURE, f"    def reset_parameters(self):\n        return torch.randn(256)\n\n{SIGNATURE}")
    assert static_check(code)[0] == "stochastic_op"


@pytest.mark.parametrize("forward", [
    "for p in self.parameters():\n    p.add_(1.0)\nreturn self.lin(x)",
    "[self.lin.bias][0].mul_(2.0)\nreturn self.lin(x)",
    "ps = list(self.parameters())\nps[0].mul_(2.0)\nreturn self.lin(x)",
    "for m in self.children():\n    m.weight.data.mul_(2.0)\nreturn self.lin(x)",
])
def test_weights_written_through_a_list_or_a_loop_are_refused(forward):
    verdict = static_check(make_task(forward, init="self.lin = nn.Linear(256, 256)"))
    assert verdict is not None and verdict[0] in ("impure_forward", "forbidden_call"), verdict


def test_a_device_handed_to_the_tasks_own_function_is_held_to_the_same_rule():
    """A red team's helper asked `d.index is None` of the device forward handed it: 1,000 times
    the output on the CPU, once on a GPU."""
    helper = "    def gain(self, d):\n        return 1000.0 if d.index is None else 1.0\n\n"
    code = make_task("return x * self.gain(x.device)").replace(SIGNATURE, helper + SIGNATURE)
    assert static_check(code)[0] == "impure_forward"
    passing = "    def zeros(self, n, device):\n        return torch.zeros(n, device=device)\n\n"
    assert static_check(make_task("return x + self.zeros(256, x.device)").replace(SIGNATURE, passing + SIGNATURE)) is None


def test_input_reads_no_consumers_terminal():
    assert static_check(_task("", "input('password? ')\n    return []"))[0] == "forbidden_call"
    assert static_check(make_task("return self.scaled(x)").replace(
        SIGNATURE, f"    def scaled(self, input):\n        return input * 2\n\n{SIGNATURE}")) is None


# -- a second red team's routes, past the fixes above ----------------------------------------

@pytest.mark.parametrize("statement", [
    "for torch.allclose in [max]:\n    pass",
    "for torch.Tensor.relu in [torch.Tensor.tanh]:\n    pass",
    "for a, torch.Tensor.add in [(1, torch.Tensor.sub)]:\n    pass",
    "_ = [0 for torch.relu in [torch.tanh]]",
    "_ = {0 for torch.Size in [tuple]}",
    "with torch.no_grad() as torch.relu:\n    pass",
    "for nn.init.kaiming_uniform_ in [nn.init.zeros_]:\n    pass",
])
def test_every_target_is_a_store(statement):
    """A for's, a with's and a comprehension's target assign as `=` does: `for torch.allclose
    in [always]` made every later comparison of a consumer's agree."""
    verdict = static_check(make_task("return x", init=statement))
    assert verdict is not None and verdict[0] == "forbidden_call", verdict


@pytest.mark.parametrize("init", [
    "self.linear = nn.Linear(4, 4)\nself.linear.kind = nn.Conv2d",
    "self.linear = nn.Linear(4, 4)\nself.linear.kind = 1\nself.linear.kind.reset_parameters = None",
    "self.encoder = nn.TransformerEncoderLayer(8, 2)\nself.encoder.activation.tag = 1",
    "self.linear = nn.Linear(4, 4)\ndel self.linear.forward",
])
def test_inside_a_layer_only_its_tensors_are_set(init):
    verdict = static_check(make_task("return x", init=init))
    assert verdict is not None and verdict[0] == "forbidden_call", verdict


def test_a_layers_weights_are_still_set():
    init = ("self.linear = nn.Linear(256, 256)\nself.linear.weight = nn.Parameter(torch.ones(256, 256))\n"
            "self.linear.bias = None\nself.linear.weight.data = self.linear.weight.data * 0.5\n"
            "self.norm = nn.BatchNorm1d(256)\nself.norm.running_mean = torch.zeros(256)\n"
            "self.layers = nn.ModuleList([nn.Linear(256, 256)])\nself.layers[0].weight.requires_grad = False")
    assert static_check(make_task("return self.norm(self.linear(self.layers[0](x)))", init=init)) is None


@pytest.mark.parametrize("method", ["_conv_forward", "_output_padding", "_check_input_dim", "flatten_parameters"])
def test_a_layers_own_methods_are_not_overridden(method):
    """torch's forward calls them where the purity rules do not look: a red team's
    `_conv_forward` told grad mode apart with a try and an out= write."""
    base = "nn.LSTM(4, 4)" if method == "flatten_parameters" else "nn.Conv2d(3, 4, 3)"
    cls = base.split("(")[0]
    code = (f"import torch\nimport torch.nn as nn\n\n\nclass Model({cls}):\n    def __init__(self):\n"
            f"        super().__init__{base[len(cls):]}\n\n    def {method}(self, *args):\n        return None\n\n\n"
            "def get_inputs():\n    return [torch.rand(1, 3, 8, 8)]\n\n\ndef get_init_inputs():\n    return []\n")
    assert static_check(code)[0] == "forbidden_call"


@pytest.mark.parametrize("forward, header", [
    ("return x * (2 - torch.is_inference(x))", ""),
    ("return x * (2 - is_inference(x))", "from torch import is_inference"),
    ("return x * torch.is_floating_point(x)", ""),
])
def test_torch_is_questions_are_on_no_allowlist(forward, header):
    """A consumer running under inference_mode got half the checks' output."""
    assert static_check(make_task(forward, header=header))[0] == "forbidden_call"


@pytest.mark.parametrize("init", [
    "n = 0\nwhile n >= 0:\n    n = n + 1",
    "for i in range(10 ** 15):\n    pass",
    "self.big = [0] * 10 ** 11",
    "self.big = 9 ** 9 ** 9",
])
def test_constructing_the_model_cannot_be_made_endless(init):
    assert static_check(make_task("return x", init=init))[0] == "forbidden_call"


def test_fair_to_ordinary_layer_code():
    """Own names plain Python data also has (an autoencoder's encode and decode), an RNN's
    flatten_parameters and the Transformer's mask maker."""
    helpers = ("    def encode(self, x):\n        return x * 2\n\n    def decode(self, x):\n        return x / 2\n\n")
    code = make_task("self.rnn.flatten_parameters()\nmask = nn.Transformer.generate_square_subsequent_mask(4)\n"
                     "return self.decode(self.encode(x)) + self.offset + mask.sum()",
                     init="self.rnn = nn.LSTM(256, 256)\nself.offset = 1.0").replace(SIGNATURE, helpers + SIGNATURE)
    assert static_check(code) is None
