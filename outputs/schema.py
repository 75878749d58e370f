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
    ("resized", pa.bool_()),
    ("source", pa.string()),
    ("provenance", pa.string()),
])

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
