"""Шаг 12.4.4: стратегии для несвежих данных как эксперимент со смещением и разбросом.

Игрушечная задача ``ToyPolicy``: ответ из T независимых токенов верен, если в нём нет ошибочного
токена, поэтому истинное J(π_u) = E_T[(1 − ε_u)^T] известно точно. Задержки и длины роллаутов —
из симуляции конвейера урока 12.3; каждая стратегия оценивает J(π_u) по несвежему пакету
последовательностным весом w = Π_t π_u(y_t)/μ_v(y_t), по повторам видно смещение и разброс.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from course_utils.args import fraction, integer, nonnegative, positive, real
from course_utils.fmt import num
from course_utils.offpolicy import (
    clipped,
    effective_sample_size,
    log_softmax,
    masked_weights,
    truncated_weights,
)

# Ключи стратегий и их подписи в таблице.
_LABELS = {
    "as_is": "как есть",
    "drop": "отбросить задержку > {drop_above}",
    "truncate": "усечь: min(w, {cap:g})",
    "mask": "маскировать w вне [{low:g}, {high:g}]",
    "one_update": "одно обновление на роллаут",
}


@dataclass(frozen=True)
class ToyPolicy:
    """Игрушечная политика: n_neutral нейтральных токенов и один ошибочный (последний), токены
    ответа независимы. Логиты версии v: z_v = z_0 + v·d, нат; d подобрано так, что за версию
    средний |Δ log p| выбранного токена = drift_nat, логит ошибки падает на learn_nat нат,
    p_err(0) = error_prob."""

    n_neutral: int = 15
    error_prob: float = 1e-3
    drift_nat: float = 0.02
    learn_nat: float = 0.1
    seed: int = 0

    def __post_init__(self):
        integer("n_neutral", self.n_neutral, 2)
        real("error_prob", self.error_prob, 0.0, 0.5, low_open=True)
        positive("drift_nat", self.drift_nat)
        nonnegative("learn_nat", self.learn_nat)
        integer("seed", self.seed, 0)

    @cached_property
    def _base(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        z0 = np.append(rng.standard_normal(self.n_neutral), 0.0)
        odds = self.error_prob / (1 - self.error_prob)  # p_err(0) = error_prob
        z0[-1] = math.log(np.exp(z0[:-1]).sum()) + math.log(odds)
        g = np.append(rng.standard_normal(self.n_neutral), 0.0)
        lo, hi = 0.0, 10.0
        for _ in range(60):  # бисекция: средний |Δ log p| за версию растёт с масштабом s
            s = (lo + hi) / 2
            d = s * g
            d[-1] = -self.learn_nat
            shift = _mean_shift(log_softmax(z0), log_softmax(z0 + d))
            lo, hi = (s, hi) if shift < self.drift_nat else (lo, s)
        return z0, d

    def logprobs(self, version) -> np.ndarray:
        """log p_v(k) для версии (или массива версий формы S): массив [S..., n_neutral + 1], нат."""
        z0, d = self._base
        return log_softmax(z0 + np.asarray(version, dtype=float)[..., None] * d)

    def step_nat(self, version: float = 0.0) -> float:
        """E_{y~p_v} |log p_{v+1}(y) − log p_v(y)| — средний сдвиг на токен за одну версию, нат."""
        return _mean_shift(self.logprobs(version), self.logprobs(version + 1))

    def expected_reward(self, version: float, lengths) -> float:
        """Истинное J(π_v) = mean_T (1 − ε_v)^T по длинам задач ``lengths`` (доля верных)."""
        eps = math.exp(float(self.logprobs(version)[-1]))
        t = np.asarray(lengths, dtype=float)
        return float(np.mean((1 - eps) ** t))


def _mean_shift(lp0: np.ndarray, lp1: np.ndarray) -> float:
    """E_{y~p0} |log p1(y) − log p0(y)|, нат."""
    return float((np.exp(lp0) * np.abs(lp1 - lp0)).sum())


def batch_figures(
    weights, lengths, rewards, counts, token_log_ratio, eps: float = 0.2
) -> dict[str, float]:
    """Цифры пакета (веса w̃_i ≥ 0, 0 — не сохранён; длины T_i; награды r_i; counts и
    token_log_ratio [n, K] — вхождения токена k в ответ i и log ρ_ik, нат): доли kept_rollouts и
    kept_tokens, length_ratio, ess (Киша по w̃ > 0), ess_per_kept и ess_per_generated, clip (доля
    токенов, где ``clipped`` при A_i = r_i − mean r), estimate = Σ w̃ r / Σ w̃ (NaN без весов)."""
    eps = real("eps", eps, 0.0, 1.0, low_open=True, high_open=True)
    w = np.asarray(weights, dtype=float)
    t = np.asarray(lengths, dtype=float)
    r = np.asarray(rewards, dtype=float)
    kept = w > 0
    if not kept.any():
        return dict.fromkeys(_FIGURES, float("nan")) | {"kept_rollouts": 0.0, "kept_tokens": 0.0}
    ess = effective_sample_size(w[kept])
    hit = clipped(np.exp(np.asarray(token_log_ratio, dtype=float)), (r - r.mean())[:, None], eps)
    c = np.asarray(counts, dtype=float)
    return {
        "kept_rollouts": float(kept.mean()),
        "kept_tokens": float(t[kept].sum() / t.sum()),
        "length_ratio": float(t[kept].mean() / t.mean()),
        "ess": ess,
        "ess_per_kept": ess / int(kept.sum()),
        "ess_per_generated": ess / w.size,
        "clip": float((c * hit)[kept].sum() / c[kept].sum()),
        "estimate": float((w * r).sum() / w.sum()),
    }


_FIGURES = ("kept_rollouts", "kept_tokens", "length_ratio", "ess", "ess_per_kept")
_FIGURES += ("ess_per_generated", "clip", "estimate")


def stale_experiment(
    pools: dict,
    policy: ToyPolicy | None = None,
    batch: int = 128,
    repeats: int = 200,
    drop_above: int = 1,
    cap: float = 2.0,
    band: tuple[float, float] = (0.5, 2.0),
    eps: float = 0.2,
    reuse_share: float = 0.5,
    seed: int = 0,
) -> pd.DataFrame:
    """Задержка политики L × стратегия (_LABELS): доли сохранённого, ESS/n, клиппирование,
    смещение и разброс оценки J(π_u) = Σ w̃ r / Σ w̃, п. п. pools — {L: (задержки, длины)} из
    симуляции с max_policy_lag = L; repeats пакетов по batch роллаутов с возвращением; u = 5,
    «как есть» берёт роллаут в два обновления (доля reuse_share старше ещё на версию)."""
    policy = ToyPolicy() if policy is None else policy
    batch = integer("batch", batch, 2)
    repeats = integer("repeats", repeats, 2)
    drop_above = integer("drop_above", drop_above, 0)
    cap = positive("cap", cap)
    ok = isinstance(band, tuple | list) and len(band) == 2
    if not ok or not (0 <= real("band[0]", band[0]) < 1 < real("band[1]", band[1])):
        raise ValueError(f"band должно быть (a, b) с 0 ≤ a < 1 < b, получено {band!r}")
    reuse_share = fraction("reuse_share", reuse_share)
    if not isinstance(pools, dict) or not pools:
        raise ValueError("pools должно быть непустым словарём {L: (задержки, длины)}")
    u = 5
    rows = []
    for max_lag, (lags, lengths) in sorted(pools.items()):
        lag_pool = np.asarray([integer("задержки[…]", x, 0, u - 1) for x in lags])
        len_pool = np.asarray([integer("длины[…]", x, 1) for x in lengths])
        if lag_pool.size == 0 or lag_pool.shape != len_pool.shape:
            raise ValueError(f"pools[{max_lag}]: задержки и длины — непустые, одной длины")
        truth = policy.expected_reward(u, len_pool)
        rng = np.random.default_rng([seed, int(max_lag)])
        idx = rng.integers(0, lag_pool.size, size=(repeats, batch))
        extra = (rng.random((repeats, batch)) < reuse_share).astype(int)
        draws = {}
        for name, add in (("reuse", extra), ("once", np.zeros_like(extra))):
            lag = lag_pool[idx] + add
            log_mu = policy.logprobs(u - lag)  # [R, n, K]
            counts = rng.multinomial(len_pool[idx], np.exp(log_mu))
            log_rho = policy.logprobs(u) - log_mu
            draws[name] = (lag, counts, log_rho, (counts * log_rho).sum(-1), counts[..., -1] == 0)
        for kind in _LABELS:
            lag, counts, log_rho, log_w, reward = draws["once" if kind == "one_update" else "reuse"]
            w = np.exp(log_w)  # веса стратегии: 0 — роллаут не сохранён
            if kind == "drop":
                w = np.where(lag <= drop_above, w, 0.0)
            elif kind == "truncate":
                w = truncated_weights(w, cap)[0]  # TIS: min(w, cap)
            elif kind == "mask":
                w = masked_weights(w, *band)[0]  # MIS: w·1[w ∈ band]
            frame = pd.DataFrame(
                batch_figures(w[i], len_pool[idx[i]], reward[i], counts[i], log_rho[i], eps)
                for i in range(repeats)
            )
            est = frame["estimate"].to_numpy()
            bias, spread = 100 * (np.nanmean(est) - truth), 100 * np.nanstd(est, ddof=1)
            label = _LABELS[kind].format(drop_above=drop_above, cap=cap, low=band[0], high=band[1])
            sem = spread / math.sqrt(max(np.isfinite(est).sum(), 1))  # ст. ошибка смещения
            rows.append(
                {
                    "задержка политики L, версий": int(max_lag),
                    "стратегия": label,
                    "ключ": kind,
                    "средняя задержка, версий": float(lag.mean()),
                    "роллаутов сохранено, %": 100 * frame["kept_rollouts"].mean(),
                    "токенов сохранено, %": 100 * frame["kept_tokens"].mean(),
                    "длина сохранённых / всех": frame["length_ratio"].mean(),
                    "ESS/n, n — сохранённые": frame["ess_per_kept"].mean(),
                    "ESS/n, n — сгенерированные": frame["ess_per_generated"].mean(),
                    "клиппирование, % токенов": 100 * frame["clip"].mean(),
                    "истинное J, %": 100 * truth,
                    "смещение, п. п.": bias,
                    "ст. ошибка смещения, п. п.": sem,
                    "разброс, п. п.": spread,
                    "RMSE, п. п.": math.hypot(bias, spread),
                    "повторов без оценки": int(np.isnan(est).sum()),
                }
            )
    return pd.DataFrame(rows)


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + num(float(x), 1)


def _shift(bias: float, se: float, what: str = "оценка") -> str:
    """«завышена/занижена на …» или «не смещена заметно» — по доверительной полосе ±2·SE."""
    if abs(bias) <= 2 * se:
        return f"{what} не смещена заметно ({_signed(bias)} ± {num(2 * se, 1)} п. п.)"
    word = "завышена" if bias > 0 else "занижена"
    return f"{what} {word} на {num(abs(bias), 1)} п. п. (± {num(2 * se, 1)})"


def conclusions(frame: pd.DataFrame) -> list[str]:
    """Выводы по-русски из чисел таблицы ``stale_experiment``: по наибольшей задержке L и по
    сравнению с наименьшей. Каждое число и каждое «больше/меньше» взято из таблицы."""
    col = "задержка политики L, версий"
    lo, hi = int(frame[col].min()), int(frame[col].max())
    at = frame.set_index([col, "ключ"]).loc  # at[L, ключ] — строка таблицы
    top = frame[frame[col] == hi]
    best = top.loc[top["RMSE, п. п."].idxmin()]
    worst = top.loc[top["RMSE, п. п."].idxmax()]
    a0, a1 = at[lo, "as_is"], at[hi, "as_is"]
    drop, trunc, mask, once = (at[hi, k] for k in ("drop", "truncate", "mask", "one_update"))
    once0 = at[lo, "one_update"]
    kr, kt, lr = "роллаутов сохранено, %", "токенов сохранено, %", "длина сохранённых / всех"
    ek, eg = "ESS/n, n — сохранённые", "ESS/n, n — сгенерированные"
    sd, b, se = "разброс, п. п.", "смещение, п. п.", "ст. ошибка смещения, п. п."
    clip = "клиппирование, % токенов"
    return [
        f"При задержке политики L = {hi} меньше всего ошибка у «{best['стратегия']}»: RMSE "
        f"{num(best['RMSE, п. п.'], 1)} п. п. (смещение {_signed(best[b])}, разброс "
        f"{num(best[sd], 1)} п. п.), больше всего — у «{worst['стратегия']}» "
        f"({num(worst['RMSE, п. п.'], 1)} п. п.).",
        f"«{a1['стратегия']}»: {_shift(a1[b], a1[se])} при L = {hi}, но разброс "
        f"{'падает' if a1[sd] < a0[sd] else 'растёт'} с задержкой: {num(a0[sd], 1)} → "
        f"{num(a1[sd], 1)} п. п. при L = {lo} → {hi}, ESS/n {num(a0[ek], 2)} → {num(a1[ek], 2)}.",
        f"«{drop['стратегия']}» при L = {hi}: сохранено {num(drop[kr], 0)} % роллаутов и "
        f"{num(drop[kt], 0)} % токенов, сохранённые в среднем {num(drop[lr], 2)} от длины всех "
        f"({'набор смещён к коротким ответам' if drop[lr] < 1.0 else 'к коротким не смещён'}"
        f"); {_shift(drop[b], drop[se])}; ESS/n {num(drop[ek], 2)} на сохранённый роллаут, но "
        f"{num(drop[eg], 2)} на сгенерированный.",
        f"«{trunc['стратегия']}»: сохранено {num(trunc[kr], 0)} % роллаутов, разброс "
        f"{num(trunc[sd], 1)} п. п. против {num(a1[sd], 1)} у «{a1['стратегия']}», "
        f"{_shift(trunc[b], trunc[se])} — усечение меняет оцениватель.",
        f"«{mask['стратегия']}»: вес 0 у {num(100 - mask[kr], 0)} % роллаутов "
        f"({num(100 - mask[kt], 0)} % токенов), сохранённые — {num(mask[lr], 2)} от длины всех; "
        f"ESS/n {num(mask[ek], 2)} на сохранённый и {num(mask[eg], 2)} на сгенерированный; "
        f"{_shift(mask[b], mask[se])}.",
        f"«{once['стратегия']}»: средняя задержка {num(once['средняя задержка, версий'], 2)} "
        f"вместо {num(a1['средняя задержка, версий'], 2)} версий, разброс {num(once[sd], 1)} "
        f"вместо {num(a1[sd], 1)} п. п., ESS/n {num(once[ek], 2)} вместо {num(a1[ek], 2)}.",
        f"Доля клиппирования PPO «{a1['стратегия']}» "
        f"{'падает' if a1[clip] < a0[clip] else 'растёт' if a1[clip] > a0[clip] else 'не растёт'}"
        f" с задержкой: {num(a0[clip], 3)} → {num(a1[clip], 3)} % токенов, а ESS/n "
        f"последовательностей при L = {hi} — {num(a1[ek], 2)}: "
        + (
            "малые сдвиги на токен почти не выходят за полосу клиппирования, но складываются "
            "по длине ответа."
            if a1[clip] < 1.0
            else "клиппирование заметно, и сдвиги к тому же складываются по длине ответа."
        ),
        f"Контроль: при L = {lo} и одном обновлении на роллаут все веса равны 1, и "
        f"{_shift(once0[b], once0[se], 'оценка J')}.",
    ]
