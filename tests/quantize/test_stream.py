"""Models bigger than memory: the skeleton holds no decoder-layer weights, each layer is read
from the shards when its turn comes, and the artifact is the one a whole-model load gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _models import MOE, build

from quantkit.config import QuantizeConfig
from quantkit.quantize import quantize
from quantkit.quantize.stream import open_skeleton
from quantkit.quantize.structure import read_structure


@pytest.fixture(scope="module")
def mixtral(tiny_model, tmp_path_factory) -> Path:
    return build("mixtral", tiny_model, tmp_path_factory.mktemp("mixtral") / "m",
                 **MOE["mixtral"])


@pytest.mark.parametrize("which", ["llama", "mixtral"])
def test_the_skeleton_reads_each_layer_as_transformers_loads_it(which, tiny_model, mixtral):
    """No decoder-layer weight is in memory until its layer is read; what is read (Mixtral's
    per-expert w1/w3/w2 stacked into fused experts) equals transformers' own load."""
    from transformers import AutoModelForCausalLM

    path = tiny_model if which == "llama" else mixtral
    family = read_structure(path)
    opened = open_skeleton(path, family, "float32")
    assert opened is not None
    lm, reader = opened
    layers = lm.get_submodule(family.layers_attr)
    assert all(p.is_meta for p in layers.parameters())
    assert not any(p.is_meta for n, p in lm.named_parameters()
                   if not n.startswith(family.layers_attr))
    whole = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for i, layer in enumerate(layers):
        reader.materialize(layer, i, "cpu")
        ref = whole.get_submodule(family.layers_attr)[i].state_dict()
        got = layer.state_dict()
        assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
        reader.release(layer)
        assert all(p.is_meta for p in layer.parameters())
    reader.close()


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_streaming_writes_the_artifact_a_whole_load_writes(method, mixtral, tiny_calib, tmp_path):
    from safetensors.torch import load_file

    outs = {}
    for stream in (True, False):
        outs[stream] = tmp_path / f"stream-{stream}"
        quantize(model=str(mixtral), calib=tiny_calib, out=outs[stream],
                 cfg=QuantizeConfig(method=method, group_size=32, stream=stream))
    shards = sorted(f.name for f in outs[True].glob("*.safetensors"))
    assert shards == sorted(f.name for f in outs[False].glob("*.safetensors"))
    for name in shards:
        a, b = load_file(outs[True] / name), load_file(outs[False] / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
