"""Shared fixtures: one crawl and one warm sandbox pool for the whole session."""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
import textwrap

# A fresh `datasets` cache for every session: the machine's own cache outlives sessions, and
# pytest reuses temporary paths, so a cached load of an earlier session's folder could answer.
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="opsynth-test-hf-datasets-")
atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], True)

import pytest

from filters.sandbox.pool import SandboxOptions, WorkerPool
from operators.catalog import crawl


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("opsynth-cache")


@pytest.fixture(scope="session")
def torch_catalog():
    specs, skipped = crawl(["torch"])
    return specs, skipped


def sandbox_options(cache_dir, **overrides) -> SandboxOptions:
    defaults = dict(device="cpu", timeout_s=120, max_memory_gb=6, threads=1,
                    log_path=str(cache_dir / "workers.log"))
    return SandboxOptions(**{**defaults, **overrides})


@pytest.fixture(scope="session")
def pool(cache_dir):
    with WorkerPool(2, sandbox_options(cache_dir)) as shared:
        yield shared


def make_task(forward: str, *, init: str = "", inputs: str = "[torch.rand(batch_size, features)]",
              constants: str = "batch_size = 64\nfeatures = 256", header: str = "") -> str:
    """A tiny task in the KernelBench format; `forward` is the body of Model.forward(x)."""
    return textwrap.dedent("""\
        import torch
        import torch.nn as nn
        {header}
        {constants}


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
        {init}
            def forward(self, x):
        {forward}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return []
        """).format(header=header, constants=constants, inputs=inputs,
                    init=textwrap.indent(textwrap.dedent(init), " " * 8) or "",
                    forward=textwrap.indent(textwrap.dedent(forward), " " * 8))


def interruptible() -> None:
    """Popen's preexec_fn for a command a test interrupts with SIGINT, as Ctrl-C would: a
    shell starts its background jobs with SIGINT ignored, and Python keeps an ignored SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
