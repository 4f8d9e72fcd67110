"""Тесты course_utils.stale_experiment: цифры пакета против расчёта вручную, несмещённость при
нулевой задержке, истинное J против Монте-Карло, выводы — из чисел таблицы."""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_utils import fmt, stale_experiment as se


def _hand_case():
    weights = [2.0, 0.0, 0.5, 1.0]  # второй роллаут не сохранён (вес 0)
    lengths = [10, 20, 30, 40]
    rewards = [1, 0, 1, 0]  # среднее 0.5: A = +0.5, −0.5, +0.5, −0.5
    counts = [[9, 1], [20, 0], [25, 5], [30, 10]]
    log_rho = [[0.3, -0.3], [0.5, 0.5], [-0.25, 0.1], [0.1, -0.5]]
    return weights, lengths, rewards, counts, log_rho


def test_batch_figures_by_hand():
    weights, lengths, rewards, counts, log_rho = _hand_case()
    f = se.batch_figures(weights, lengths, rewards, counts, log_rho, eps=0.2)
    kept = [i for i, w in enumerate(weights) if w > 0]
    assert f["kept_rollouts"] == pytest.approx(3 / 4)
    assert f["kept_tokens"] == pytest.approx((10 + 30 + 40) / 100)
    assert f["length_ratio"] == pytest.approx((80 / 3) / 25)
    ess = sum(weights) ** 2 / sum(w * w for w in weights)  # нулевой вес в ESS ничего не меняет
    assert f["ess"] == pytest.approx(ess)
    assert f["ess_per_kept"] == pytest.approx(ess / 3)
    assert f["ess_per_generated"] == pytest.approx(ess / 4)
    # клиппирование по токенам вручную: развернём счётчики в токены и проверим знак A
    mean_r = sum(rewards) / len(rewards)
    hits = total = 0
    for i in kept:
        adv = rewards[i] - mean_r
        for k, c in enumerate(counts[i]):
            rho = math.exp(log_rho[i][k])
            for _ in range(c):
                total += 1
                hits += (rho > 1.2 and adv > 0) or (rho < 0.8 and adv < 0)
    assert (hits, total) == (
        9 + 10,
        80,
    )  # 9 токенов ρ = 1.35 при A > 0, 10 токенов ρ = 0.61 при A < 0
    assert f["clip"] == pytest.approx(hits / total)
    # без учёта знака вне полосы было бы больше: ρ = 0.74 при A > 0 и ρ = 0.78 — не срабатывают
    assert f["estimate"] == pytest.approx((2 * 1 + 0.5 * 1 + 1 * 0) / 3.5)


def test_batch_figures_nothing_kept():
    _, lengths, rewards, counts, log_rho = _hand_case()
    f = se.batch_figures([0, 0, 0, 0], lengths, rewards, counts, log_rho)
    assert f["kept_rollouts"] == 0 and f["kept_tokens"] == 0 and math.isnan(f["estimate"])
    with pytest.raises(ValueError, match="eps"):
        se.batch_figures([1.0], [1], [1], [[1]], [[0.0]], eps=1.5)


def test_toy_policy_step_and_true_reward_against_monte_carlo():
    toy = se.ToyPolicy(drift_nat=0.03, error_prob=2e-3)
    assert toy.step_nat(0) == pytest.approx(0.03, rel=1e-6)
    lp = toy.logprobs([0, 3])
    np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0)
    assert math.exp(lp[0, -1]) == pytest.approx(2e-3)
    assert lp[1, -1] < lp[0, -1]  # политика учится: ошибок меньше
    lengths = [50, 200, 800]
    rng = np.random.default_rng(1)
    t = rng.choice(lengths, size=200_000)
    errors = rng.binomial(t, math.exp(lp[1, -1]))
    mc, se_mc = (errors == 0).mean(), (errors == 0).std() / math.sqrt(t.size)
    assert toy.expected_reward(3, lengths) == pytest.approx(mc, abs=4 * se_mc)
    assert toy.expected_reward(3, lengths) > toy.expected_reward(0, lengths)
    with pytest.raises(ValueError, match="error_prob"):
        se.ToyPolicy(error_prob=0.0)


def _pool(n=400, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 1500, size=n)
    lags = np.clip((lengths / 400).astype(int), 0, 3)  # длинные — чаще несвежие
    return lags.tolist(), lengths.tolist()


def test_unbiased_at_lag_zero_and_spread_matches_binomial():
    lags, lengths = _pool()
    pools = {0: ([0] * len(lengths), lengths)}
    toy = se.ToyPolicy()
    frame = se.stale_experiment(pools, toy, batch=64, repeats=400, reuse_share=0.0, seed=3)
    truth = toy.expected_reward(5, lengths)
    for _, row in frame.iterrows():  # все веса 1: оценка — доля верных в пакете
        assert row["истинное J, %"] == pytest.approx(100 * truth)
        assert abs(row["смещение, п. п."]) <= 3 * row["ст. ошибка смещения, п. п."]
        assert row["разброс, п. п."] == pytest.approx(
            100 * math.sqrt(truth * (1 - truth) / 64), rel=0.15
        )
        assert row["ESS/n, n — сохранённые"] == pytest.approx(1.0)
        assert row["роллаутов сохранено, %"] == pytest.approx(100.0)


def test_strategies_keep_what_they_claim():
    lags, lengths = _pool()
    frame = se.stale_experiment({3: (lags, lengths)}, batch=128, repeats=200, reuse_share=0.0)
    row = frame.set_index("ключ")
    share = np.mean(np.array(lags) <= 1)
    assert row.loc["drop", "роллаутов сохранено, %"] == pytest.approx(100 * share, abs=1.0)
    assert row.loc["drop", "длина сохранённых / всех"] < 1  # отбрасывание смещает к коротким
    assert row.loc["drop", "токенов сохранено, %"] < row.loc["drop", "роллаутов сохранено, %"]
    assert row.loc["truncate", "роллаутов сохранено, %"] == 100.0
    mask = row.loc["mask"]  # маскирование зануляет веса: сохранено не всё и не той длины
    assert mask["роллаутов сохранено, %"] < 100 and mask["длина сохранённых / всех"] < 1
    assert mask["ESS/n, n — сгенерированные"] < mask["ESS/n, n — сохранённые"]
    same = row.loc["as_is"]  # reuse_share = 0: «как есть» и «одно обновление» — одна задержка
    assert same["средняя задержка, версий"] == pytest.approx(np.mean(lags), abs=0.1)


def test_conclusions_follow_the_numbers():
    lags, lengths = _pool()
    frame = se.stale_experiment({0: ([0] * len(lags), lengths), 3: (lags, lengths)}, repeats=50)
    text = se.conclusions(frame)
    top = frame[frame["задержка политики L, версий"] == 3]
    best = top.loc[top["RMSE, п. п."].idxmin(), "стратегия"]
    assert f"меньше всего ошибка у «{best}»" in text[0]
    forced = frame.copy()
    pick = (forced["задержка политики L, версий"] == 3) & (forced["ключ"] == "mask")
    forced.loc[pick, "RMSE, п. п."] = 0.0
    assert "меньше всего ошибка у «маскировать" in se.conclusions(forced)[0]
    rmse = top["RMSE, п. п."].min()
    assert f"RMSE {fmt.num(rmse, 1)} п. п." in text[0] and len(text) == 8
    drop = top.set_index("ключ").loc["drop"]
    assert f"сохранено {fmt.num(drop['роллаутов сохранено, %'], 0)} % роллаутов" in text[2]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pools": {}}, "pools"),
        ({"pools": {1: ([0, 5], [10, 20])}}, r"задержки\[…\]"),
        ({"pools": {1: ([0, 1], [10, 0])}}, r"длины\[…\]"),
        ({"pools": {1: ([0], [10, 20])}}, "одной длины"),
        ({"band": (1.5, 2.0)}, "band"),
        ({"band": None}, "band"),
        ({"batch": 1}, "batch"),
        ({"reuse_share": 2}, "reuse_share"),
    ],
)
def test_bad_arguments_get_russian_errors(kwargs, match):
    args = {"pools": {1: ([0, 1], [10, 20])}, "repeats": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        se.stale_experiment(**args)
