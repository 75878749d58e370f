"""A catalog written by several processes at once (each crawling one library into one cache)
is whole, and no writer fails: bench_dedupe's composing pool lost a run to a shared `.tmp`."""
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq

from operators.catalog import read_catalog, write_catalog
from operators.records import SkippedOp


def _write_often(path: str, times: int) -> int:
    skipped = [SkippedOp(name=f"torch.op{i}", library="torch", kind="function", reason="test", detail="")
               for i in range(3000)]
    for _ in range(times):
        write_catalog(Path(path), [], skipped)
    return times


def test_processes_writing_one_catalog_at_once_all_succeed_and_leave_it_whole(tmp_path):
    path = tmp_path / "catalogs" / "catalog-shared.parquet"
    with ProcessPoolExecutor(4) as pool:
        assert sum(pool.map(_write_often, [str(path)] * 4, [25] * 4)) == 100
    assert read_catalog(path) == []  # readable: every row is a skipped op
    assert pq.ParquetFile(path).metadata.num_rows == 3000
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no writer's temporary left behind
