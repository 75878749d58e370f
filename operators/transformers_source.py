"""The transformers op source: layer-level modules of every model family, made self-contained.

For each family's modeling file, the layer classes (norms, MLPs, attention, embeddings,
rotary embeddings, activations, convolutions, pooling) are built from one small config.
Each class is inlined with its dependencies (operators.inline), the config read as
literals, so its seed runs with torch alone. Forward inputs come from parameter-name
recipes: the main tensor is the chain's `x`; `position_embeddings` and `position_ids` are
computed from `x` by small helpers that travel with the definitions; an optional mask is
left out. Classes that are not layer-level, or cannot be inlined, are listed as skipped.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import logging
import pkgutil
import re
import warnings
from typing import Iterable

import libcst as cst
from torch import nn

from filters.grammar import screen_definitions
from operators.inline import InlineRules, NotSelfContained, inline
from operators.layouts import LAYOUTS
from operators.records import MODULE, InlinedOp, SkippedOp

log = logging.getLogger(__name__)
LIBRARY = "transformers"
HIDDEN = LAYOUTS["sequence"].sizes[-1]      # the config's hidden size is the sequence layout's
CHANNELS = LAYOUTS["image"].sizes[1]
IMAGE = LAYOUTS["image"].sizes[-1]
HEADS = 4
SMALL_CONFIG = {
    "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS // 2, "head_dim": HIDDEN // HEADS, "num_hidden_layers": 2, "vocab_size": 1024,
    "max_position_embeddings": 512, "d_model": HIDDEN, "n_embd": HIDDEN, "n_head": HEADS, "n_layer": 2,
    "n_inner": 2 * HIDDEN, "embed_dim": HIDDEN, "num_heads": HEADS, "encoder_attention_heads": HEADS,
    "decoder_attention_heads": HEADS, "encoder_ffn_dim": 2 * HIDDEN, "decoder_ffn_dim": 2 * HIDDEN,
    "ffn_dim": 2 * HIDDEN, "d_ff": 2 * HIDDEN, "d_kv": HIDDEN // HEADS, "num_channels": CHANNELS,
    "image_size": IMAGE, "patch_size": 8, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": HIDDEN, "shared_expert_intermediate_size": HIDDEN,
}
LAYER_KINDS = re.compile(r"(Norm|MLP|Mlp|FeedForward|FFN|Attention|Embedding|Rotary|Activation|Conv|Pool|"
                         r"Intermediate|SelfOutput|Output$|GLU|Gate$|Router|Experts?$|Act$|Projection$)")
NOT_LAYERS = re.compile(r"(PreTrainedModel|Model$|For[A-Z]\w*$|Encoder$|Decoder$|DecoderLayer$|EncoderLayer$|"
                        r"Layer$|Block$|Stage$|Output[A-Z]\w*$|Head$)")
MAIN_INPUTS = ("hidden_states", "hidden_state", "x", "input", "inputs", "hidden", "input_tensor", "inputs_embeds",
               "embeddings", "pixel_values", "features", "input_features", "tensor")
INIT_RECIPES = {"hidden_size": "$L", "dim": "$L", "embed_dim": "$L", "d_model": "$L", "in_features": "$L",
                "out_features": "$L", "normalized_shape": "$L", "num_channels": "$C", "in_channels": "$C",
                "out_channels": "$C", "channels": "$C", "layer_idx": 0, "num_heads": HEADS, "kernel_size": 3,
                "intermediate_size": 2 * HIDDEN, "num_attention_heads": HEADS, "head_dim": HIDDEN // HEADS}
# Required forward inputs a layer accepts as None (no mask, no cache, no cross-attention) or
# as the main tensor itself (a residual input).
NONE_INPUTS = {"attention_mask", "head_mask", "encoder_hidden_states", "encoder_attention_mask",
               "key_value_states", "past_key_value", "past_key_values", "cache", "layer_head_mask",
               "output_attentions", "cache_position"}
SAME_AS_MAIN = {"input_tensor", "residual"}
HELPERS = {
    "rotary_tables": '''def rotary_tables(x, rotary_dim):
    positions = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2, device=x.device, dtype=torch.float32) / rotary_dim)
    angles = torch.cat((torch.outer(positions, inv_freq),) * 2, dim=-1)[None]
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)''',
    "position_ids": '''def position_ids(x):
    return torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)''',
}


def transformers_ops(families: Iterable[str] | None = None) -> Iterable[InlinedOp | SkippedOp]:
    """Every layer-level class of every family (or of `families`), inlined or skipped."""
    import transformers.models
    from transformers.utils import logging as transformers_logging

    names = sorted(families or (m.name for m in pkgutil.iter_modules(transformers.models.__path__)))
    transformers_logging.set_verbosity_error()  # small configs make it warn about token ids
    with _hub_offline():
        for family in names:
            modeling = _import(f"transformers.models.{family}.modeling_{family}")
            if modeling is None:
                continue
            primary_config = _primary_config(family)
            for cls in _layer_candidates(modeling):
                try:
                    yield _prepare(cls, primary_config)
                except Exception as error:  # one class's oddity (a config that refuses a read) skips only it
                    yield SkippedOp(f"{cls.__module__}.{cls.__name__}", LIBRARY, MODULE, "crawl_error",
                                    f"{type(error).__name__}: {str(error)[:200]}")


@contextlib.contextmanager
def _hub_offline():
    """A few layers (timm backbones) fetch a pretrained config in __init__. The crawl builds
    from small local configs only: offline, such a fetch fails at once instead of retrying
    for a minute on a host without network."""
    from huggingface_hub import constants

    was = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = was


def _import(module_name: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module_name)
    except Exception as error:  # a family without a torch model, or one needing an extra package
        log.debug("skipping %s: %s", module_name, error)
        return None


def _layer_candidates(modeling) -> list[type]:
    return [obj for _, obj in sorted(vars(modeling).items())
            if inspect.isclass(obj) and obj.__module__ == modeling.__name__ and issubclass(obj, nn.Module)]


def _primary_config(family: str):
    module = _import(f"transformers.models.{family}.configuration_{family}")
    from transformers import PretrainedConfig

    configs = [obj for obj in vars(module).values() if inspect.isclass(obj) and issubclass(obj, PretrainedConfig)
               and obj.__module__ == getattr(module, "__name__", None)] if module else []
    configs.sort(key=lambda c: (getattr(c, "model_type", "") != family, c.__name__))
    return configs[0] if configs else None


def _prepare(cls: type, primary_config) -> InlinedOp | SkippedOp:
    name = f"{cls.__module__}.{cls.__name__}"
    skip = lambda reason, detail="": SkippedOp(name, LIBRARY, MODULE, reason, detail)  # noqa: E731
    if NOT_LAYERS.search(cls.__name__) or not LAYER_KINDS.search(cls.__name__):
        return skip("not_layer_level", "a model, block or head rather than a layer")
    init = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    constants = {}
    if any(p.name == "config" for p in init):
        config = _small_config(_config_class(init, primary_config))
        if config is None:
            return skip("no_config", "no configuration class could be built for this family")
        constants["config"] = config
    init_args = {}
    for param in init:
        if param.name == "config":
            continue
        if param.name in INIT_RECIPES:
            init_args[param.name] = INIT_RECIPES[param.name]
        elif param.default is param.empty:
            return skip("unknown_required_arg", param.name)
    inputs = _input_recipes(cls, constants.get("config"))
    if len(inputs) == 2:
        return skip(*inputs)
    call_args, layouts, helpers = inputs
    try:
        inlined = inline(cls, InlineRules(LIBRARY, constants, _is_framework_class, _transformers_hook,
                                          frozenset(NONE_INPUTS), weight_dtype="float32"))
    except NotSelfContained as missing:
        return skip("not_self_contained", f"needs {missing.args[0]}")
    except (cst.ParserSyntaxError, OSError, TypeError) as error:
        return skip("not_self_contained", f"source unavailable: {type(error).__name__}")
    definitions = "\n\n\n".join([inlined.code.rstrip("\n"), *(HELPERS[h] for h in helpers)]) + "\n"
    init_args = {**init_args, **inlined.parameters}  # the config's numbers, as literal constructor arguments
    screened = screen_definitions(definitions)
    if screened:
        return skip("unsafe_source", f"{screened[0]}: {screened[1]}")
    return InlinedOp(name, LIBRARY, cls.__name__, definitions, init_args, call_args, layouts)


def _config_class(init: list[inspect.Parameter], primary_config):
    annotation = next(p.annotation for p in init if p.name == "config")
    from transformers import PretrainedConfig

    if inspect.isclass(annotation) and issubclass(annotation, PretrainedConfig):
        return annotation
    return primary_config


def _small_config(config_class):
    if config_class is None:
        return None
    try:
        accepted = inspect.signature(config_class.__init__).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in accepted.values())
        overrides = {k: v for k, v in SMALL_CONFIG.items() if k in accepted or (takes_any and hasattr(config_class(), k))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = config_class(**overrides)
        config._attn_implementation = "eager"
        return config
    except Exception as error:  # a config that rejects small sizes: its layers are skipped
        log.debug("config %s: %s", config_class.__name__, error)
        return None


def _input_recipes(cls: type, config):
    """(call_args, layouts, helpers) for the forward, or (reason, detail) when no recipe fits."""
    params = [p for p in list(inspect.signature(cls.forward).parameters.values())[1:]
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    main = next((p for p in params if p.name in MAIN_INPUTS), None)
    if main is None:
        return "no_tensor_input", f"forward takes {[p.name for p in params]}"
    call_args, helpers = {}, []
    if params.index(main) != 0 or main.kind == main.KEYWORD_ONLY:
        call_args["__input__"] = main.name
    for param in params:
        if param is main:
            continue
        if param.name == "position_embeddings":
            call_args[param.name] = f"$=rotary_tables(x, {_rotary_dim(config)})"
            helpers.append("rotary_tables")
        elif param.name == "position_ids" and param.default is param.empty:
            call_args[param.name] = "$=position_ids(x)"
            helpers.append("position_ids")
        elif param.default is param.empty and param.name in NONE_INPUTS:
            call_args[param.name] = None
        elif param.default is param.empty and param.name in SAME_AS_MAIN:
            call_args[param.name] = "$=x"
        elif param.default is param.empty:
            return "unknown_required_input", param.name
    layouts = ("image",) if main.name == "pixel_values" else ("sequence", "image")
    return call_args, layouts, helpers


def _rotary_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None) or HIDDEN // HEADS
    return int(head_dim * getattr(config, "partial_rotary_factor", 1.0))


def _is_framework_class(cls: type) -> bool:
    """transformers' own base layers (GradientCheckpointingLayer, ...): nn.Module in a seed."""
    module = cls.__module__
    return module.startswith("transformers.") and not module.startswith("transformers.models.")


def _transformers_hook(node, code: str):
    """ACT2FN["silu"] -> the activation it names; the eager attention interface -> its default;
    transformers' own `is_torchdynamo_compiling()` -> False, as the inliner does for torch's."""
    if isinstance(node, cst.Call) and code.startswith("is_torchdynamo_compiling(") and not node.args:
        return "False", {}
    if isinstance(node, cst.Subscript) and code.startswith(("ACT2FN[", "ACT2CLS[")):
        return _activation(code[code.index("[") + 1:-1])
    if isinstance(node, cst.Call) and code.startswith(("get_activation(",)) and len(node.args) == 1:
        return _activation(cst.Module([]).code_for_node(node.args[0].value))
    if isinstance(node, cst.Call) and code.startswith("ALL_ATTENTION_FUNCTIONS.get_interface(") and len(node.args) == 2:
        if cst.Module([]).code_for_node(node.args[0].value).strip() in ('"eager"', "'eager'"):
            return cst.Module([]).code_for_node(node.args[1].value), {}
    return None


def _activation(key_source: str):
    from transformers.activations import ACT2CLS

    try:
        key = ast.literal_eval(key_source.strip())
        entry = ACT2CLS[key]
    except (ValueError, SyntaxError, KeyError):
        return None
    cls, kwargs = entry if isinstance(entry, tuple) else (entry, {})
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    if cls.__module__.startswith("torch.nn"):
        return f"nn.{cls.__name__}({args})", {}
    return f"{cls.__name__}({args})", {cls.__name__: cls}
