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


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_activations_on_disk_give_the_same_artifact(method, mixtral, tiny_calib, tmp_path,
                                                    monkeypatch):
    """--activations disk: every batch's layer inputs wait in a memory-mapped file (deleted as
    soon as it is mapped: nothing is left beside the output); the artifact is byte for byte the
    one with them in memory."""
    from safetensors.torch import load_file

    import quantkit.quantize.offload as offload

    mapped = []
    real = offload.to_disk
    monkeypatch.setattr(offload, "to_disk", lambda t, folder: mapped.append(folder) or real(t, folder))
    outs = {}
    for where in ("memory", "disk"):
        outs[where] = tmp_path / where
        manifest = quantize(model=str(mixtral), calib=tiny_calib, out=outs[where],
                            cfg=QuantizeConfig(method=method, group_size=32, activations=where))
        assert manifest.to_dict()["parameters"]["activations"] == where
    from transformers import AutoConfig

    layers = AutoConfig.from_pretrained(mixtral).num_hidden_layers
    assert mapped and set(mapped) == {tmp_path} and len(mapped) % (layers + 1) == 0, mapped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "memory"]  # no file left
    for name in sorted(f.name for f in outs["memory"].glob("*.safetensors")):
        a, b = load_file(outs["memory"] / name), load_file(outs["disk"] / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_activations_go_to_disk_only_when_they_do_not_fit(tiny_model, tiny_calib):
    import psutil

    from quantkit.errors import BadInput
    from quantkit.quantize.preflight import check_memory, preflight_calibration

    _, info, _ = preflight_calibration(str(tiny_model), tiny_calib)
    cpu, few = torch.device("cpu"), 1000
    free = psutil.virtual_memory().available
    many = 2 * free // (int(info.hidden_size) * 8)  # two copies of these outgrow free memory
    assert check_memory(info, few, cpu) is False
    assert check_memory(info, few, cpu, "disk") is True
    assert check_memory(info, many, cpu) is True
    with pytest.raises(BadInput, match="GiB is free") as refused:
        check_memory(info, many, cpu, "memory")
    assert "--activations auto" in refused.value.hint
    with pytest.raises(BadInput, match="applies to CPU runs"):
        check_memory(info, few, torch.device("cuda"), "disk")


def test_bad_activations_options_exit_2_before_work(cli, tiny_model, tiny_calib, tmp_path):
    for args, message in ((["--activations", "swap"], "unknown --activations 'swap'"),
                          (["--method", "gguf", "--activations", "disk"], "applies to GPTQ/AWQ"),
                          (["--hessians", "original", "--activations", "disk"],
                           "applies to GPTQ/AWQ/FP8 layer by layer")):
        code, _, err = cli("quantize", str(tiny_model), "--calib", str(tiny_calib), "--group-size",
                           "32", "--out", str(tmp_path / "bad" / "x"), *args)
        assert code == 2 and message in err and "hint:" in err, err
    assert not (tmp_path / "bad").exists()
