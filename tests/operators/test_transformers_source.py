"""The transformers source: layer classes of two families become self-contained seeds whose
inputs come from parameter-name recipes; models, blocks and heads are listed as skipped."""
import random
import re
import subprocess
import sys
import textwrap

import pytest

from operators.catalog import crawl

SEED_CHECK = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)  # one thread's order of sums: how many the machine's load leaves is no property of a seed
    for path in sys.argv[1:]:
        namespace = {}
        exec(open(path).read(), namespace)
        outputs = []
        for _ in range(2):
            torch.manual_seed(0)
            model = namespace["Model"](*namespace["get_init_inputs"]())
            torch.manual_seed(1)
            outputs.append(model(*namespace["get_inputs"]()))
        assert torch.equal(*outputs), path + ": not deterministic"
        assert outputs[0].is_floating_point() and outputs[0].numel() > 0, path
    assert not any(name == "transformers" or name.startswith("transformers.") for name in sys.modules)
    print(len(sys.argv) - 1)
""")


@pytest.fixture(scope="module")
def crawled():
    specs, skipped = crawl(["transformers:llama,bert"])
    return {spec.name: spec for spec in specs}, {skip.name: skip for skip in skipped}


def op(specs, family, name):
    return specs[f"transformers.models.{family}.modeling_{family}.{name}"]


def test_layer_classes_of_each_family_are_runnable(crawled):
    specs, _ = crawled
    assert {"LlamaRMSNorm", "LlamaMLP", "LlamaAttention", "BertSelfOutput", "BertIntermediate"} <= {
        name.rsplit(".", 1)[-1] for name in specs}
    assert all(spec.library == "transformers" and spec.kind == "module" and spec.definitions for spec in specs.values())


def test_models_blocks_and_heads_are_listed_as_not_layer_level(crawled):
    _, skipped = crawled
    for name in ("LlamaDecoderLayer", "LlamaForCausalLM", "BertModel"):
        skip = next(s for n, s in skipped.items() if n.endswith("." + name))
        assert skip.reason == "not_layer_level"


def test_a_random_sample_of_seeds_runs_alone_deterministically_without_transformers(crawled, tmp_path):
    specs, _ = crawled
    sample = random.Random(0).sample(sorted(specs), 6)
    paths = []
    for index, name in enumerate(sample):
        code = specs[name].seed_code
        assert "transformers" not in "\n".join(l for l in code.splitlines() if l.startswith(("import", "from")))
        paths.append(tmp_path / f"seed_{index}.py")
        paths[-1].write_text(code)
    done = subprocess.run([sys.executable, "-c", SEED_CHECK, *map(str, paths)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "6"


def test_position_embeddings_recipe_computes_rotary_tables_from_the_input(crawled):
    attention = op(crawled[0], "llama", "LlamaAttention")
    assert attention.call_args["position_embeddings"].startswith("$=rotary_tables(x, ")
    assert "def rotary_tables(x, rotary_dim)" in attention.definitions
    assert "position_embeddings=rotary_tables(x, " in attention.seed_code
    assert attention.output_item == 0  # attention returns (output, weights): the seed keeps the output


def test_position_ids_recipe_and_a_rotary_table_that_ignores_its_input(crawled):
    from operators.records import InlinedOp
    from operators.transformers_source import transformers_ops

    rotary = next(op for op in transformers_ops(["llama"])
                  if isinstance(op, InlinedOp) and op.class_name == "LlamaRotaryEmbedding")
    assert rotary.call_args == {"position_ids": "$=position_ids(x)"}
    assert "def position_ids(x)" in rotary.definitions
    # its cos/sin depend on positions only: runnable, but never an accepted task
    skipped = crawled[1]["transformers.models.llama.modeling_llama.LlamaRotaryEmbedding"]
    assert skipped.reason == "input_independent"


def test_a_required_mask_is_left_as_none(crawled):
    attention = op(crawled[0], "bert", "BertSelfAttention")
    assert "attention_mask=None" in attention.seed_code or "attention_mask" not in attention.call_args


def test_residual_input_recipe_reuses_the_main_tensor(crawled):
    output = op(crawled[0], "bert", "BertSelfOutput")
    assert output.call_args == {"input_tensor": "$=x"}
    assert "self.bertselfoutput(x, input_tensor=x)" in output.seed_code


def test_config_numbers_become_literal_constructor_arguments_and_choices_literals(crawled):
    specs, _ = crawled
    mlp = op(specs, "llama", "LlamaMLP")
    assert "config" not in mlp.definitions and "ACT2FN" not in mlp.definitions
    assert mlp.init_args == {"hidden_size": 256, "intermediate_size": 512}
    assert "def __init__(self, hidden_size, intermediate_size):" in mlp.definitions
    assert "llamamlp_intermediate_size = 512" in mlp.seed_code
    assert "get_init_inputs():\n    return [llamamlp_hidden_size, llamamlp_intermediate_size]" in mlp.seed_code
    # ACT2FN["silu"] becomes the activation it names: a torch module, or its class inlined too
    activation = re.search(r"self\.act_fn = (nn\.)?(\w+)\(\)", mlp.definitions)
    assert activation and (activation.group(1) or f"class {activation.group(2)}(nn.Module)" in mlp.definitions)
    norm = op(specs, "llama", "LlamaRMSNorm")
    assert norm.init_args == {"hidden_size": "$L"} and "llamarmsnorm_hidden_size = hidden" in norm.seed_code  # sized from the input
