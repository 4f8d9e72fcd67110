"""Тесты course_utils.offpolicy: каждая функция против независимого расчёта, инварианты, ошибки."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import offpolicy as op

RNG = np.random.default_rng(12)


def _logps(shape, seed=0):
    """Пара «похожих» массивов логарифмов вероятностей (numpy float64, все ≤ 0)."""
    rng = np.random.default_rng(seed)
    behavior = -rng.gamma(2.0, 1.0, size=shape)
    target = -np.abs(behavior + rng.normal(0.0, 0.3, size=shape))
    return target, behavior


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


# --------------------------------------------------------------------------- отношения


def test_importance_ratios_torch_in_vs_numpy_reference():
    lt, lb = _logps((4, 7))
    ours = op.importance_ratios(_t(lt), _t(lb))
    assert isinstance(ours, np.ndarray) and ours.dtype == np.float64
    np.testing.assert_allclose(ours, np.exp(lt - lb), rtol=1e-12)


def test_importance_ratios_numpy_in_vs_torch_reference():
    lt, lb = _logps((3, 5), seed=1)
    ours = op.importance_ratios(lt, lb)
    assert isinstance(ours, np.ndarray) and ours.shape == (3, 5)
    ref = torch.exp(torch.from_numpy(lt) - torch.from_numpy(lb)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-12)


def test_low_precision_and_lists_give_float64():
    lt, lb = _logps((2, 3), seed=2)
    out16 = op.importance_ratios(torch.tensor(lt, dtype=torch.bfloat16), lb)
    assert out16.dtype == np.float64  # не bf16: exp в bf16 легко переполняется
    assert op.importance_ratios(lt.astype(np.float32), lb.astype(np.float32)).dtype == np.float64
    assert isinstance(op.importance_ratios(lt.tolist(), lb.tolist()), np.ndarray)


def test_infinity_conventions():
    lt = np.array([-1.0, -np.inf, -np.inf, -2.0])
    lb = np.array([-np.inf, -1.0, -np.inf, -2.0])
    w = op.importance_ratios(lt, lb)
    assert np.isposinf(w[0]) and w[1] == 0.0 and w[2] == 0.0 and w[3] == 1.0


def test_sequence_log_ratio_vs_loop_and_mask():
    lt, lb = _logps((5, 9), seed=3)
    mask = RNG.integers(0, 2, size=(5, 9))
    ours = op.sequence_log_ratio(_t(lt), _t(lb), _t(mask))
    assert ours.shape == (5,)
    ref = [sum(mask[i, j] * (lt[i, j] - lb[i, j]) for j in range(9)) for i in range(5)]
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
    # значения на позициях вне маски (токены запроса и среды) не влияют на ответ
    lt2 = np.where(mask == 1, lt, -50.0)
    np.testing.assert_allclose(op.sequence_log_ratio(lt2, lb, mask), ref, rtol=1e-12, atol=1e-12)
    # без маски — сумма по всем токенам
    np.testing.assert_allclose(op.sequence_log_ratio(lt, lb), (lt - lb).sum(axis=1), rtol=1e-12)


def test_sequence_log_ratio_1d_is_scalar():
    lt, lb = _logps((6,), seed=4)
    out = op.sequence_log_ratio(lt, lb, [1, 1, 0, 1, 0, 1])
    assert np.ndim(out) == 0
    assert out == pytest.approx(sum((lt - lb)[[0, 1, 3, 5]]), abs=1e-12)
    assert np.ndim(op.sequence_log_ratio(_t(lt), _t(lb))) == 0


def test_sequence_bad_inputs():
    lt, lb = _logps((3, 4))
    with pytest.raises(ValueError, match="формы различаются"):
        op.sequence_log_ratio(lt, lb[:, :3])
    with pytest.raises(ValueError, match="mask"):
        op.sequence_log_ratio(lt, lb, np.ones((3, 5)))
    with pytest.raises(ValueError, match="mask"):
        op.sequence_log_ratio(lt, lb, np.full((3, 4), 0.5))
    bad = lt.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="logp_target.*NaN"):
        op.sequence_log_ratio(bad, lb)
    with pytest.raises(ValueError, match=r"logp_behavior.*\+inf"):
        op.importance_ratios(lt, np.full((3, 4), np.inf))
    with pytest.raises(ValueError, match="logp_target"):
        op.importance_ratios(None, lb)
    with pytest.raises(ValueError, match="logp_target"):
        op.importance_ratios(["a", "b"], [1.0, 2.0])


def test_sequence_undefined_with_both_infinities():
    lt = np.array([[-1.0, -np.inf, -1.0]])
    lb = np.array([[-np.inf, -1.0, -1.0]])
    with pytest.raises(ValueError, match="support_violations"):
        op.sequence_log_ratio(lt, lb)
    assert np.isposinf(op.sequence_log_ratio(lt, lb, [[1, 0, 1]])[0])


# --------------------------------------------------------------------------- ESS


def _ess_ref(w):
    w = np.asarray(w, dtype=np.float64)
    return w.sum() ** 2 / (w**2).sum()


def test_ess_vs_formula_both_kinds():
    w = RNG.lognormal(0.0, 1.0, size=200)
    assert op.effective_sample_size(torch.from_numpy(w)) == pytest.approx(_ess_ref(w), rel=1e-12)
    wt = torch.rand(50, dtype=torch.float64)
    ref = float(wt.sum() ** 2 / (wt**2).sum())
    assert op.effective_sample_size(wt.numpy()) == pytest.approx(ref, rel=1e-12)
    assert op.normalized_ess(w) == pytest.approx(_ess_ref(w) / 200, rel=1e-12)


def test_ess_invariants():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 60))
        w = rng.exponential(size=n) ** rng.uniform(0.5, 4)
        ess = op.effective_sample_size(w)
        assert 1.0 <= ess <= n
        assert 0.0 < op.normalized_ess(w) <= 1.0
        assert op.effective_sample_size(w * 1e6) == pytest.approx(ess, rel=1e-10)
        assert op.effective_sample_size(w * 1e-9) == pytest.approx(ess, rel=1e-10)
    assert op.effective_sample_size(np.full(17, 3.5)) == pytest.approx(17.0)
    assert op.normalized_ess(np.full(17, 3.5)) == pytest.approx(1.0)
    dominated = np.array([1e6] + [1e-3] * 99)
    assert op.effective_sample_size(dominated) == pytest.approx(1.0, abs=1e-3)
    assert op.normalized_ess(dominated) == pytest.approx(0.01, abs=1e-4)


def test_ess_selected_2d_and_log_weights():
    w = RNG.lognormal(0.0, 0.7, size=(4, 10))
    mask = RNG.integers(0, 2, size=(4, 10))
    mask[0, 0] = 1
    kept = w[mask == 1]  # учитываемые веса отбирает вызывающий
    ref = _ess_ref(kept)
    assert op.effective_sample_size(kept) == pytest.approx(ref, rel=1e-12)
    assert op.normalized_ess(_t(kept)) == pytest.approx(ref / mask.sum(), rel=1e-12)
    assert op.effective_sample_size(np.log(kept), log=True) == pytest.approx(ref, rel=1e-10)
    assert op.effective_sample_size(w) == pytest.approx(_ess_ref(w.ravel()), rel=1e-12)  # все
    # длинные последовательности: exp(Σ log w) переполняется, а log=True — нет
    big = np.array([1000.0, 1000.0, 999.0, -np.inf])
    ref_big = (np.exp(big - 1000).sum() ** 2) / (np.exp(2 * (big - 1000)).sum())
    assert op.effective_sample_size(big, log=True) == pytest.approx(ref_big, rel=1e-12)


def test_ess_bad_inputs():
    with pytest.raises(ValueError, match="≥ 0"):
        op.effective_sample_size([1.0, -0.5])
    with pytest.raises(ValueError, match="NaN"):
        op.effective_sample_size([1.0, np.nan])
    with pytest.raises(ValueError, match="поддержки"):
        op.effective_sample_size([1.0, np.inf])
    with pytest.raises(ValueError, match="нулю"):
        op.effective_sample_size([0.0, 0.0])
    with pytest.raises(ValueError, match="нет ни одного веса"):
        op.normalized_ess([])
    with pytest.raises(ValueError, match="поддержки"):
        op.effective_sample_size([0.0, np.inf], log=True)


# --------------------------------------------------------------------------- клиппирование


def test_clip_fraction_crafted():
    r = np.array([0.7, 0.9, 1.0, 1.1, 1.3])
    assert op.clip_fraction(r, 0.2) == pytest.approx(2 / 5)
    assert op.clip_fraction(r, 0.2, advantages=np.ones(5)) == pytest.approx(1 / 5)  # только 1.3
    assert op.clip_fraction(r, 0.2, advantages=-np.ones(5)) == pytest.approx(1 / 5)  # только 0.7
    adv = np.array([-1.0, 1.0, 1.0, 1.0, 1.0])  # оба выхода из полосы со «своим» знаком
    assert op.clip_fraction(r, 0.2, advantages=adv) == pytest.approx(2 / 5)
    adv0 = np.array([1.0, 1.0, 1.0, 1.0, -1.0])  # знаки против клиппирования — не срабатывает
    assert op.clip_fraction(r, 0.2, advantages=adv0) == 0.0
    assert op.clip_fraction(r, 0.2, advantages=np.zeros(5)) == 0.0  # A = 0: клип не влияет
    # асимметричная полоса (clip-higher): 1.3 внутри [0.8, 1.35]
    assert op.clip_fraction(r, 0.2, eps_high=0.35) == pytest.approx(1 / 5)
    # torch на входе — тот же ответ
    assert op.clip_fraction(torch.tensor(r), 0.2, torch.ones(5)) == pytest.approx(1 / 5)


def test_clip_fraction_per_sequence_advantages_vs_reference():
    gen = torch.Generator().manual_seed(3)
    r = torch.exp(torch.randn(6, 11, generator=gen) * 0.3)
    adv = torch.randn(6, generator=gen)
    a = adv[:, None].expand(6, 11)
    eps, eps_high = 0.2, 0.28
    clipped = ((r > 1 + eps_high) & (a > 0)) | ((r < 1 - eps) & (a < 0))
    ref = float(clipped.float().mean())
    assert op.clip_fraction(r, eps, adv, eps_high=eps_high) == pytest.approx(ref, rel=1e-6)
    # то же по токенам (numpy на входе) и через формулу verl: −A·clip(r) > −A·r
    rn, an = r.double().numpy(), a.double().numpy()
    verl = (-an * np.clip(rn, 1 - eps, 1 + eps_high)) > (-an * rn)
    assert op.clip_fraction(rn, eps, an, eps_high) == pytest.approx(verl.mean(), rel=1e-12)
    # 1-D ответ со скалярным преимуществом последовательности
    assert op.clip_fraction([0.5, 1.0, 1.5], 0.2, advantages=1.0) == pytest.approx(1 / 3)


def test_clip_fraction_bad_inputs():
    r = np.ones(4)
    for eps in (0.0, -0.1, 1.0, float("nan"), "0.2"):
        with pytest.raises(ValueError, match="eps"):
            op.clip_fraction(r, eps)
    with pytest.raises(ValueError, match="eps_high"):
        op.clip_fraction(r, 0.2, eps_high=0.0)
    with pytest.raises(ValueError, match="advantages"):
        op.clip_fraction(r, 0.2, advantages=np.ones(3))
    with pytest.raises(ValueError, match="advantages"):
        op.clip_fraction(r, 0.2, advantages=[1.0, np.nan, 1.0, 1.0])
    with pytest.raises(ValueError, match="ratios.*NaN"):
        op.clip_fraction([1.0, np.nan], 0.2)
    with pytest.raises(ValueError, match="ratios"):
        op.clip_fraction([1.0, -0.1], 0.2)
    with pytest.raises(ValueError, match="ни одного токена"):
        op.clip_fraction([], 0.2)


# --------------------------------------------------------------------------- log μ после top-p


@pytest.mark.parametrize("temperature", [0.5, 0.8, 1.0, 1.7])
@pytest.mark.parametrize("top_p", [0.3, 0.8, 0.95, 1.0])
def test_behavior_logprob_matches_transformers_warpers(temperature, top_p):
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(int(temperature * 10 + top_p * 100))
    logits = torch.randn(8, 120, generator=gen) * 2.5
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    expected_all = torch.log_softmax(scores, dim=-1)
    # по токену из ядра и по токену, который мог оказаться вне ядра
    for tokens in (scores.argmax(-1), torch.randint(0, 120, (8,), generator=gen)):
        expected = expected_all.gather(-1, tokens[:, None]).squeeze(-1)
        ours = op.behavior_logprob(logits, tokens, temperature, top_p)
        assert isinstance(ours, torch.Tensor) and ours.shape == (8,)
        kept = torch.isfinite(expected)
        assert torch.equal(kept, torch.isfinite(ours)), "разные множества оставленных токенов"
        assert torch.allclose(ours[kept], expected[kept], atol=1e-5, rtol=0)
        ours_np = op.behavior_logprob(logits.numpy(), tokens.numpy(), temperature, top_p)
        assert isinstance(ours_np, np.ndarray)
        np.testing.assert_allclose(ours_np, ours.numpy(), atol=1e-6)


def test_raw_vs_behavior_logprob_under_top_p():
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0])
    T, p = 0.9, 0.8
    z = logits / T
    probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    order = np.argsort(-probs)
    nucleus = order[: int(np.searchsorted(np.cumsum(probs[order]), p) + 1)]
    mass = probs[nucleus].sum()
    for y in range(5):
        raw = op.raw_logprob(logits, y, T)
        beh = op.behavior_logprob(logits, y, T, p)
        assert np.ndim(raw) == 0 and np.ndim(beh) == 0
        assert raw == pytest.approx(math.log(probs[y]), abs=1e-5)
        if y in nucleus:  # перенормировка: log μ = log p − log(масса ядра) > log p
            assert beh == pytest.approx(math.log(probs[y]) - math.log(mass), abs=1e-5)
            assert beh > raw
        else:
            assert np.isneginf(beh)
    # без top-p обе величины совпадают
    assert op.behavior_logprob(logits, 2, T, 1.0) == pytest.approx(op.raw_logprob(logits, 2, T))


def test_behavior_logprob_bad_inputs():
    logits = torch.randn(2, 10)
    with pytest.raises(ValueError, match="token"):
        op.behavior_logprob(logits, torch.tensor([1, 10]))
    with pytest.raises(ValueError, match="token"):
        op.behavior_logprob(logits, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="token"):
        op.behavior_logprob(logits, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="temperature"):
        op.behavior_logprob(logits, torch.tensor([1, 2]), temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        op.behavior_logprob(logits, torch.tensor([1, 2]), top_p=0.0)
    with pytest.raises(ValueError, match="logits"):
        op.behavior_logprob(torch.tensor([1.0, float("nan")]), 0)
    with pytest.raises(ValueError, match="logits"):
        op.raw_logprob(np.array([1.0, np.nan]), 0)


# --------------------------------------------------------------------------- TIS и маскирование


def test_truncated_weights():
    w = np.array([0.5, 1.0, 2.5, 4.0, 0.1])
    out, share = op.truncated_weights(w, 2.0)
    np.testing.assert_array_equal(out, [0.5, 1.0, 2.0, 2.0, 0.1])
    assert share == pytest.approx(2 / 5)
    out_t, share_t = op.truncated_weights(torch.tensor(w), 2.0)  # torch на входе — тот же ответ
    np.testing.assert_array_equal(out_t, out)
    assert share_t == share
    rand = RNG.lognormal(0, 1, size=(5, 6))
    out_r, share_r = op.truncated_weights(rand, 1.5)
    np.testing.assert_allclose(out_r, np.minimum(rand, 1.5))
    assert share_r == pytest.approx((rand > 1.5).mean())


def test_masked_weights():
    w = np.array([0.5, 1.0, 2.5, 4.0, 0.1])
    out, share = op.masked_weights(w, 0.2, 3.0)
    np.testing.assert_array_equal(out, [0.5, 1.0, 2.5, 0.0, 0.0])
    assert share == pytest.approx(2 / 5)
    out_t, share_t = op.masked_weights(torch.tensor(w), 0.2, 3.0)  # torch на входе — тот же ответ
    np.testing.assert_array_equal(out_t, out)
    assert share_t == share
    rand = RNG.lognormal(0, 1, size=(4, 7))
    out_r, share_r = op.masked_weights(rand, 0.5, 2.0)
    inside = (rand >= 0.5) & (rand <= 2.0)
    np.testing.assert_allclose(out_r, rand * inside)
    assert share_r == pytest.approx(1 - inside.mean())
    # последовательностный вариант: те же функции на весах w_seq = exp(log w_seq)
    lt, lb = _logps((6, 5), seed=8)
    seq_w = np.exp(op.sequence_log_ratio(lt, lb))
    seq_out, seq_share = op.masked_weights(seq_w, 0.5, 2.0)
    assert seq_out.shape == (6,) and 0.0 <= seq_share <= 1.0


def test_truncation_and_masking_bad_inputs():
    w = np.array([1.0, 2.0])
    for cap in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="cap"):
            op.truncated_weights(w, cap)
    with pytest.raises(ValueError, match="low"):
        op.masked_weights(w, 2.0, 1.0)
    with pytest.raises(ValueError, match="low"):
        op.masked_weights(w, -0.1, 1.0)
    with pytest.raises(ValueError, match="ratios"):
        op.truncated_weights([1.0, -2.0], 2.0)
    with pytest.raises(ValueError, match="NaN"):
        op.masked_weights([1.0, np.nan], 0.5, 2.0)


# --------------------------------------------------------------------------- условие поддержки


def test_support_violations_reported_not_hidden():
    with np.errstate(divide="ignore"):
        lt = np.log(np.array([[0.5, 0.3, 0.2, 0.0], [0.6, 0.4, 0.0, 0.0]]))
        lb = np.log(np.array([[0.7, 0.3, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0]]))
    rep = op.support_violations(lt, lb)
    assert rep["count"] == 2 and rep["share"] == pytest.approx(2 / 8)
    np.testing.assert_array_equal(rep["indices"], [[0, 2], [1, 1]])
    assert rep["target_mass"] == pytest.approx(0.2 + 0.4)
    rep_m = op.support_violations(_t(lt), _t(lb), mask=[[1, 1, 0, 1], [1, 1, 1, 1]])
    assert rep_m["count"] == 1
    assert rep_m["indices"].tolist() == [[1, 1]]
    # и остальные функции это показывают
    w = op.importance_ratios(lt, lb)
    assert np.isposinf(w[0, 2]) and np.isposinf(w[1, 1]) and w[0, 3] == 0.0
    with pytest.raises(ValueError, match="поддержки"):
        op.effective_sample_size(w)
    with pytest.raises(ValueError, match="support_violations"):
        op.truncated_weights(w, 2.0)
    with pytest.raises(ValueError, match="support_violations"):
        op.masked_weights(w, 0.0, 2.0)
    assert op.clip_fraction(w[0], 0.2) == pytest.approx(3 / 4)  # inf вне полосы — тоже виден


def test_top_p_crossing_creates_violation():
    """Тренер с чуть другими логитами: токен движка выпадает из ядра тренера → μ_trainer = 0."""
    logits_engine = torch.tensor([2.0, 1.0, 0.95, -3.0])
    logits_trainer = logits_engine + torch.tensor([0.0, -0.04, 0.04, 0.0])
    full_e = torch.log_softmax(logits_engine, -1)
    full_t = torch.log_softmax(logits_trainer, -1)
    tok = torch.arange(4)
    mu = op.behavior_logprob(logits_engine.expand(4, 4), tok, 1.0, 0.75)
    pi = op.behavior_logprob(logits_trainer.expand(4, 4), tok, 1.0, 0.75)
    # ядро p = 0.75 у движка {0, 1}, у тренера {0, 2}: токен 2 — вне носителя μ
    rep = op.support_violations(pi, mu)
    assert rep["count"] == 1 and rep["indices"].tolist() == [[2]], (mu, pi)
    # без усечения носители совпадают
    assert op.support_violations(full_t, full_e)["count"] == 0


# --------------------------------------------------------------------------- симуляция


def test_simulate_log_ratios_shape_seed_and_growth():
    a = op.simulate_log_ratios(2, 16, 100, seed=3)
    assert a.shape == (100, 16) and isinstance(a, np.ndarray)
    np.testing.assert_array_equal(a, op.simulate_log_ratios(2, 16, 100, seed=3))
    assert not np.array_equal(a, op.simulate_log_ratios(2, 16, 100, seed=4))
    assert np.all(op.simulate_log_ratios(0, 8, 10) == 0.0)  # без задержки и TIM w ≡ 1
    stds = [op.simulate_log_ratios(lag, 64, 400, seed=1).std() for lag in (1, 2, 4, 8)]
    assert all(s1 < s2 for s1, s2 in zip(stds, stds[1:]))
    assert stds[0] == pytest.approx(0.02, rel=0.05)
    assert op.simulate_log_ratios(0, 64, 400, sigma_tim=0.01).std() == pytest.approx(0.01, rel=0.05)


def test_simulated_ess_matches_formula():
    """Симуляция совпала с формулой exp(−length·σ²) для последовательностных весов."""
    for lag, length in ((1, 64), (2, 64), (2, 256), (4, 16)):
        lw = op.simulate_log_ratios(lag, length, 40_000, seed=lag * 1000 + length)
        seq = lw.sum(axis=1)
        frac = op.normalized_ess(seq, log=True)
        assert frac == pytest.approx(op.expected_ess_fraction(lag, length), rel=0.05, abs=0.01)
        tok = op.normalized_ess(lw[:2000], log=True)
        assert tok == pytest.approx(op.expected_ess_fraction(lag), abs=0.01)
    # ESS/n падает с задержкой и с длиной ответа
    assert op.expected_ess_fraction(1, 256) > op.expected_ess_fraction(4, 256)
    assert op.expected_ess_fraction(2, 16) > op.expected_ess_fraction(2, 1024)
    assert op.expected_ess_fraction(0, 1000) == 1.0


def test_simulation_bad_inputs():
    with pytest.raises(ValueError, match="lag"):
        op.simulate_log_ratios(-1, 4, 4)
    with pytest.raises(ValueError, match="length"):
        op.simulate_log_ratios(1, 0, 4)
    with pytest.raises(ValueError, match="sigma_per_lag"):
        op.simulate_log_ratios(1, 4, 4, sigma_per_lag=-0.1)
    with pytest.raises(ValueError, match="sigma_tim"):
        op.expected_ess_fraction(1, 4, sigma_tim=float("nan"))


# --------------------------------------------------------------------------- TIM


def test_tim_report_vs_numpy():
    rng = np.random.default_rng(21)
    engine = -rng.gamma(2.0, 1.0, size=(6, 12))
    trainer = engine + rng.normal(0, 2e-3, size=(6, 12))
    mask = (rng.random((6, 12)) > 0.2).astype(int)
    mask[:, 0] = 1
    rows = [(e[k == 1], t[k == 1]) for e, t, k in zip(engine, trainer, mask)]  # токены ответа
    rep = op.tim_report([_t(e) for e, _ in rows], [_t(t) for _, t in rows])
    d = (trainer - engine)[mask == 1]
    seq = ((trainer - engine) * mask).sum(1)
    assert rep["n_sequences"] == 6 and rep["n_tokens"] == int(mask.sum())
    assert rep["abs_delta_mean"] == pytest.approx(np.abs(d).mean(), rel=1e-12)
    assert rep["abs_delta_p99"] == pytest.approx(np.percentile(np.abs(d), 99), rel=1e-12)
    assert rep["abs_delta_max"] == pytest.approx(np.abs(d).max(), rel=1e-12)
    assert rep["share_above_threshold"] == pytest.approx((np.abs(d) > 1e-3).mean())
    np.testing.assert_allclose(rep["seq_log_ratio"], seq, rtol=1e-10, atol=1e-14)
    assert rep["token_ess_fraction"] == pytest.approx(_ess_ref(np.exp(d)) / d.size, rel=1e-10)
    assert rep["seq_ess_fraction"] == pytest.approx(_ess_ref(np.exp(seq)) / 6, rel=1e-10)
    assert rep["support_violations"] == 0


def test_tim_report_ragged_lists_and_identity():
    gen = torch.Generator().manual_seed(5)
    engine = [-torch.rand(n, generator=gen) for n in (3, 7, 5)]
    rep0 = op.tim_report(engine, [e.clone() for e in engine])
    assert rep0["abs_delta_max"] == 0.0 and rep0["share_above_threshold"] == 0.0
    assert rep0["token_ess_fraction"] == 1.0 and rep0["seq_ess_fraction"] == 1.0
    trainer = [e + 0.01 * torch.randn(len(e), generator=gen) for e in engine]
    rep = op.tim_report(engine, trainer)
    assert rep["n_tokens"] == 15 and rep["seq_log_ratio"].shape == (3,)
    ref = [float((t.double() - e.double()).sum()) for e, t in zip(engine, trainer)]
    np.testing.assert_allclose(rep["seq_log_ratio"], ref, rtol=1e-5)
    # записи контракта: списки чисел → numpy
    rep_l = op.tim_report([e.tolist() for e in engine], [t.tolist() for t in trainer])
    assert isinstance(rep_l["seq_log_ratio"], np.ndarray)
    assert rep_l["abs_delta_mean"] == pytest.approx(rep["abs_delta_mean"], rel=1e-5)


def test_tim_report_violation_and_bad_inputs():
    engine = [np.array([-1.0, -np.inf]), np.array([-0.5, -0.2])]
    trainer = [np.array([-1.0, -2.0]), np.array([-0.5, -0.2])]
    rep = op.tim_report(engine, trainer)
    assert rep["support_violations"] == 1
    assert math.isinf(rep["abs_delta_max"]) and math.isnan(rep["token_ess_fraction"])
    with pytest.raises(ValueError, match="длины"):
        op.tim_report([[-1.0, -2.0]], [[-1.0]])
    with pytest.raises(ValueError, match="списки последовательностей"):
        op.tim_report(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="одномерная"):
        op.tim_report([np.zeros((1, 3))], [np.zeros((1, 3))])
    with pytest.raises(ValueError, match="NaN"):
        op.tim_report([np.zeros(2)], [np.array([0.0, np.nan])])


# --------------------------------------------------------------------------- TIM с длиной и top-p


def _log_softmax_by_hand(row):
    top = max(row)
    lse = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - lse for x in row]


def test_position_shift_report_by_hand_across_chunks():
    rng = np.random.default_rng(5)
    za = rng.normal(0, 2, size=(2, 70, 5))  # 140 позиций — больше одного куска в 64 строки
    zb = za + rng.normal(0, 0.05, size=za.shape)
    tokens = rng.integers(0, 5, size=(2, 70))
    rep = op.position_shift_report(torch.tensor(za), zb, tokens)
    for b in range(2):
        for t in (0, 63, 64, 69):
            eps = max(abs(x - y) for x, y in zip(za[b, t], zb[b, t]))
            d = (_log_softmax_by_hand(za[b, t])[tokens[b, t]]
                 - _log_softmax_by_hand(zb[b, t])[tokens[b, t]])  # fmt: skip
            assert rep["eps"][b, t] == pytest.approx(eps)
            assert rep["log_ratio"][b, t] == pytest.approx(d)
            assert abs(d) <= 2 * eps
    np.testing.assert_allclose(rep["cum_log_ratio"], np.cumsum(rep["log_ratio"], axis=-1))
    np.testing.assert_allclose(rep["cum_bound"], np.cumsum(2 * rep["eps"], axis=-1))
    assert (np.abs(rep["cum_log_ratio"]) <= rep["cum_bound"] + 1e-12).all()
    assert rep["holds"] and rep["bound"] == pytest.approx(2 * np.abs(za - zb).max())
    assert rep["max_abs_log_ratio"] == pytest.approx(np.abs(rep["log_ratio"]).max())
    # сдвиг всех логитов позиции на одну константу не меняет вероятности: ε > 0, а log w = 0
    same = op.position_shift_report(za, za + 0.3, tokens)
    assert same["eps_max"] == pytest.approx(0.3) and same["max_abs_log_ratio"] < 1e-12


def test_position_shift_report_bad_inputs():
    z = np.zeros((3, 4))
    with pytest.raises(ValueError, match="формы различаются"):
        op.position_shift_report(z, np.zeros((3, 5)), [0, 0, 0])
    with pytest.raises(ValueError, match="tokens"):
        op.position_shift_report(z, z, [0, 0])
    with pytest.raises(ValueError, match="словаря"):
        op.position_shift_report(z, z, [0, 0, 4])


def test_top_p_flips_by_hand():
    # p(3, 2, 1, 0) = 0.644, 0.237, 0.087, 0.032: два первых набирают 0.881 ≥ 0.88 — ядро {0, 1}.
    # Логит токена 1 на 0.05 ниже: 0.651 + 0.228 = 0.879 < 0.88 — в ядро входит и токен 2.
    za = np.array([[3.0, 2.0, 1.0, 0.0]] * 3).reshape(1, 3, 4)
    zb = za.copy()
    zb[0, 2, 1] -= 0.05
    probs = [math.exp(x) for x in za[0, 0]]
    probs_b = [math.exp(x) for x in zb[0, 2]]
    above_a = (probs[0] + probs[1]) / sum(probs)
    above_b = (probs_b[0] + probs_b[1]) / sum(probs_b)
    assert above_a >= 0.88 > above_b  # граница ядра легла между двумя вариантами
    res = op.top_p_flips(za, zb, 0.88)
    assert res["count"] == 1 and res["share"] == pytest.approx(1 / 3)
    assert res["positions"].tolist() == [[0, 2]]
    ex = res["examples"][0]
    assert ex["position"] == (0, 2) and ex["token"] == 2
    assert (ex["in_a"], ex["in_b"]) == (False, True)
    assert ex["mass_above_a"] == pytest.approx(above_a)
    assert ex["mass_above_b"] == pytest.approx(above_b)
    assert ex["p_a"] == pytest.approx(probs[2] / sum(probs))
    assert op.top_p_flips(za, zb, 0.88, limit=0)["examples"] == []
    # тот же сдвиг без усечения (top-p = 1) ядро не меняет
    assert op.top_p_flips(za, zb, 1.0)["count"] == 0


def test_top_p_flips_agree_with_sampling_logprobs():
    from course_utils.policy import sampling_logprobs

    rng = np.random.default_rng(9)
    za = rng.normal(0, 2, size=(150, 12))
    zb = za + rng.normal(0, 0.08, size=za.shape)
    for top_p in (0.5, 0.9):
        kept_a = torch.isfinite(sampling_logprobs(torch.tensor(za), 1.0, top_p))
        kept_b = torch.isfinite(sampling_logprobs(torch.tensor(zb), 1.0, top_p))
        expected = (kept_a != kept_b).any(-1)
        res = op.top_p_flips(za, zb, top_p, temperature=1.0, limit=200)
        assert res["count"] == int(expected.sum()) > 0
        assert res["positions"][:, 0].tolist() == torch.nonzero(expected)[:, 0].tolist()
        for ex in res["examples"]:
            i, tok = ex["position"][0], ex["token"]
            assert (ex["in_a"], ex["in_b"]) == (bool(kept_a[i, tok]), bool(kept_b[i, tok]))
    with pytest.raises(ValueError, match="top_p"):
        op.top_p_flips(za, zb, 0.0)


# --------------------------------------------------------------------------- log-вероятности ≤ 0

# Вероятности вместо их логарифмов — частая ошибка: π = 0.9 вместо log 0.9 дало бы «w» ≈ 2.7.
PROBS = np.array([[0.9, 0.4, 0.05]])
LOGS = np.log(PROBS)


def _tim_ragged(a, b):
    return op.tim_report(list(a), list(b))


LOGPROB_FUNCS = {
    "importance_ratios": op.importance_ratios,
    "sequence_log_ratio": op.sequence_log_ratio,
    "support_violations": op.support_violations,
    "tim_report_ragged": _tim_ragged,
}


@pytest.mark.parametrize("func", LOGPROB_FUNCS)
@pytest.mark.parametrize("which", ["target", "behavior"])
@pytest.mark.parametrize("as_torch", [False, True])
def test_positive_logprobs_are_refused(func, which, as_torch):
    probs, logs = (_t(PROBS), _t(LOGS)) if as_torch else (PROBS, LOGS)
    target, behavior = (probs, logs) if which == "target" else (logs, probs)
    if func.startswith("tim_report"):  # tim_report(engine, trainer): поведение идёт первым
        args = (behavior, target)
        name = "trainer_logprobs" if which == "target" else "engine_logprobs"
    else:
        args, name = (target, behavior), f"logp_{which}"
    with pytest.raises(ValueError, match=rf"{name}.*log-вероятность должна быть ≤ 0.*вероятности"):
        LOGPROB_FUNCS[func](*args)


@pytest.mark.parametrize("func", LOGPROB_FUNCS)
def test_rounding_above_zero_is_tolerated_but_not_more(func):
    f = LOGPROB_FUNCS[func]
    lb = np.array([[-0.7, -1.2, -0.1]])
    near = np.array([[5e-7, -1.0, 0.0]])  # float32 log_softmax даёт такие +1e-7 вместо 0
    f(near, lb)
    f(lb, near)
    over = np.array([[2e-6, -1.0, 0.0]])
    with pytest.raises(ValueError, match="≤ 0"):
        f(over, lb)


def test_tolerated_rounding_keeps_exact_values():
    lt, lb = np.array([5e-7, -np.inf, -0.3]), np.array([-0.2, -1.0, -np.inf])
    w = op.importance_ratios(lt, lb)
    assert w[0] == pytest.approx(math.exp(5e-7 + 0.2), rel=1e-15)
    assert w[1] == 0.0 and np.isposinf(w[2])  # соглашения о бесконечностях прежние


def test_log_weight_stats_vs_numpy():
    lt, lb = _logps((4, 9), seed=31)
    mask = RNG.integers(0, 2, size=(4, 9))
    mask[0, 0] = 1
    d = (lt - lb)[mask == 1]
    ours = op.log_weight_stats(d)
    assert op.log_weight_stats(lt - lb)["n_tokens"] == lt.size  # 2-D — все токены
    assert ours["mean_abs_log_ratio"] == pytest.approx(np.abs(d).mean(), rel=1e-12)
    assert ours["max_log_ratio"] == d.max() and ours["n_tokens"] == d.size
    # log w любого знака — не log-вероятности, их проверка «≤ 0» не касается
    w = np.array([0.5, 2.0, 4.0])
    s = op.log_weight_stats(np.log(w))
    assert s["max_abs_log_ratio"] == pytest.approx(math.log(4.0), rel=1e-15)
    assert op.log_weight_stats([np.inf, 0.0])["support_violations"] == 1
    with pytest.raises(ValueError, match="log_weights.*NaN"):
        op.log_weight_stats([np.nan])


def test_counts_accept_integral_floats_and_refuse_the_rest():
    ref = op.simulate_log_ratios(2, 16, 8, seed=3)
    np.testing.assert_array_equal(op.simulate_log_ratios(2.0, 16.0, 8.0, seed=3), ref)
    assert op.expected_ess_fraction(2.0, 16.0) == op.expected_ess_fraction(2, 16)
    for bad in (1.5, True, None, "2"):
        with pytest.raises(ValueError, match="lag должно быть целым ≥ 0"):
            op.simulate_log_ratios(bad, 16, 8)
    with pytest.raises(ValueError, match="seed"):
        op.simulate_log_ratios(1, 4, 4, seed="abc")


def test_masked_weights_high_may_be_infinite_but_not_garbage():
    w, share = op.masked_weights([0.2, 1.0, 9.0], 0.5, math.inf)
    np.testing.assert_array_equal(w, [0.0, 1.0, 9.0])
    assert share == pytest.approx(1 / 3)
    for bad in (None, "2", np.nan, 0.0, -1.0):
        with pytest.raises(ValueError, match="high"):
            op.masked_weights([1.0], 0.0, bad)


def test_clipped_is_one_rule_for_numpy_and_torch():
    import torch

    rho = np.array([1.3, 1.3, 0.7, 0.7, 1.0])
    adv = np.array([1.0, -1.0, -1.0, 1.0, 1.0])
    expected = [True, False, True, False, False]  # активен только член со знаком A
    assert op.clipped(rho, adv, 0.2).tolist() == expected
    assert op.clipped(torch.tensor(rho), torch.tensor(adv), 0.2).tolist() == expected


def test_grpo_loss_mask_and_token_count_vs_loop():
    """L = −(1/N) Σ m_t · min(ρA, clip(ρ)A): токены среды не входят, N = Σ m_t или num_tokens."""
    new = torch.tensor([-0.1, -2.0, -0.3, -1.2, -0.05])
    old = torch.tensor([-0.4, -0.5, -0.3, -1.0, -0.9])
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0, 0.5])
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    terms = []
    for n, o, a, m in zip(new.tolist(), old.tolist(), adv.tolist(), mask.tolist()):
        rho = math.exp(n - o)
        terms.append(m * min(rho * a, min(max(rho, 0.8), 1.2) * a))
    assert op.grpo_loss(new, old, adv, mask).item() == pytest.approx(-sum(terms) / 3, rel=1e-6)
    got = op.grpo_loss(new, old, adv, mask, num_tokens=10).item()
    assert got == pytest.approx(-sum(terms) / 10, rel=1e-6)
    assert op.grpo_loss(new, old, adv, torch.ones(5)).item() == pytest.approx(
        op.grpo_loss(new, old, adv).item(), rel=1e-6
    )
