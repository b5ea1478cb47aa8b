"""--method gguf: the imatrix file format and bad input. Slow: every test needs the demo model's
tokenizer and llama.cpp's converter. (The demo's Q4_K_M end to end: tests/test_demo_loop.py's GGUF
recipe test; with against without the importance matrix: bench/demo_quality.py imatrix.)"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the gguf extra (llama-cpp-python) is not installed")
pytestmark = pytest.mark.slow

from quantkit.calib import calibrate, load_calibration_set  # noqa: E402
from quantkit.config import CalibrateConfig  # noqa: E402
from quantkit.llamacpp_source import convert_to_f16, gguf_module  # noqa: E402
from quantkit.quantize import imatrix  # noqa: E402


@pytest.fixture(scope="module")
def small_llama(demo_model, tmp_path_factory):
    """A 2-layer random llama with the demo model's real tokenizer (the converter knows it)."""
    from _models import random_llama

    path = tmp_path_factory.mktemp("small-llama")
    random_llama(path, demo_model, vocab_size=49152, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 tie_word_embeddings=True)
    return path


@pytest.fixture(scope="module")
def small_calib(small_llama, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf-calib") / "set"
    calibrate(model=str(small_llama), out=out, cfg=CalibrateConfig(
        sources=(str(corpus["prose"]),), samples=8, min_tokens=256, max_tokens=256))
    return out


def test_imatrix_file_matches_the_format(small_llama, small_calib, tmp_path):
    from transformers import AutoModelForCausalLM

    gguf = gguf_module()
    f16 = tmp_path / "f16.gguf"
    convert_to_f16(small_llama, f16)
    model = AutoModelForCausalLM.from_pretrained(small_llama, dtype=torch.float32).eval()
    samples = load_calibration_set(small_calib).input_ids
    sums, tokens = imatrix.collect(model, samples)
    assert tokens == 8 * 256 and len(sums) == 2 * 7
    names = imatrix.gguf_name_map(f16, list(sums), gguf)
    assert names["model.layers.1.self_attn.q_proj.weight"] == "blk.1.attn_q.weight"
    assert names["model.layers.0.mlp.down_proj.weight"] == "blk.0.ffn_down.weight"
    out = tmp_path / "imatrix.gguf"
    assert imatrix.write(out, sums, tokens, names, ["calib_sets/x"], gguf) == 14

    reader = gguf.GGUFReader(str(out))

    def field(key: str):
        f = reader.fields[key]
        return f.parts[f.data[0]]

    assert bytes(field("general.type")).decode() == "imatrix"
    assert bytes(field("imatrix.datasets")).decode() == "calib_sets/x"
    assert int(field("imatrix.chunk_count")[0]) == tokens // 512
    assert int(field("imatrix.chunk_size")[0]) == 512
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {f"{n}.{k}" for n in names.values() for k in ("in_sum2", "counts")}
    # in_sum2 of q_proj is the sum over tokens of the squared RMSNorm output, channel by channel
    x = []
    layer0 = model.model.layers[0]
    hook = layer0.self_attn.q_proj.register_forward_pre_hook(lambda m, a: x.append(a[0]))
    with torch.no_grad():
        for s in samples:
            model.model(input_ids=torch.tensor([s]))
    hook.remove()
    expected = torch.cat([a.reshape(-1, 64) for a in x]).double().pow(2).sum(0)
    got = torch.tensor(tensors["blk.0.attn_q.weight.in_sum2"].data.reshape(-1))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert float(tensors["blk.0.attn_q.weight.counts"].data.reshape(-1)[0]) == tokens


def test_bad_gguf_inputs(cli, small_llama, small_calib, tmp_path):
    base = ["quantize", str(small_llama), "--method", "gguf", "--calib", str(small_calib)]
    code, _, err = cli(*base, "--quant-type", "Q4_X", "--out", str(tmp_path / "a"))
    assert code == 2 and "unknown --quant-type Q4_X" in err and "Q4_K_M" in err
    alien = tmp_path / "alien"
    shutil.copytree(small_llama, alien)
    config = json.loads((alien / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (alien / "config.json").write_text(json.dumps(config))
    code, _, err = cli("quantize", str(alien), "--method", "gguf", "--calib", str(small_calib),
                       "--out", str(tmp_path / "b"))
    assert code == 2 and "converter refused" in err and "NoSuchModelForCausalLM" in err
    truncated = tmp_path / "cut.gguf"
    f16 = tmp_path / "f16.gguf"
    convert_to_f16(small_llama, f16)
    truncated.write_bytes(f16.read_bytes()[: f16.stat().st_size // 3])
    code, _, err = cli("quantize", str(truncated), "--method", "gguf", "--calib",
                       str(small_calib), "--out", str(tmp_path / "c"))
    assert code == 2 and "not a readable GGUF model" in err
    assert not any((tmp_path / n).exists() for n in "abc")


def test_header_reader_agrees_with_gguf_py(small_llama, tmp_path):
    """quantkit.gguf_header reads what gguf-py's GGUFReader reads (every scalar and string, each
    array's length, the tensor table), and refuses a file cut short or with an unknown type."""
    from quantkit.gguf_header import Array, read_header

    gguf = gguf_module()
    f16 = tmp_path / "f16.gguf"
    convert_to_f16(small_llama, f16)
    ours, theirs = read_header(f16, gguf), gguf.GGUFReader(str(f16))
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(ours.fields) == keys and len(keys) > 20
    for key in keys:
        f, mine = theirs.fields[key], ours.fields[key]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            assert isinstance(mine, Array) and mine.count == len(f.data), key
        elif f.types[0] == gguf.GGUFValueType.STRING:
            assert mine == bytes(f.parts[f.data[0]]).decode(), key
        else:
            assert mine == f.parts[f.data[0]][0], key
    assert ours.fields["tokenizer.ggml.tokens"].count == 49152
    assert [(t.name, t.shape, t.type_name, t.n_elements, t.n_bytes) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_elements),
         int(t.n_bytes)) for t in theirs.tensors]
    data = f16.read_bytes()
    for cut in (len(data) // 3, len(data) - 1, 100, 30):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ValueError):
            read_header(tmp_path / "cut.gguf", gguf)
    first = data.index(b"blk.0.attn_q.weight")  # its tensor type, after the name and dims
    at = first + len(b"blk.0.attn_q.weight") + 4 + 2 * 8
    (tmp_path / "type.gguf").write_bytes(data[:at] + (9999).to_bytes(4, "little") + data[at + 4:])
    with pytest.raises(ValueError, match="9999"):
        read_header(tmp_path / "type.gguf", gguf)
