import pytest

from pipeline.config import ConfigError, build_config


def test_flags_override_the_config_file_which_overrides_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("num-samples: 20\nseed: 4\nwindow_ms: [2, 50]\n")
    cfg = build_config(str(path), {"seed": 9, "out": None})
    assert (cfg.num_samples, cfg.seed, cfg.window_ms, cfg.out) == (20, 9, [2, 50], "out")


def test_shipped_recipe_by_name():
    assert build_config("demo", {}).device == "cpu"


@pytest.mark.parametrize("text, message", [
    ("num_sample: 3\n", "unknown config key"),
    ("num_samples: lots\n", "num_samples must be a int"),
    ("num_samples: 0\n", "at least 1"),
    ("window_ms: [100, 1]\n", "window_ms"),
    ("composer: magic\n", "composer must be one of"),
    ("device: tpu\n", "device must be"),
    ("op_count_mix: {7: 1.0}\n", "op_count_mix"),
    ("- a list\n", "must hold a mapping"),
    ("num_samples: [\n", "not valid YAML"),
    ("num_samples: true\n", "num_samples must be a int, not True"),
    ("num_samples: 2.5\n", "num_samples must be a int, not 2.5"),
    ("read_only_fs: nope\n", "unknown config key.*read_only_fs"),
    ("checks: {no_such_setting: 1}\n", "unknown checks key.*valid: ablation, compile"),
    ("checks: {atol: 0.1}\n", "unknown checks key"),  # the run's own key, set as `atol`
    ("sampling: random\n", "sampling must be one of layers, uniform"),
])
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        build_config(str(path), {})


def test_missing_config_file_lists_the_recipes():
    with pytest.raises(ConfigError, match="shipped recipes: demo, ops6k"):
        build_config("no-such-file.yaml", {})


def test_ops6k_recipe_reads_its_reference_from_the_environment(monkeypatch):
    monkeypatch.delenv("KERNELBENCH", raising=False)
    with pytest.raises(ConfigError, match=r"\$\{KERNELBENCH\} names an environment variable that is not set"):
        build_config("ops6k", {})
    monkeypatch.setenv("KERNELBENCH", "/data/KernelBench")
    cfg = build_config("ops6k", {"llm_model": "my-model"})
    assert (cfg.num_samples, cfg.composer, cfg.device, cfg.reference) == (6000, "llm", "cuda", "/data/KernelBench")
    assert cfg.op_count_mix == {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}
    assert cfg.llm["model"] == "my-model" and cfg.llm["repair_rounds"] == 1


def test_beam_processes_of_a_host_share_its_cores_among_all_their_workers(monkeypatch, tmp_path):
    """Under the multi-process DirectRunner each Beam process has its own pool: the pools
    together take one worker a core, and each worker's threads are the host's share."""
    from pipeline.devices import default_workers, sandbox_options as _sandbox_options

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    beam_args = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    cfg = build_config(None, {"beam_args": beam_args})
    workers = default_workers("cpu", [], beam_args)
    assert workers == 4
    assert _sandbox_options(cfg, "cpu", [], workers, tmp_path).threads == 1
    assert _sandbox_options(build_config(None, {}), "cpu", [], 8, tmp_path).threads == 1
    assert _sandbox_options(build_config(None, {}), "cpu", [], 2, tmp_path).threads == 4


def test_a_job_may_hold_four_task_budgets_of_gpu_memory_whatever_the_number_of_workers(monkeypatch):
    """The checks after timing hold more than the forward the task budget bounds (the float64
    probe holds the task in float32 beside its float64 copy): a job's most is four budgets
    at any number of workers, and its worker's share where that is more."""
    import types

    import torch

    from pipeline.devices import gpu_share_gb, job_memory_gb, task_memory_budget_gb

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda gpu: types.SimpleNamespace(total_memory=141 * 2**30))
    budget = task_memory_budget_gb([0])
    for workers in (1, 2, 4, 8, 16, 64):
        most = job_memory_gb([0], workers)
        assert most >= 4 * budget * (1 - 1e-9), (workers, most, budget)
        assert most == max(gpu_share_gb([0], workers), gpu_share_gb([0], 4)), workers
    assert job_memory_gb([0, 1], 32) == job_memory_gb([0], 16)  # per GPU, as the units are


def test_tasks_handed_to_validate_may_use_the_added_librarys_ops_and_nothing_else(cache_dir):
    from pipeline.run import added_library_ops

    cfg = build_config(None, {"libraries": ["torch", "kornia.filters", "transformers:llama"],
                              "cache_dir": str(cache_dir)})
    ops = added_library_ops(cfg)
    assert "kornia.filters.BoxBlur" in ops and all(op.startswith("kornia.filters.") for op in ops), ops
    assert added_library_ops(build_config(None, {})) == frozenset()  # torch and transformers: no crawl


def test_a_checks_setting_reaches_the_workers_and_decides_the_runs_identity(tmp_path):
    from pipeline.devices import sandbox_options as _sandbox_options
    from pipeline.run import _check_config
    from pipeline.staging import run_fingerprint as _fingerprint

    cfg = build_config(None, {"checks": {"ablation": False, "max_resize_rounds": 2}})
    check_config = _check_config(cfg, "cpu", _sandbox_options(cfg, "cpu", [], 2, tmp_path))
    assert check_config["ablation"] is False and check_config["max_resize_rounds"] == 2
    assert check_config["checks"] == ["execute", "timing", "determinism", "purity", "degenerate", "sensitivity",
                                      "numerics", "ablation", "compile"]
    assert _fingerprint(cfg, "cpu") != _fingerprint(build_config(None, {}), "cpu")


def test_a_changed_threshold_is_a_new_verdict_key_and_a_new_run(tmp_path, monkeypatch):
    """A verdict stored under one threshold of a check is not taken for another, even one
    the run never set (a new opsynth's default)."""
    from filters.checks import registry
    from filters.store import VerdictStore
    from pipeline.devices import sandbox_options as _sandbox_options
    from pipeline.run import _check_config
    from pipeline.staging import run_fingerprint as _fingerprint

    cfg = build_config(None, {})
    key = lambda: VerdictStore.key("code", _check_config(cfg, "cpu", _sandbox_options(cfg, "cpu", [], 2, tmp_path)))
    before, run_before = key(), _fingerprint(cfg, "cpu")
    monkeypatch.setitem(registry.DEFAULTS, "min_changed_share", 0.3)
    assert key() != before and _fingerprint(cfg, "cpu") != run_before


def test_an_added_library_leads_its_share_of_candidates_unless_told_otherwise():
    """The README's `--library torch --library kornia.filters` composed no kornia task in a run
    of 8: an added library leads a quarter of the candidates by default, `--library-mix` sets it."""
    assert build_config(None, {"libraries": ["torch", "kornia.filters"]}).library_mix == {"transformers": 0.012,
                                                                                         "kornia": 0.25}
    two = build_config(None, {"libraries": ["torch", "kornia.filters", "einops"]}).library_mix
    assert two["kornia"] == two["einops"] == 0.125
    chosen = build_config(None, {"libraries": ["torch", "kornia.filters"], "library_shares": [("kornia", 0.4)]})
    assert chosen.library_mix["kornia"] == 0.4
    with pytest.raises(ConfigError, match="library_mix"):
        build_config(None, {"library_shares": [("kornia", 1.5)]})
