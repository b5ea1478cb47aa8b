"""Per-token KL of two next-token distributions, from the original's top-k and the full row."""

from __future__ import annotations

import numpy as np

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
