"""Per-token KL of two next-token distributions, from the original's top-k and the full row."""

from __future__ import annotations

import numpy as np
import pytest

from quantkit.validate.kld import position_kl


def _logsoftmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def _top(lp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-lp, axis=1)[:, :k]
    return np.take_along_axis(lp, ids, 1), ids


def test_exact_when_the_top_k_holds_the_whole_vocabulary() -> None:
    rng = np.random.default_rng(0)
    p, q = _logsoftmax(rng.normal(size=(5, 40))), _logsoftmax(rng.normal(size=(5, 40)))
    kl, agree, tail = position_kl(*_top(p, 40), q)
    exact = (np.exp(p) * (p - q)).sum(1)
    assert np.allclose(kl, exact) and np.allclose(tail, 0)
    assert np.array_equal(agree, (p.argmax(1) == q.argmax(1)).astype(float))
    same, agree_same, _ = position_kl(*_top(p, 40), p)
    assert np.allclose(same, 0) and agree_same.all()


def test_a_truncated_top_k_gives_a_close_lower_bound() -> None:
    rng = np.random.default_rng(1)
    p = _logsoftmax(rng.normal(size=(50, 2000)) * 3)   # peaked, as trained models are
    q = _logsoftmax(np.log(np.exp(p) + 1e-3 * rng.random((50, 2000))) + 0.2 * rng.normal(size=(50, 2000)))
    exact = (np.exp(p) * (p - q)).sum(1)
    kl, _, tail = position_kl(*_top(p, 256), q)
    assert (kl <= exact + 1e-9).all()                    # coarsening never adds divergence
    assert abs(kl.mean() - exact.mean()) < 0.1 * exact.mean() and tail.max() < 0.5


class _Rows:
    """Fixed next-token rows behind the engine face kld reads: whole rows (as transformers and
    llama.cpp give them), or with `top_only` each position's top k alone (as vLLM gives them)."""

    def __init__(self, rows: np.ndarray, top_only: bool = False) -> None:
        self.rows, self.vocab_size, self.asked = rows, rows.shape[1], []
        if top_only:
            self.token_logprob_top = self._top

    def encode(self, text: str) -> list[int]:
        return list(range(self.rows.shape[0] + 1))

    def token_logprob_rows(self, ids: list[int]) -> list[np.ndarray]:
        return [self.rows]

    def _top(self, ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        self.asked.append(k)
        top = np.argsort(-self.rows, axis=1, kind="stable")[:, :k]
        return top, np.take_along_axis(self.rows, top, 1)


def _pair(flat: bool, n: int = 60, vocab: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """(original, quantized) log-softmax rows: flat like a random-weight model's, or peaked."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(n, vocab)) * (0.3 if flat else 3.0)
    return _logsoftmax(logits), _logsoftmax(logits + 0.05 * rng.normal(size=(n, vocab)))


@pytest.mark.parametrize("flat", [True, False])
def test_top_k_only_engines_give_the_whole_row_kl(flat: bool) -> None:
    """An engine with only each position's top k (vLLM) is asked again with a larger k until the
    original's top-256 tokens are all found: the same KL and top-1 agreement as whole rows. The
    former estimate (the rest of the vocabulary spread evenly) overstated the flat rows' KL."""
    from quantkit.validate.kld import TOP_K, baseline_side, compare

    p, q = _pair(flat)
    base = baseline_side(_Rows(p), ["line"])
    assert baseline_side(_Rows(p, top_only=True), ["line"]) == base
    whole = compare(_Rows(q), ["line"], base).to_dict()
    engine = _Rows(q, top_only=True)
    top = compare(engine, ["line"], base).to_dict()
    assert engine.asked[0] == TOP_K and engine.asked[-1] > TOP_K   # it had to ask again
    assert top["kld"]["value"] == pytest.approx(whole["kld"]["value"], rel=1e-9)
    assert top["top1_agreement"] == whole["top1_agreement"]
    assert top["uncovered_mass"]["max"] == 0 == whole["uncovered_mass"]["max"]
    # the former estimate: the quantized side's top 256, the rest of its mass spread evenly
    ids = np.argsort(-q, axis=1)[:, :TOP_K]
    spread = np.repeat(np.log((1 - np.exp(np.take_along_axis(q, ids, 1)).sum(1, keepdims=True))
                              / (q.shape[1] - TOP_K)), q.shape[1], 1)
    np.put_along_axis(spread, ids, np.take_along_axis(q, ids, 1), 1)
    old = compare(_Rows(spread), ["line"], base).to_dict()["kld"]["value"]
    if flat:
        assert old > 2 * whole["kld"]["value"]


def test_lookup_finds_what_the_top_k_holds_and_bounds_the_rest() -> None:
    from quantkit.validate.kld import lookup

    top_ids = np.array([[7, 3, 9], [1, 2, 0]])
    top_lp = np.log(np.array([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]]))
    q_at, found = lookup(top_ids, top_lp, np.array([[9, 7], [5, 1]]))
    assert found.tolist() == [[True, True], [False, True]]
    # a token not in the list: the list's k-th log-probability (an upper bound of its own)
    assert np.allclose(np.exp(q_at), [[0.1, 0.5], [0.1, 0.6]])


def test_a_capped_k_reports_the_mass_it_could_not_find(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantkit.validate import kld

    p, q = _pair(flat=True)
    base = kld.baseline_side(_Rows(p), ["line"])
    monkeypatch.setattr(kld, "MAX_TOP_K", kld.TOP_K)   # never more than the first ask
    engine = _Rows(q, top_only=True)
    res = kld.compare(engine, ["line"], base).to_dict()
    assert engine.asked == [kld.TOP_K] and res["uncovered_mass"]["max"] > 0.001
    assert res["kld"]["value"] > 0
