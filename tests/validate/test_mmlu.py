"""MMLU through lm-eval on the real data (the copy shipped in the package, a folder, the hub),
scored by the transformers engine on a tiny model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import quantkit
from quantkit.errors import BadInput
from quantkit.validate.mmlu import BUNDLED, _lm_eval_mmlu_dir, bundled_rows, run_mmlu

SHIPPED = Path(quantkit.__file__).parent / "data" / "mmlu"
SUBJECTS = ["astronomy", "abstract_algebra"]


class Recording:
    """An Engine that passes everything through and keeps the texts it was asked to encode."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.texts: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def encode(self, text: str) -> list[int]:
        self.texts.append(text)
        return list(self.engine.encode(text))

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        self.texts += texts
        return [list(ids) for ids in self.engine.encode_many(texts)]


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Any:
    import torch

    from quantkit.engines.hf import TransformersEngine

    torch.set_num_threads(1)
    eng = TransformersEngine(tiny_model, threads=1, device="cpu")
    yield eng
    eng.close()


def test_mmlu_two_subjects(engine: Any) -> None:
    rec = Recording(engine)
    res = run_mmlu(rec, data_dir=None, limit=3, subjects=SUBJECTS)
    assert res["n"] == 6 and len(res["correct"]) == 6 and set(res["correct"]) <= {0, 1}
    assert 0.0 <= res["accuracy"] <= 1.0
    assert res["accuracy"] == sum(res["correct"]) / 6
    assert res["ids"] == [f"{s}/{i}" for s in sorted(SUBJECTS) for i in range(3)]
    assert set(res["subjects"]) == set(SUBJECTS)
    assert all(v["n"] == 3 for v in res["subjects"].values())
    assert res["num_fewshot"] == 5 and res["source"] == f"bundled:{BUNDLED}"
    # lm-eval's 5-shot template: its header, the dev questions, then the test question
    prompts = [t for t in rec.texts if t.startswith("The following are multiple choice")]
    header = ("The following are multiple choice questions (with answers) about "
              "abstract algebra.\n\n")
    assert prompts and any(t.startswith(header) for t in prompts)
    first = next(t for t in prompts if t.startswith(header))
    assert first.count("\nAnswer:") == 6 and "\nA. " in first
    # the continuations are lm-eval's choices " A".." D" after "Answer:"
    assert {t[-9:] for t in rec.texts if "Answer: " in t[-9:]} == {
        f"Answer: {c}" for c in "ABCD"}

    again = run_mmlu(engine, data_dir=None, limit=3, subjects=SUBJECTS)
    assert set(res["seconds"]) == {"load", "lm_eval", "encode", "engine"}
    assert again.pop("seconds") and res.pop("seconds")
    assert again == res  # deterministic: same answers, same order


def test_two_models_with_one_tokenizer_encode_the_questions_once(engine: Any,
                                                                  tiny_model: Path) -> None:
    """A task's two sides share `encoded`: the second model, whose tokenizer is the first's
    (a quantized model carries its original's), tokenizes none of the 5-shot texts again, and
    scores exactly as it does alone. A tokenizer that differs in one token shares nothing."""
    from transformers import AutoTokenizer

    from quantkit.engines.base import HFTokenizerText
    from quantkit.validate.lmeval import Encoded

    alone = run_mmlu(engine, data_dir=None, limit=2, subjects=SUBJECTS)
    encoded: Encoded = {}
    first, second = Recording(engine), Recording(engine)
    a = run_mmlu(first, data_dir=None, limit=2, subjects=SUBJECTS, encoded=encoded)
    b = run_mmlu(second, data_dir=None, limit=2, subjects=SUBJECTS, encoded=encoded)
    assert len(encoded) == 1 and first.texts and not second.texts
    for r in (alone, a, b):
        r.pop("seconds")
    assert a == b == alone

    class Holder(HFTokenizerText):
        def __init__(self, tok: Any) -> None:
            self.tok = tok

    same = Holder(AutoTokenizer.from_pretrained(tiny_model))
    other = Holder(AutoTokenizer.from_pretrained(tiny_model))
    other.tok.add_tokens(["zq-quantkit"])
    assert same.tokenizer_fingerprint() == Holder(engine.tok).tokenizer_fingerprint()
    assert other.tokenizer_fingerprint() not in (None, same.tokenizer_fingerprint())


def test_missing_or_empty_data(tmp_path: Path, engine: Any) -> None:
    with pytest.raises(BadInput, match="not found"):
        run_mmlu(engine, data_dir=tmp_path / "nope", limit=1)
    with pytest.raises(BadInput, match=str(tmp_path)):
        run_mmlu(engine, data_dir=tmp_path, limit=1)
    with pytest.raises(BadInput, match="did you mean 'astronomy'"):
        run_mmlu(engine, data_dir=None, limit=1, subjects=["astronomyy"])
    for split in ("test", "dev"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "astronomy.jsonl").write_text("{not json\n")
    with pytest.raises(BadInput, match="cannot read MMLU data"):
        run_mmlu(engine, data_dir=tmp_path, limit=1)


def test_hub_offline_is_bad_input(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import huggingface_hub

    # what HF_HUB_OFFLINE=1 sets at import time (the hub libraries are already loaded here)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    # a hub id goes to the hub through `datasets`, as lm-eval's own task definitions do
    with pytest.raises(BadInput, match="MMLU data cais/mmlu not found .offline") as err:
        run_mmlu(engine, data_dir="cais/mmlu", limit=1, subjects=["astronomy"])
    assert "--mmlu-data" in err.value.hint and "shared" not in err.value.hint


def test_bundled_data_is_the_complete_release() -> None:
    test, dev = bundled_rows("test"), bundled_rows("dev")
    assert len(test) == len(dev) == 57 and set(test) == set(dev)
    assert sum(map(len, test.values())) == 14042 and sum(map(len, dev.values())) == 285
    assert all(len(rows) == 5 for rows in dev.values())
    # every subject lm-eval defines, and nothing else
    assert set(test) == {p.stem.removeprefix("mmlu_")
                         for p in _lm_eval_mmlu_dir().glob("mmlu_*.yaml")}
    for subject, rows in [*test.items(), *dev.items()]:
        for r in rows:
            assert list(r) == ["question", "subject", "choices", "answer"] and \
                r["subject"] == subject
            assert len(r["choices"]) == 4 and all(isinstance(c, str) for c in r["choices"])
            assert type(r["answer"]) is int and 0 <= r["answer"] <= 3
    assert test["abstract_algebra"][0]["question"].startswith("Find the degree for the given")
    # the shipped files are the ones SOURCE.md names, gzip'd without a timestamp
    source = (SHIPPED / "SOURCE.md").read_text()
    assert "MIT" in source and "Copyright (c) 2020 Dan Hendrycks" in source
    for split in ("dev", "test"):
        raw = (SHIPPED / f"{split}.jsonl.gz").read_bytes()
        assert f"\n{hashlib.sha256(raw).hexdigest()}  {split}.jsonl.gz\n" in source
        assert raw[4:8] == b"\0\0\0\0"  # gzip MTIME
    assert sum(p.stat().st_size for p in SHIPPED.glob("*.gz")) < 3_000_000


def test_folder_format_still_loads(tmp_path: Path, engine: Any) -> None:
    # a two-subject folder in the {test,dev}/SUBJECT.jsonl format, the bundled rows as content
    for split in ("test", "dev"):
        (tmp_path / split).mkdir()
        for subject in SUBJECTS:
            rows = bundled_rows(split)[subject][:3 if split == "test" else 5]
            (tmp_path / split / f"{subject}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in rows))
    folder = run_mmlu(engine, data_dir=tmp_path, limit=2)
    assert folder["source"] == f"local:{tmp_path}"
    assert set(folder["subjects"]) == set(SUBJECTS) and folder["n"] == 4
    assert folder["ids"] == [f"{s}/{i}" for s in sorted(SUBJECTS) for i in range(2)]
    # same questions, same prompts: the same answers as from the bundled data
    bundled = run_mmlu(engine, data_dir=None, limit=2, subjects=SUBJECTS)
    assert {k: v for k, v in folder.items() if k not in ("source", "seconds")} == \
        {k: v for k, v in bundled.items() if k not in ("source", "seconds")}


def _mmlu_pairs(per_subject: int) -> list[tuple[str, str]]:
    """lm-eval's own (context, continuation) requests, `per_subject` questions of every subject."""
    from lm_eval.tasks import TaskManager

    from quantkit.validate.lmeval import FEWSHOT_SEED, offline_datasets
    from quantkit.validate.mmlu import _pick_subjects, task_config

    offline_datasets()
    loaded = TaskManager(include_defaults=False).load(
        [task_config(s, None, 5) for s in _pick_subjects(None, None)])
    pairs = []
    for task in loaded["tasks"].values():
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
        task.build_all_requests(limit=per_subject, rank=0, world_size=1)
        pairs += [tuple(i.args) for i in task.instances]
    return pairs


def _metaspace_tokenizer(path: Path) -> Any:
    """A SentencePiece-style BPE (Metaspace, "▁" prepended to the first word only), the kind
    whose tokens of a text's tail alone differ from the same tail inside the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    bpe.decoder = decoders.Metaspace(prepend_scheme="first")
    rows = bundled_rows("dev")
    bpe.train_from_iterator([r["question"] for s in rows for r in rows[s]],
                            trainers.BpeTrainer(vocab_size=800, special_tokens=["<unk>"]))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>")


@pytest.mark.parametrize("kind", ["tiny", "smollm2", "metaspace"])
def test_split_encoding_is_the_whole_texts_encoding(kind: str, tiny_model: Path,
                                                    request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    """Every MMLU request's context and `context + continuation` get exactly the ids the whole
    text encodes to, while the five-shot head is encoded once per subject (byte-level BPE), or
    the text whole where the split would change the ids (Metaspace)."""
    from transformers import AutoTokenizer

    from quantkit.validate.lmeval import split_encode

    if kind == "metaspace":
        tok = _metaspace_tokenizer(tmp_path)
    else:
        tok = AutoTokenizer.from_pretrained(
            request.getfixturevalue("demo_model") if kind == "smollm2" else tiny_model)
    sent: list[int] = []

    def encode_many(texts: list[str]) -> list[list[int]]:
        sent.append(sum(map(len, texts)))
        return [list(x) for x in tok(texts, add_special_tokens=False)["input_ids"]]

    pairs = _mmlu_pairs(2)
    assert len(pairs) == 4 * 2 * 57
    ids = split_encode(encode_many, pairs)
    whole = {t: list(x) for t, x in zip(*(lambda ts: (ts, tok(
        ts, add_special_tokens=False)["input_ids"]))(
        list(dict.fromkeys(t for c, x in pairs for t in (c.rstrip(), c + x)))))}
    assert all(ids[c.rstrip()] == whole[c.rstrip()] and ids[c + x] == whole[c + x]
               for c, x in pairs)
    naive = sum(map(len, whole))
    if kind == "metaspace":  # no split kept: the tails alone start with "▁"
        assert sum(sent) > naive
    else:
        assert sum(sent) < 0.5 * naive
