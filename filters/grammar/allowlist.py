"""What a task may name: an allowlist of objects, and of the attribute names it may use on the
values it holds.

A task names an object through an import and an attribute chain (`torch.nn.functional.relu`,
`F.relu`, `from torch import matmul`). The policy resolves each chain, statically, to the object
itself, and only the objects listed here may be named, whatever the spelling: `F.torch` is the
module torch under another name, so `F.torch.get_device_module` is refused as surely as
`torch.get_device_module` is. The list is derived from torch, not typed in:

- tensor functions: what torch dispatches on its tensor arguments
  (`torch.overrides.get_overridable_functions`: torch, torch.nn.functional, torch.linalg,
  torch.fft, torch.special, and torch.Tensor's methods), and their in-place forms;
- what takes no tensor and still only makes or describes one (factories, dtype helpers,
  torch.masked's reductions), named one by one in `MAKERS`;
- layers: torch.nn's public nn.Module classes, nn.Parameter and nn.Buffer;
- nn.init's initialisers (the purity rules keep them out of forward) and math's functions;
- constants: torch's dtypes, memory formats, layouts and numbers, math's numbers;
- an added library's ops, exactly those of the run's catalog (`with_library_ops`).

`EXCLUDED` then takes out, each with its reason, what dispatches on tensors but is no tensor
math: storage and memory, hooks and autograd, device moves, Python callbacks, quantisation and
sparse layouts, modes. Nothing that sets global state is a tensor function, so no global setter
(dtype, seeds, autocast, grad mode, backends, threads, compile, custom ops, hooks,
parametrizations) is on the list, and no module is a value a task can hold.

The objects a task builds at run time (tensors, its modules, lists) are reached by attribute
name: `value_attributes` lists the names a task may use on a value. They are the names of the
listed tensor methods and properties, the few nn.Module methods a layer's code calls, the
attributes torch's own layers give their instances (read from their source), the fields of
torch's named tuples, and the methods of Python's containers; a task's own attribute names are
added by the policy, unless one also names something of a tensor or a module that is not here.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import math
import re
import sys
import types
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.overrides

# The modules a task may import, in the order that gives an object its canonical name.
NAMESPACES = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.linalg", "torch.fft",
              "torch.special", "torch.masked", "math")
DISPATCHING = ("torch", "torch.functional", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special")

# Functions that take no tensor, so torch.overrides does not list them, and only make or describe one.
MAKERS = {
    "torch": ("zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "tensor", "scalar_tensor",
              "rand", "randn", "randint", "randperm", "normal", "rand_like", "randn_like", "randint_like",
              "tril_indices", "triu_indices", "vander", "hann_window", "hamming_window", "blackman_window",
              "bartlett_window", "kaiser_window", "promote_types", "result_type", "can_cast", "broadcast_shapes",
              "finfo", "iinfo", "no_grad", "Tensor", "Size", "dtype"),
    "torch.nn.functional": ("sigmoid", "tanh", "hardsigmoid", "hardswish", "upsample", "upsample_bilinear",
                            "upsample_nearest"),
    "torch.fft": ("fftfreq", "rfftfreq"),
    "torch.masked": ("sum", "prod", "amax", "amin", "argmax", "argmin", "mean", "median", "norm", "var", "std",
                     "softmax", "log_softmax", "softmin", "normalize", "logsumexp", "logaddexp", "cumsum", "cumprod"),
    "torch.nn.init": ("calculate_gain",),
}

# Dispatching on tensors, and still no tensor math: each group with why it is out.
EXCLUDED = {
    # memory a task would read or write around torch's ops, or share with another process
    "storage": ("storage", "untyped_storage", "storage_type", "storage_offset", "data_ptr", "const_data_ptr", "set_",
                "resize", "resize_", "resize_as", "resize_as_", "resize_as_sparse_", "share_memory_", "is_shared",
                "pin_memory", "is_pinned", "record_stream", "is_set_to", "module_load", "numpy", "__dlpack__"),
    # autograd's graph and hooks: code run later, by someone else
    "autograd": ("backward", "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "retains_grad",
                 "grad_fn", "is_leaf", "output_nr", "detach_", "gradient"),
    # a Python function called on each element, writing where no op is recorded
    "callbacks": ("apply_", "map_", "map2_"),
    # the device is the harness's to choose
    "devices": ("cuda", "cpu", "ipu", "xpu", "mtia", "get_device", "to_mkldnn", "dim_order"),
    # quantised and sparse layouts, and their kernels, are not what a task computes
    "layouts": ("dequantize", "int_repr", "q_per_channel_axis", "q_per_channel_scales", "q_per_channel_zero_points",
                "q_scale", "q_zero_point", "qscheme", "to_sparse", "sparse_dim", "sparse_mask", "sparse_resize_",
                "sparse_resize_and_clear_", "coalesce", "is_coalesced", "smm", "sspaddmm", "ccol_indices",
                "col_indices", "crow_indices", "row_indices", "to_dense", "dense_dim", "hash_tensor"),
    # modes and symbolic sizes: questions of how the code runs (a forward that reads `self.training`
    # is another program for a consumer that never calls .eval())
    "modes": ("training", "autocast", "sym_sqrt", "sym_float", "sym_int", "sym_ite", "sym_max", "sym_min", "sym_not", "sym_sum"),
}
EXCLUDED_PREFIXES = ("fbgemm_", "miopen_", "quantize", "quantized_", "fake_quantize", "fused_moving_avg",
                     "batch_norm_backward", "cudnn_", "mkldnn_",
                     # questions of how the code runs: `torch.is_inference(h)` halved a consumer's output
                     # under inference_mode (a red team's)
                     "is_")
# torch.nn classes that are no layer a task builds: lazy ones change on their first call, the
# parallel wrappers move work between devices, ParameterDict's subscript is getattr by key.
EXCLUDED_LAYERS = ("ParameterDict", "DataParallel", "SyncBatchNorm", "Container", "RNNBase", "RNNCellBase",
                   "UninitializedParameter", "UninitializedBuffer")

# nn.Module's own methods a layer's code calls; the rest (train, eval, compile, hooks, state
# dicts, device moves, submodules by a dotted name) is the harness's, or reaches by name.
MODULE_METHODS = ("forward", "parameters", "named_parameters", "buffers", "named_buffers", "children",
                  "named_children", "modules", "named_modules", "register_buffer", "register_parameter",
                  "add_module", "register_module", "apply", "extra_repr", "reset_parameters", "append", "extend",
                  "insert", "flatten_parameters")
# Methods of the Python values a task builds (lists, dicts, tuples, sets, text, sizes, finfo).
CONTAINER_METHODS = ("append", "extend", "insert", "pop", "remove", "index", "count", "reverse", "sort", "copy",
                     "clear", "items", "keys", "values", "get", "update", "setdefault", "add", "discard", "union",
                     "intersection", "difference", "join", "split", "strip", "startswith", "endswith", "replace",
                     "lower", "upper", "numel", "eps", "max", "min", "tiny", "bits", "resolution",
                     "smallest_normal", "real", "imag", "conjugate", "start", "stop", "step")
# nn.RNN, GRU and LSTM name their weights by layer and direction, with a format string.
RNN_WEIGHT = re.compile(r"(weight|bias)_(ih|hh|hr)_l\d+(_reverse)?")


@dataclass(frozen=True, eq=False)
class Allowlist:
    """`objects`: id of each object a task may name -> its canonical dotted name (the first of
    NAMESPACES that holds it); `namespaces`: the modules a task may import or pass through;
    `value_attributes`: the names a task may use on a value."""
    objects: dict
    namespaces: frozenset
    value_attributes: frozenset
    library_ops: frozenset = frozenset()

    def name_of(self, found) -> str | None:
        """The canonical name of an allowed object, or None when it is not allowed."""
        if _is_constant(found):
            return _constant_name(found)
        return self.objects.get(id(found))

    def allows_value_attribute(self, name: str) -> bool:
        return name in self.value_attributes or bool(RNN_WEIGHT.fullmatch(name))

    def with_library_ops(self, names: frozenset[str]) -> "Allowlist":
        return _with_library_ops(self, frozenset(names))


def _is_constant(found) -> bool:
    return isinstance(found, (torch.dtype, torch.memory_format, torch.layout)) or (
        isinstance(found, (int, float, complex)) and not isinstance(found, bool))


def _constant_name(found) -> str:
    return str(found) if isinstance(found, (torch.dtype, torch.memory_format, torch.layout)) else repr(found)


def excluded(name: str) -> bool:
    return name.startswith("_") or any(name in names for names in EXCLUDED.values()) or name.startswith(
        EXCLUDED_PREFIXES)


@lru_cache(maxsize=1)
def allowlist() -> Allowlist:
    """The allowlist without library ops (built once a process: about a second)."""
    import torch.masked  # noqa: F401  (imported by name, so that its functions resolve)

    modules = {name: importlib.import_module(name) for name in NAMESPACES}
    objects: dict[int, str] = {}

    def allow(namespace: str, name: str, found) -> None:
        if found is not None and id(found) not in objects and not excluded(name):
            objects[id(found)] = f"{namespace}.{name}"  # every object lives on in its module or class

    overridable = torch.overrides.get_overridable_functions()
    dispatching = {id(function) for namespace in DISPATCHING
                   for function in overridable.get(importlib.import_module(namespace), ())}
    for namespace in NAMESPACES:  # by identity, so that an alias (torch.special.expit) is found too
        for name, found in vars(modules[namespace]).items():
            if id(found) in dispatching:
                allow(namespace, name, found)
    for namespace, names in MAKERS.items():
        for name in names:
            allow(namespace, name, vars(modules[namespace]).get(name))
    for namespace in ("torch", "torch.nn.functional"):  # torch.relu_, F.relu_: an allowed op, in place
        for name, found in vars(modules[namespace]).items():
            if name.endswith("_") and id(vars(modules[namespace]).get(name[:-1])) in objects:
                allow(namespace, name, found)
    for layer in _layers():
        allow("torch.nn", layer.__name__, layer)
    allow("torch.nn.Transformer", "generate_square_subsequent_mask",  # a mask maker, reached through its class
          inspect.getattr_static(torch.nn.Transformer, "generate_square_subsequent_mask"))
    allow("torch.nn", "Parameter", torch.nn.Parameter)
    allow("torch.nn", "Buffer", torch.nn.Buffer)
    for name, found in vars(torch.nn.init).items():
        if name.endswith("_") and inspect.isfunction(found):
            allow("torch.nn.init", name, found)
    for name, found in vars(math).items():
        if callable(found):
            allow("math", name, found)
    tensor_methods = _tensor_methods(overridable)
    for name in tensor_methods:
        allow("torch.Tensor", name, inspect.getattr_static(torch.Tensor, name, None))
    attributes = (set(tensor_methods) | set(MODULE_METHODS) | set(CONTAINER_METHODS) | _layer_attributes()
                  | _named_tuple_fields())
    return Allowlist(objects=objects, namespaces=frozenset(NAMESPACES),
                     value_attributes=frozenset(name for name in attributes if not excluded(name)))


def _tensor_methods(overridable) -> list[str]:
    """The names of torch.Tensor's methods and properties that dispatch on the tensor (found by
    identity, so that aliases count), and the `new_*` makers (which take sizes, so torch does
    not list them)."""
    dispatching = {id(function) for function in overridable.get(torch.Tensor, ())}
    dispatching |= {id(key) for key in overridable if not isinstance(key, (types.ModuleType, type))}  # properties
    names = {name for name in dir(torch.Tensor) if id(inspect.getattr_static(torch.Tensor, name, None)) in dispatching}
    names |= {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "stride", "unflatten"}
    return sorted(name for name in names if not name.startswith("_"))


def _layers() -> list[type]:
    """torch.nn's public layer classes a task may build: not the lazy ones (they change on their
    first call), nor those EXCLUDED_LAYERS names."""
    return [found for name, found in vars(torch.nn).items() if isinstance(found, type) and issubclass(
        found, torch.nn.Module) and not name.startswith(("Lazy", "_")) and name not in EXCLUDED_LAYERS]


def _layer_classes() -> set[type]:
    """The layers and the torch.nn classes they derive from."""
    return {base for layer in _layers() for base in layer.__mro__ if base.__module__.startswith("torch.nn")}


@lru_cache(maxsize=1)
def _layer_sources() -> tuple[ast.ClassDef, ...]:
    """The source of every class `_layer_classes` holds, each of their files parsed once."""
    by_file: dict[str, set[str]] = {}
    for cls in _layer_classes():
        by_file.setdefault(getattr(sys.modules.get(cls.__module__), "__file__", None) or "", set()).add(cls.__name__)
    found = []
    for path, names in by_file.items():
        try:
            tree = ast.parse(open(path, encoding="utf-8").read())
        except (OSError, SyntaxError):
            continue
        found += [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in names]
    return tuple(found)


def _registered(definition: ast.ClassDef):
    """The names a class registers by `register_buffer("NAME", ...)` or `register_parameter`."""
    for node in ast.walk(definition):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "register_buffer", "register_parameter") and node.args and isinstance(node.args[0], ast.Constant):
            yield str(node.args[0].value)


def _layer_attributes() -> set[str]:
    """What torch's layers keep on their instances, read from their source: `self.NAME = ...`,
    `register_buffer("NAME", ...)`, `__constants__` and the constructor's parameters."""
    names: set[str] = set()
    for cls in _layer_classes():
        names.update(getattr(cls, "__constants__", ()))
        try:
            names.update(inspect.signature(cls.__init__).parameters)
        except (TypeError, ValueError):
            pass
    for definition in _layer_sources():
        names.update(node.attr for node in ast.walk(definition) if isinstance(node, ast.Attribute)
                     and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self")
        names.update(_registered(definition))
    return {name for name in names if isinstance(name, str) and name.isidentifier()} - {"self", "args", "kwargs"}


def _named_tuple_fields() -> set[str]:
    """`torch.max(x, 1).values`, `torch.linalg.svd(a).Vh`: the fields of torch's named tuples."""
    import torch.return_types

    return {field for cls in vars(torch.return_types).values() if isinstance(cls, type)
            for field in getattr(cls, "__match_args__", ()) or ()}


@lru_cache(maxsize=64)
def _with_library_ops(base: Allowlist, names: frozenset[str]) -> Allowlist:
    """The base allowlist and the run's ops from added libraries (`kornia.filters.MedianBlur`):
    each op an object a task may name, and each module on the way to one a namespace."""
    objects = dict(base.objects)
    modules = set(base.namespaces)
    for name in sorted(names):
        found = resolve_import(name)
        if found is None or isinstance(found, types.ModuleType):
            continue
        objects.setdefault(id(found), name)
        parts = name.split(".")
        modules.update(".".join(parts[:end]) for end in range(1, len(parts)))
    return Allowlist(objects=objects, namespaces=frozenset(modules), value_attributes=base.value_attributes,
                     library_ops=names)


def resolve_import(dotted: str):
    """The object an installed package holds at `dotted`, importing its modules; None if there
    is none. Used for the run's own library op names only, never for a task's names."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except Exception:
            continue
        for part in parts[end:]:
            found = getattr(found, part, None)
            if found is None:
                return None
        return found
    return None


# Python's plain data: what their methods return is text, numbers and containers of them, so a
# task's own name that one of them also has (`encode`, `offset`, `center`) reaches nothing.
PLAIN_DATA = (str, bytes, bytearray, int, float, complex, bool, list, tuple, dict, set, frozenset, range, slice)


@lru_cache(maxsize=1)
def foreign_attributes() -> frozenset[str]:
    """Every attribute name of every kind of object a task could come to hold other than its
    own: Python's builtin types and the interpreter's (generators, frames, code, tracebacks,
    functions, properties), torch's (tensors, storages, generators, devices, dtypes, sizes,
    named tuples, autograd nodes, modules) and every class on the allowlist. A task's own
    attribute may not take one of these names unless the allowlist lets a task use it on a
    value anyway: a task that names its own class constant `gi_frame` and its own method
    `storage` could otherwise read them off a generator or a tensor (a red team's route to
    `exec`). Derived, so a kind torch or Python adds is covered when it is listed here."""
    import builtins
    import torch.autograd.graph
    import torch.return_types

    # an exception is never a value a task holds (no try, filters/grammar/policy.py): BaseException's
    # own attributes stand for them, not every subclass's data (SyntaxError's `offset`)
    kinds = [value for value in vars(builtins).values() if isinstance(value, type) and value not in PLAIN_DATA
             and (value is BaseException or not issubclass(value, BaseException))]
    kinds += [value for value in vars(types).values() if isinstance(value, type)]
    kinds += [torch.Tensor, torch.nn.Parameter, torch.Size, torch.dtype, torch.device, torch.finfo, torch.iinfo,
              torch.UntypedStorage, torch.TypedStorage, torch.Generator, torch.autograd.graph.Node, torch.no_grad,
              torch.layout, torch.memory_format, torch.nn.Module, type(torch.nn.Module()), type(iter([])),
              type(iter(())), type(iter({})), type({}.items()), type({}.keys()), type({}.values()),
              type((x for x in ())), type(torch.empty(1).untyped_storage()), type(torch.ones(1).grad_fn)]
    kinds += [value for value in vars(torch.return_types).values() if isinstance(value, type)]
    listed = allowlist()
    kinds += [value for value in _objects_of(listed) if isinstance(value, type)]
    names = {name for kind in kinds for name in dir(kind)}
    names |= set(dir(torch.nn.Module()))  # an instance's own: `training`
    return frozenset(names)


def _objects_of(listed: Allowlist) -> list:
    """The allowlist's classes, looked up where their canonical names say."""
    found = []
    for name in listed.objects.values():
        holder, _, leaf = name.rpartition(".")
        module = sys.modules.get(holder)
        if module is not None:
            found.append(vars(module).get(leaf))
    return found


@lru_cache(maxsize=1)
def tensor_slots() -> frozenset[str]:
    """The names through which a task may set something inside a layer it built: the
    parameters and buffers torch's layers register (read from their source: `weight`, `bias`,
    `running_mean`, `in_proj_weight`, ...) and a tensor's `data`, `requires_grad` and `grad`.
    Nothing else inside a layer is a task's to set: a layer's `activation` is a global function."""
    names = {"data", "requires_grad", "grad"}
    for definition in _layer_sources():
        names.update(_registered(definition))
        names.update(target.attr for node in ast.walk(definition) if isinstance(node, ast.Assign)
                     and isinstance(node.value, ast.Call) and (getattr(node.value.func, "attr", None)
                                                               or getattr(node.value.func, "id", None)) == "Parameter"
                     for target in node.targets if isinstance(target, ast.Attribute))
    return frozenset(name for name in names if name.isidentifier() and not name.startswith("_"))


@lru_cache(maxsize=1)
def private_internals() -> frozenset[str]:
    """The private names of nn.Module, a tensor and every layer on the allowlist: what torch's
    own code calls on a layer (`_conv_forward`), which a task's own private name may not be."""
    names = {name for kind in [torch.nn.Module(), torch.empty(0), *_layers()] for name in dir(kind)}
    return frozenset(name for name in names if name.startswith("_") and not name.startswith("__"))
