"""New op libraries: any importable module, and a package registering an op source under
the `opsynth.op_sources` entry-point group; both made on the fly here."""
import sys
import textwrap

import pytest

from operators.catalog import crawl
from operators.records import OpSpec
from operators.libraries import UnknownLibrary
from operators.sources import ENTRY_POINT_GROUP

MODULE = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class ScaledTanh(nn.Module):
        def __init__(self, in_features):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(in_features))

        def forward(self, x):
            return torch.tanh(x) * self.scale


    def soft_clip(input, limit=3.0):
        return limit * torch.tanh(input / limit)


    def _private_helper(input):
        return input


    def ops():
        yield "opsynth_plugin_demo.layers.soft_clip", soft_clip
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    package = tmp_path / "opsynth_plugin_demo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text(MODULE)
    dist = tmp_path / "opsynth_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: opsynth-plugin-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ndemo = opsynth_plugin_demo.layers:ops\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("opsynth_plugin_demo")]:
        del sys.modules[name]


def test_any_importable_module_is_crawled_by_probing(plugin):
    specs, skipped = crawl(["opsynth_plugin_demo.layers"])
    by_name = {spec.name: spec for spec in specs}
    module = by_name["opsynth_plugin_demo.layers.ScaledTanh"]
    assert module.library == "opsynth_plugin_demo" and module.init_args == {"in_features": "$L"}
    assert "import opsynth_plugin_demo.layers" in module.seed_code
    assert "opsynth_plugin_demo.layers.soft_clip" in by_name
    assert "opsynth_plugin_demo.layers._private_helper" not in by_name | {s.name: s for s in skipped}


def test_a_registered_entry_point_is_a_library_name(plugin):
    specs, _ = crawl(["demo"])
    assert [spec.name for spec in specs] == ["opsynth_plugin_demo.layers.soft_clip"]
    assert all(isinstance(spec, OpSpec) for spec in specs)


def test_an_unknown_library_is_a_clear_error():
    with pytest.raises(UnknownLibrary, match="neither a registered op source"):
        crawl(["no_such_library_anywhere"])
