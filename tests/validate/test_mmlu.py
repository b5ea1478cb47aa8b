"""MMLU through lm-eval on the real data, scored by the transformers engine on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantkit.errors import BadInput
from quantkit.validate.mmlu import run_mmlu

DATA = Path(__file__).parents[2] / "../shared/data/mmlu/jsonl"
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
    res = run_mmlu(rec, data_dir=DATA, limit=3, subjects=SUBJECTS)
    assert res["n"] == 6 and len(res["correct"]) == 6 and set(res["correct"]) <= {0, 1}
    assert 0.0 <= res["accuracy"] <= 1.0
    assert res["accuracy"] == sum(res["correct"]) / 6
    assert res["ids"] == [f"{s}/{i}" for s in sorted(SUBJECTS) for i in range(3)]
    assert set(res["subjects"]) == set(SUBJECTS)
    assert all(v["n"] == 3 for v in res["subjects"].values())
    assert res["num_fewshot"] == 5 and res["source"] == f"local:{DATA}"
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

    again = run_mmlu(engine, data_dir=DATA, limit=3, subjects=SUBJECTS)
    assert again == res  # deterministic: same answers, same order


def test_missing_or_empty_data(tmp_path: Path, engine: Any) -> None:
    with pytest.raises(BadInput, match="not found"):
        run_mmlu(engine, data_dir=tmp_path / "nope", limit=1)
    with pytest.raises(BadInput, match=str(tmp_path)):
        run_mmlu(engine, data_dir=tmp_path, limit=1)
    with pytest.raises(BadInput, match="did you mean 'astronomy'"):
        run_mmlu(engine, data_dir=DATA, limit=1, subjects=["astronomyy"])
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
    with pytest.raises(BadInput, match="not found offline") as err:
        run_mmlu(engine, data_dir=None, limit=1, subjects=["astronomy"])
    assert "--mmlu-data" in err.value.hint
