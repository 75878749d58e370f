"""The fixed Arrow schemas of the output folder. `ops`, `data_source`, `code` come first,
as in CUDA-Agent-Ops-6K, so existing loaders keep working."""
from __future__ import annotations

import pyarrow as pa

SAMPLE_SCHEMA = pa.schema([
    ("ops", pa.list_(pa.string())),
    ("data_source", pa.string()),
    ("code", pa.string()),
    ("id", pa.string()),
    ("num_ops", pa.int32()),
    ("eager_ms", pa.float64()),
    ("compile_ms", pa.float64()),
    ("device", pa.string()),
    ("kernelbench_max_similarity", pa.float64()),
    ("kernelbench_nearest", pa.string()),
    ("composer", pa.string()),
    ("seed", pa.int64()),
    ("torch_version", pa.string()),
    ("determinism_max_diff", pa.float64()),
    ("compile_max_diff", pa.float64()),
    ("input_sensitivity", pa.float64()),
    ("peak_memory_mb", pa.float64()),
    ("output_max_abs", pa.float64()),
    ("resized", pa.bool_()),
    ("train_mode_agrees", pa.bool_()),
    ("source", pa.string()),
    ("provenance", pa.string()),
])

# What each sample column holds, for the dataset card (every column of SAMPLE_SCHEMA).
SAMPLE_COLUMNS = {
    "ops": "the operators fused into the task, fully qualified, in chain order",
    "data_source": "`<library>#<number of ops>`: the library the task draws on (the non-torch one, if any)",
    "code": "the task: a PyTorch program with `Model`, `get_inputs` and `get_init_inputs` (KernelBench format)",
    "id": "hash of the normalised code; stable across runs",
    "num_ops": "how many operators were fused",
    "eager_ms": "median eager-mode time of one forward call on `device`, in ms",
    "compile_ms": "time `torch.compile` took to compile and run the task once, in ms",
    "device": "where the task was validated and timed (`cuda` or `cpu`)",
    "kernelbench_max_similarity": "highest similarity to any reference (KernelBench) task; empty when not decontaminated",
    "kernelbench_nearest": "the reference task of that highest similarity",
    "composer": "what wrote the task: `template`, or `llm:<model>`",
    "seed": "the run seed; with the composer and provenance it reproduces the task",
    "torch_version": "the torch the task was validated with",
    "determinism_max_diff": "largest difference between two runs on the same weights and inputs",
    "compile_max_diff": "largest difference between eager and compiled outputs",
    "input_sensitivity": "largest output difference between two independent random inputs",
    "peak_memory_mb": "peak device memory of a forward call, in MB (empty on the CPU)",
    "output_max_abs": "the largest magnitude of any output element",
    "resized": "whether opsynth re-sized the task's size constants to bring it to the timing target",
    "train_mode_agrees": "whether the model computes the same in train mode (false: a batch norm's batch statistics; "
                         "build it and call `model.eval()`, as the checks did); empty when not measured",
    "source": "the file or row a re-audited task came from (`opsynth validate`); empty for composed tasks",
    "provenance": "JSON: candidate index, input layout, prompt version and LLM usage, repair history",
}

REJECT_SCHEMA = pa.schema([
    ("ops", pa.list_(pa.string())),
    ("data_source", pa.string()),
    ("code", pa.string()),
    ("id", pa.string()),
    ("num_ops", pa.int32()),
    ("stage", pa.string()),
    ("reason", pa.string()),
    ("detail", pa.string()),
    ("metrics", pa.string()),
    ("composer", pa.string()),
    ("seed", pa.int64()),
    ("source", pa.string()),
    ("provenance", pa.string()),
])

ROWS_PER_SHARD = 50_000
ROW_GROUP_SIZE = 1_000
