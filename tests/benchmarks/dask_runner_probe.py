"""Does Beam's DaskRunner keep a ParDo's tagged outputs apart, and run every sink? It does
neither, which is why opsynth's graph uses no tagged outputs and has one sink
(pipeline/transforms.py).

    pip install "dask[distributed]"
    python -m tests.benchmarks.dask_runner_probe

One ParDo sends even numbers to its main output and odd ones to a tagged output; each goes
to its own text file. The same graph runs on the DirectRunner and on the DaskRunner against
a local cluster of two worker processes, and the two files of each are printed.

With apache-beam 2.77 and dask 2026.8 on this project's CPU machine the DaskRunner wrote no
`even` file at all, and an `odd` file holding all ten numbers. That runner computes only the
graph's last node, and it does not split tagged outputs. It also loses what a DoFn emits in
`finish_bundle` (10 of 1,000 elements in a probe of a buffering DoFn over 8 partitions).
"""
from __future__ import annotations

import os
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"  # Beam knows it only by this full name


class EvenOrOdd(beam.DoFn):
    def process(self, number):
        yield beam.pvalue.TaggedOutput("odd", number) if number % 2 else number


def run(runner_args: list[str]) -> dict[str, list[int] | None]:
    folder = tempfile.mkdtemp(prefix="opsynth-dask-probe-")
    with beam.Pipeline(options=PipelineOptions(runner_args)) as pipeline:
        even, odd = pipeline | beam.Create(range(10)) | beam.ParDo(EvenOrOdd()).with_outputs("odd", main="even")
        for name, numbers in (("even", even), ("odd", odd)):
            (numbers | f"Text{name}" >> beam.Map(str)
             | f"Write{name}" >> beam.io.WriteToText(os.path.join(folder, name), num_shards=1, shard_name_template=""))
    found = {}
    for name in ("even", "odd"):
        path = os.path.join(folder, name)
        found[name] = sorted(int(line) for line in open(path).read().split()) if os.path.exists(path) else None
    return found


def main() -> None:
    from distributed import LocalCluster

    print("DirectRunner", run(["--runner=DirectRunner"]))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        print("DaskRunner  ", run([f"--runner={DASK_RUNNER}", f"--dask_client_address={cluster.scheduler_address}"]))


if __name__ == "__main__":
    main()
