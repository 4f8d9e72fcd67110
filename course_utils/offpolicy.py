"""Данные другой политики: отношения важности, ESS, клиппирование, TIM (лекция, урок 12.4).

Три политики шага 12.4.1: политика поведения μ_v породила токены в движке, π_old — знаменатель
PPO-подобной цели, π_θ получает градиент. Задержка (lag) — это v < u; рассогласование обучения и
генерации (TIM) — разные вероятности при одной и той же версии весов.

Что здесь есть (шаги 12.4.2–12.4.3; стратегии шага 12.4.4 — ``stale_experiment``):

* ``importance_ratios``: w = exp(log π − log μ) по токенам; ``sequence_log_ratio`` и
  ``sequence_ratios``: log w_seq = Σ_t m_t·(log π_t − log μ_t) по токенам политики (маска m);
* ``effective_sample_size`` и ``normalized_ess``: ESS = (Σw)²/Σw², ESS/n ∈ (0, 1];
* ``clip_fraction``: доля токенов вне полосы [1−ε, 1+ε_high] или доля, где клиппирование
  действительно срабатывает (с учётом знака преимущества, как в TRL/verl/OpenRLHF);
* ``log_ratio_stats``: средний и максимальный |log w|, средний log w (``log_weight_stats`` —
  то же по готовым log w);
* ``behavior_logprob`` и ``raw_logprob``: log-вероятность токена под распределением, из которого
  реально семплировали (температура, top-p с перенормировкой), и под исходным softmax(z/T);
* ``truncated_weights`` (TIS: min(w, C)) и ``masked_weights`` (MIS/IcePop: w·1[a ≤ w ≤ b]);
* ``support_violations``: позиции, где μ = 0, а π > 0 — там w = +inf;
* ``logit_shift_bound``: проверка границы |Δ log p| ≤ 2·max|Δz| для softmax без усечения;
* ``simulate_log_ratios`` и ``expected_ess_fraction``: синтетические log w для графиков ESS/n;
* ``cumulative_log_ratio``, ``position_shift_report`` и ``top_p_flips``: TIM с ростом длины,
  граница 2ε по позициям и перенос токена через границу ядра top-p (шаг 12.4.3);
* ``tim_report``: сводка TIM на нулевой задержке (движок против тренера, одна версия весов).

Функции принимают тензоры torch или массивы numpy (а также списки чисел) и возвращают массивы
того же вида: если среди входов есть тензор torch, результат — тензор на его устройстве
(float64 для float64, иначе float32), иначе — массив numpy. Сводные числа (ESS, доли) —
обычные float. Внутри всё считается в numpy float64 (``behavior_logprob`` — в float32,
как ``policy.sampling_logprobs``).

Соглашения о бесконечностях. log μ = −inf и log π > −inf — нарушение условия поддержки:
log w = +inf, w = +inf; ни одна функция это не прячет: ``importance_ratios`` возвращает inf,
``log_ratio_stats`` показывает inf, ESS, ``truncated_weights`` и ``masked_weights`` поднимают
ValueError со ссылкой на ``support_violations``. Если log π = −inf (целевая политика токен не
выбирает), то w = 0 и log w = −inf — даже если и log μ = −inf. NaN во входах — всегда ошибка,
как и log-вероятность > 0 (больше допуска ``LOGPROB_TOL`` на округление): это вероятность > 1,
обычно переданы сами вероятности вместо их логарифмов.
"""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np

from course_utils.args import integer, is_real, nonnegative, optional_integer, positive, real

__all__ = [
    "LOGPROB_TOL",
    "importance_ratios",
    "log_ratios",
    "sequence_log_ratio",
    "sequence_ratios",
    "effective_sample_size",
    "normalized_ess",
    "clip_fraction",
    "grpo_loss",
    "log_ratio_stats",
    "log_weight_stats",
    "behavior_logprob",
    "raw_logprob",
    "truncated_weights",
    "masked_weights",
    "support_violations",
    "logit_shift_bound",
    "simulate_log_ratios",
    "expected_ess_fraction",
    "cumulative_log_ratio",
    "position_shift_report",
    "top_p_flips",
    "tim_report",
]

# Допуск на округление: log-вероятность до +1e-6 ещё принимается (float32 log_softmax даёт
# +1e-7 там, где точное значение 0); больше — это вероятность > 1, то есть ошибка входа.
LOGPROB_TOL = 1e-6


# --------------------------------------------------------------------------- общие помощники


def _torch():
    """Модуль torch, если он уже импортирован (иначе тензоров torch на входе быть не может)."""
    return sys.modules.get("torch")


def _is_tensor(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


class _Kind:
    """Вид результата: numpy или torch (с устройством и типом первого тензора среди входов)."""

    def __init__(self, *inputs):
        self.tensor = next((x for x in inputs if _is_tensor(x)), None)
        first = next((x for x in inputs if x is not None), None)
        self.np_dtype = np.float64
        if self.tensor is None and isinstance(first, np.ndarray) and first.dtype == np.float32:
            self.np_dtype = np.float32

    def out(self, arr):
        arr = np.asarray(arr)
        if self.tensor is None:
            res = arr.astype(self.np_dtype) if arr.dtype.kind == "f" else arr
            return res[()] if res.ndim == 0 else res
        torch = _torch()
        src = torch.from_numpy(np.array(arr, order="C"))  # 0-d остаётся 0-d
        if arr.dtype.kind == "f":
            dtype = torch.float64 if self.tensor.dtype == torch.float64 else torch.float32
            return src.to(device=self.tensor.device, dtype=dtype)
        return src.to(device=self.tensor.device)


def _to_numpy(x, name: str) -> np.ndarray:
    if x is None:
        raise ValueError(f"{name}: нужен массив, получено None")
    if _is_tensor(x):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.double()
        return x.numpy()
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: не удаётся превратить в числовой массив ({exc})") from exc
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name}: нужен числовой массив (или тензор), получено {arr.dtype}")
    return arr


def _floats(x, name: str, *, allow_neg_inf: bool = True, allow_pos_inf: bool = False):
    """Массив float64 без NaN; ±inf — только если разрешено."""
    arr = _to_numpy(x, name).astype(np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name}: содержит NaN на {int(np.isnan(arr).sum())} позициях")
    if not allow_pos_inf and np.isposinf(arr).any():
        raise ValueError(f"{name}: содержит +inf на {int(np.isposinf(arr).sum())} позициях")
    if not allow_neg_inf and np.isneginf(arr).any():
        raise ValueError(f"{name}: содержит −inf на {int(np.isneginf(arr).sum())} позициях")
    return arr


def _logprobs(x, name: str) -> np.ndarray:
    """Массив log-вероятностей: без NaN и +inf, −inf разрешён (p = 0), значения ≤ LOGPROB_TOL."""
    arr = _floats(x, name)
    above = arr > LOGPROB_TOL
    if above.any():
        raise ValueError(
            f"{name}: log-вероятность должна быть ≤ 0 (допуск {LOGPROB_TOL:g} на округление), "
            f"а на {int(above.sum())} позициях больше, максимум {float(arr.max()):.4g} — "
            "похоже, переданы сами вероятности, а не их логарифмы"
        )
    return arr


def _mask(mask, shape: tuple, name: str = "mask") -> np.ndarray:
    """Булева маска формы ``shape``; None — все позиции учитываются. Значения только 0/1."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = _to_numpy(mask, name)
    if m.shape != tuple(shape):
        raise ValueError(f"{name}: форма {m.shape} не совпадает с формой данных {tuple(shape)}")
    if m.dtype != bool:
        mf = m.astype(np.float64)
        if np.isnan(mf).any() or not np.isin(mf, (0.0, 1.0)).all():
            raise ValueError(f"{name}: допустимы только значения 0 и 1 (или True/False)")
        m = mf == 1.0
    return m


def _same_shape(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} и {name_b}: формы различаются, {a.shape} против {b.shape}")


def _log_ratio_np(lt: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """log w = log π − log μ с соглашениями: π = 0 ⇒ −inf; μ = 0 < π ⇒ +inf."""
    with np.errstate(invalid="ignore"):
        d = lt - lb
    d[np.isneginf(lt)] = -np.inf
    return d


def _logp_pair(logp_target, logp_behavior):
    lt = _logprobs(logp_target, "logp_target")
    lb = _logprobs(logp_behavior, "logp_behavior")
    _same_shape(lt, lb, "logp_target", "logp_behavior")
    return lt, lb


def _ratios(ratios, name: str = "ratios") -> np.ndarray:
    w = _floats(ratios, name, allow_pos_inf=True, allow_neg_inf=False)
    if (w < 0).any():
        raise ValueError(f"{name}: отношения важности неотрицательны, найдено {int((w < 0).sum())}")
    return w


def _no_pos_inf(w: np.ndarray, valid: np.ndarray, name: str) -> None:
    bad = np.isposinf(w) & valid
    if bad.any():
        raise ValueError(
            f"{name}: w = +inf на {int(bad.sum())} позициях — там μ = 0, а π > 0, условие поддержки "
            "нарушено; усечение и маскирование его не восстанавливают (см. support_violations)"
        )


# --------------------------------------------------------------------------- отношения важности


def log_ratios(logp_target, logp_behavior):
    """Поэлементно log w = log π(y) − log μ(y) (π — целевая политика, μ — политика поведения).

    log μ = −inf при log π > −inf даёт +inf (нарушение поддержки), log π = −inf даёт −inf.
    """
    kind = _Kind(logp_target, logp_behavior)
    lt, lb = _logp_pair(logp_target, logp_behavior)
    return kind.out(_log_ratio_np(lt, lb))


def importance_ratios(logp_target, logp_behavior):
    """Поэлементно w = π(y)/μ(y) = exp(log π(y) − log μ(y)).

    Там, где μ = 0, а π > 0 (log μ = −inf), возвращается +inf — это видно, а не спрятано;
    при π = 0 возвращается 0. Форма входов сохраняется.
    """
    kind = _Kind(logp_target, logp_behavior)
    lt, lb = _logp_pair(logp_target, logp_behavior)
    with np.errstate(over="ignore"):
        return kind.out(np.exp(_log_ratio_np(lt, lb)))


def _seq_sum(d: np.ndarray, m: np.ndarray) -> np.ndarray:
    if d.ndim == 0:
        raise ValueError("logp_target: нужна хотя бы одна ось токенов [..., T]")
    masked = np.where(m, d, 0.0)
    pos = (np.isposinf(masked)).any(axis=-1)
    neg = (np.isneginf(masked)).any(axis=-1)
    both = pos & neg
    if both.any():
        rows = np.argwhere(np.atleast_1d(both)).tolist()[:5]
        raise ValueError(
            "log w_seq не определён: в последовательности есть и +inf (μ = 0 < π), и −inf (π = 0); "
            f"последовательности {rows} (см. support_violations)"
        )
    return masked.sum(axis=-1)


def sequence_log_ratio(logp_target, logp_behavior, mask=None):
    """Последовательностный логарифм отношения: log w_seq = Σ_t m_t·(log π_t − log μ_t).

    Сумма идёт по последней оси: [batch, T] → [batch], [T] → скаляр. Маска m (0/1) исключает
    токены запроса и среды — их выбирала не политика.
    """
    kind = _Kind(logp_target, logp_behavior, mask)
    lt, lb = _logp_pair(logp_target, logp_behavior)
    m = _mask(mask, lt.shape)
    return kind.out(_seq_sum(_log_ratio_np(lt, lb), m))


def sequence_ratios(logp_target, logp_behavior, mask=None, mode: str = "product"):
    """Последовательностный вес: ``product`` — w_seq = exp(Σ_t m_t·log w_t) = Π_t w_t;
    ``geometric`` — среднее геометрическое exp(Σ_t m_t·log w_t / Σ_t m_t).

    Последовательность без токенов политики получает вес 1. К результату применимы
    ``truncated_weights`` и ``masked_weights`` (последовательностные TIS и маскирование).
    """
    if mode not in ("product", "geometric"):
        raise ValueError(f"mode: допустимы 'product' и 'geometric', получено {mode!r}")
    kind = _Kind(logp_target, logp_behavior, mask)
    lt, lb = _logp_pair(logp_target, logp_behavior)
    m = _mask(mask, lt.shape)
    s = _seq_sum(_log_ratio_np(lt, lb), m)
    if mode == "geometric":
        s = s / np.maximum(m.sum(axis=-1), 1)
    with np.errstate(over="ignore"):
        return kind.out(np.exp(s))


# --------------------------------------------------------------------------- ESS


def _ess(weights, mask, log: bool) -> tuple[float, int]:
    name = "log_weights" if log else "weights"
    w = _floats(weights, name, allow_pos_inf=True, allow_neg_inf=log)
    m = _mask(mask, w.shape)
    v = w[m]
    if v.size == 0:
        raise ValueError(f"{name}: после маски не осталось ни одного веса")
    if np.isposinf(v).any():
        raise ValueError(
            f"{name}: вес +inf на {int(np.isposinf(v).sum())} позициях — нарушено условие "
            "поддержки (μ = 0, π > 0), ESS не определён (см. support_violations)"
        )
    if log:
        if np.isneginf(v).all():
            raise ValueError("log_weights: все веса равны нулю (log w = −inf), ESS не определён")
        v = np.exp(v - v.max())
    else:
        if (v < 0).any():
            raise ValueError(f"weights: веса должны быть ≥ 0, найдено {int((v < 0).sum())} < 0")
        top = v.max()
        if top == 0:
            raise ValueError("weights: все веса равны нулю, ESS не определён")
        v = v / top  # масштаб не влияет на ESS, а переполнение в квадрате исчезает
    n = int(v.size)
    ess = float(v.sum() ** 2 / np.square(v).sum())
    return min(max(ess, 1.0), float(n)), n


def effective_sample_size(weights, mask=None, *, log: bool = False) -> float:
    """Эффективный размер выборки Киша: ESS = (Σ_i w_i)² / Σ_i w_i², 1 ≤ ESS ≤ n.

    Веса неотрицательны и конечны; ESS не меняется при умножении всех весов на константу.
    ``log=True`` — на входе log w (устойчиво для длинных последовательностей, −inf — нулевой вес).
    Маска (0/1) выбирает учитываемые веса. Диагностика концентрации, а не доказательство
    несмещённости.
    """
    return _ess(weights, mask, log)[0]


def normalized_ess(weights, mask=None, *, log: bool = False) -> float:
    """ESS/n ∈ (0, 1], где n — число учтённых весов; 1 — все веса равны."""
    ess, n = _ess(weights, mask, log)
    return ess / n


# --------------------------------------------------------------------------- клиппирование


def clipped(ratio, advantages, eps: float = 0.2, eps_high: float | None = None):
    """Где клиппированный член PPO активен (его градиент 0): ρ > 1+ε_high при A > 0 или
    ρ < 1−ε при A < 0. Поэлементно для массивов numpy и тензоров torch одной формы (булев)."""
    eps_high = eps if eps_high is None else eps_high
    return ((ratio > 1 + eps_high) & (advantages > 0)) | ((ratio < 1 - eps) & (advantages < 0))


def grpo_loss(new_logp, old_logp, advantages, mask=None, *, clip_eps: float = 0.2, num_tokens=None):
    """Клиппированная потеря PPO/GRPO по токенам (тензоры torch одной формы), нат·ед. A.

    ρ_t = exp(log π_θ − log π_old), L = −(1/N) Σ_t m_t · min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t).
    N — num_tokens, если задано (накопление по микропакетам: N всего пакета), иначе Σ m_t
    (без маски — число токенов). Одна формула для policy.grpo_step и учебного запуска ToyRLRun.
    """
    ratio = (new_logp - old_logp).exp()  # ρ_t, безразмерное
    surr = ratio * advantages
    surr = surr.minimum(ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    if mask is not None:
        surr = surr * mask
    if num_tokens is not None:
        return -surr.sum() / num_tokens
    return -surr.mean() if mask is None else -surr.sum() / mask.sum().clamp(min=1)


def clip_fraction(ratios, eps: float = 0.2, advantages=None, mask=None, eps_high=None) -> float:
    """Доля клиппирования PPO среди токенов маски.

    Без преимуществ — доля r вне полосы [1 − ε, 1 + ε_high] (ε_high = ε, если не задан).
    С преимуществами A — доля токенов, где клиппирование срабатывает:
    (r > 1 + ε_high и A > 0) или (r < 1 − ε и A < 0), как ``clip_ratio`` в TRL.
    A — по токену (форма r) или по последовательности (форма r без последней оси).
    """
    eps = positive("eps", eps)
    if eps >= 1:
        raise ValueError(f"eps должно лежать в (0, 1): нижняя граница 1 − eps ≤ 0, получено {eps}")
    eps_high = eps if eps_high is None else positive("eps_high", eps_high)
    r = _ratios(ratios)
    m = _mask(mask, r.shape)
    if not m.any():
        raise ValueError("mask: не осталось ни одного токена, доля не определена")
    low, high = r < 1 - eps, r > 1 + eps_high
    if advantages is None:
        hit = low | high
    else:
        a = _floats(advantages, "advantages", allow_neg_inf=False)
        if a.shape == r.shape[:-1] and r.ndim >= 1:
            a = a[..., None]
        elif a.shape != r.shape:
            raise ValueError(
                f"advantages: форма {a.shape} не подходит; нужна {r.shape} (по токену) "
                f"или {r.shape[:-1]} (по последовательности)"
            )
        hit = clipped(r, a, eps, eps_high)
    return float((hit & m).sum() / m.sum())


def log_ratio_stats(logp_target, logp_behavior, mask=None) -> dict:
    """Сводка log w = log π − log μ по токенам маски.

    Ключи: ``mean_abs_log_ratio`` (средний |log w|), ``max_abs_log_ratio`` (max |log w|),
    ``mean_log_ratio`` (средний log w), ``min_log_ratio``, ``max_log_ratio``, ``n_tokens``,
    ``support_violations`` (число позиций с μ = 0 < π). Бесконечности не прячутся: при
    нарушении поддержки максимум равен inf; среднее при одновременных +inf и −inf — NaN.
    """
    lt, lb = _logp_pair(logp_target, logp_behavior)
    m = _mask(mask, lt.shape)
    return _log_w_stats(_log_ratio_np(lt, lb)[m])


def log_weight_stats(log_weights, mask=None) -> dict:
    """Та же сводка, что у ``log_ratio_stats``, по уже посчитанным log w (например, из
    ``simulate_log_ratios`` или np.log(w)); log w может быть любого знака, +inf — нарушение поддержки.
    """
    d = _floats(log_weights, "log_weights", allow_pos_inf=True)
    return _log_w_stats(d[_mask(mask, d.shape)])


def _log_w_stats(d: np.ndarray) -> dict:
    if d.size == 0:
        raise ValueError("mask: не осталось ни одного токена")
    with np.errstate(invalid="ignore"):
        mean = float(d.mean())
    return {
        "mean_abs_log_ratio": float(np.abs(d).mean()),
        "max_abs_log_ratio": float(np.abs(d).max()),
        "mean_log_ratio": mean,
        "min_log_ratio": float(d.min()),
        "max_log_ratio": float(d.max()),
        "n_tokens": int(d.size),
        "support_violations": int(np.isposinf(d).sum()),
    }


# --------------------------------------------------------------------------- log μ после декодирования


def _token_logprob(logits, token, temperature, top_p):
    from course_utils.policy import sampling_logprobs

    torch = __import__("torch")
    kind = _Kind(logits)
    if _is_tensor(logits):
        z = logits
    else:
        arr = _floats(logits, "logits")
        z = torch.from_numpy(arr)
    if z.dim() < 1 or z.shape[-1] < 1:
        raise ValueError("logits: нужна форма [..., vocab]")
    if torch.isnan(z).any() or torch.isposinf(z).any():
        raise ValueError("logits: содержит NaN или +inf")
    tok = _to_numpy(token, "token")
    if tok.dtype.kind not in "iu":
        raise ValueError(f"token: нужны целые номера токенов, получено {tok.dtype}")
    if tok.shape != tuple(z.shape[:-1]):
        raise ValueError(
            f"token: форма {tok.shape}, а logits без оси словаря — {tuple(z.shape[:-1])}"
        )
    vocab = z.shape[-1]
    if (tok < 0).any() or (tok >= vocab).any():
        raise ValueError(f"token: номер вне словаря [0, {vocab})")
    lp = sampling_logprobs(z, real("temperature", temperature), real("top_p", top_p))
    idx = torch.from_numpy(tok.astype(np.int64)).to(lp.device)
    out = lp.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    if kind.tensor is not None:
        return out
    res = out.detach().cpu().numpy()
    return res[()] if res.ndim == 0 else res


def behavior_logprob(logits, token, temperature: float = 1.0, top_p: float = 1.0):
    """log μ(y) — логарифм вероятности токена под распределением, из которого реально семплировали:
    z = logits/T, токены вне ядра top-p получают −inf, затем log μ(y) = z_y − logsumexp(z ядра).

    ``logits`` — [..., vocab], ``token`` — целые номера формы [...] (для [vocab] — одно число).
    Токен вне ядра top-p получает −inf. Считается через ``policy.sampling_logprobs`` (float32).
    """
    return _token_logprob(logits, token, temperature, top_p)


def raw_logprob(logits, token, temperature: float = 1.0):
    """log softmax(z/T)_y без усечения top-p — НЕ политика поведения, если движок усекал ядро.

    Разница ``behavior_logprob − raw_logprob`` = −log(масса ядра top-p) ≥ 0 для токенов ядра.
    """
    return _token_logprob(logits, token, temperature, 1.0)


# --------------------------------------------------------------------------- усечение и маскирование


def truncated_weights(ratios, cap: float, mask=None):
    """Усечённые веса (TIS): w̃ = min(w, C). Возвращает (w̃, доля токенов маски с w > C).

    Позиции вне маски получают вес 0. w = +inf (нарушение поддержки) — ошибка: усечение
    отсутствующую поддержку не восстанавливает.
    """
    cap = positive("cap", cap)
    kind = _Kind(ratios, mask)
    w = _ratios(ratios)
    m = _mask(mask, w.shape)
    if not m.any():
        raise ValueError("mask: не осталось ни одного токена")
    _no_pos_inf(w, m, "ratios")
    hit = (w > cap) & m
    out = np.where(m, np.minimum(w, cap), 0.0)
    return kind.out(out), float(hit.sum() / m.sum())


def masked_weights(ratios, low: float, high: float, mask=None):
    """Маскированные веса (MIS/IcePop): w̃ = w·1[a ≤ w ≤ b]. Возвращает (w̃, доля токенов маски
    вне [a, b]).

    Позиции вне маски получают вес 0. 0 ≤ a < b (b может быть inf). w = +inf — ошибка
    (нарушение поддержки не прячется за нулевым весом).
    """
    low = nonnegative("low", low)
    if not (is_real(high) and high > 0) and not (
        isinstance(high, numbers.Real) and high == math.inf
    ):
        raise ValueError(f"high должно быть числом > 0 (можно inf), получено {high!r}")
    high = float(high)
    if low >= high:
        raise ValueError(f"нужно 0 ≤ low < high, получено low={low}, high={high}")
    kind = _Kind(ratios, mask)
    w = _ratios(ratios)
    m = _mask(mask, w.shape)
    if not m.any():
        raise ValueError("mask: не осталось ни одного токена")
    _no_pos_inf(w, m, "ratios")
    inside = (w >= low) & (w <= high)
    out = np.where(m & inside, w, 0.0)
    return kind.out(out), float((m & ~inside).sum() / m.sum())


# --------------------------------------------------------------------------- условие поддержки


def support_violations(logp_target, logp_behavior, mask=None) -> dict:
    """Позиции, где μ(y) = 0 (log μ = −inf), а π(y) > 0: там w = π/μ = +inf.

    Возвращает словарь: ``count``, ``share`` (доля позиций маски), ``indices`` (массив
    [count, ndim] номеров позиций, того же вида, что вход), ``target_mass`` — Σ π(y) по этим
    позициям (для входов [..., vocab] — масса целевой политики вне носителя μ).
    """
    kind = _Kind(logp_target, logp_behavior, mask)
    lt, lb = _logp_pair(logp_target, logp_behavior)
    m = _mask(mask, lt.shape)
    bad = np.isneginf(lb) & ~np.isneginf(lt) & m
    n = int(m.sum())
    return {
        "count": int(bad.sum()),
        "share": float(bad.sum() / n) if n else 0.0,
        "indices": kind.out(np.argwhere(bad).astype(np.int64)),
        "target_mass": float(np.exp(lt[bad]).sum()),
    }


def logit_shift_bound(logits_a, logits_b, temperature: float = 1.0) -> dict:
    """Проверка границы шага 12.4.3: при max_i |Δz_i| ≤ ε для softmax без усечения
    |Δ log p_i| ≤ 2ε для любого токена (z = logits/T).

    Возвращает ``max_abs_logit_diff`` (ε), ``max_abs_logprob_diff``, ``bound`` (2ε) и ``holds``.
    """
    temperature = positive("temperature", temperature)
    za = _floats(logits_a, "logits_a", allow_neg_inf=False) / temperature
    zb = _floats(logits_b, "logits_b", allow_neg_inf=False) / temperature
    _same_shape(za, zb, "logits_a", "logits_b")
    if za.ndim < 1 or za.shape[-1] < 1:
        raise ValueError("logits_a: нужна форма [..., vocab]")

    eps = float(np.abs(za - zb).max())
    dlp = float(np.abs(_log_softmax_np(za) - _log_softmax_np(zb)).max())
    return {
        "max_abs_logit_diff": eps,
        "max_abs_logprob_diff": dlp,
        "bound": 2 * eps,
        "holds": dlp <= 2 * eps * (1 + 1e-9) + 1e-12,
    }


# --------------------------------------------------------------------------- симуляция


def _sigma(lag: int, sigma_per_lag: float, sigma_tim: float) -> float:
    return math.sqrt(sigma_tim**2 + (sigma_per_lag * lag) ** 2)


def simulate_log_ratios(
    lag: int,
    length: int,
    n: int,
    sigma_per_lag: float = 0.02,
    sigma_tim: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Синтетические токеновые log w формы [n, length] для графиков ESS/n (массив numpy).

    log w_t ~ N(−σ²/2, σ²) независимо, σ = sqrt(σ_tim² + (σ_lag·lag)²): разброс растёт с задержкой,
    среднее −σ²/2 даёт E[w] = 1, как у настоящих отношений E_μ[π/μ] = 1. Коэффициенты
    иллюстративные, а не измеренные: реальные log w коррелированы и зависят от модели и шага.
    Для последовательностей log w_seq ~ N(·, length·σ²) и ESS/n → exp(−length·σ²).
    """
    lag = integer("lag", lag, 0)
    length = integer("length", length, 1)
    n = integer("n", n, 1)
    sigma_per_lag = nonnegative("sigma_per_lag", sigma_per_lag)
    sigma_tim = nonnegative("sigma_tim", sigma_tim)
    sigma = _sigma(lag, sigma_per_lag, sigma_tim)
    rng = np.random.default_rng(optional_integer("seed", seed, 0))
    return rng.normal(-(sigma**2) / 2, sigma, size=(n, length))


def expected_ess_fraction(
    lag: int, length: int = 1, sigma_per_lag: float = 0.02, sigma_tim: float = 0.0
) -> float:
    """Предел ESS/n при n → ∞ для модели ``simulate_log_ratios``: exp(−length·σ²).

    Для логнормальных весов w = e^X, X ~ N(m, s²): (E w)²/E w² = e^{−s²}; у последовательности
    s² = length·σ², у отдельного токена length = 1.
    """
    lag = integer("lag", lag, 0)
    length = integer("length", length, 1)
    sigma_per_lag = nonnegative("sigma_per_lag", sigma_per_lag)
    sigma_tim = nonnegative("sigma_tim", sigma_tim)
    return math.exp(-length * _sigma(lag, sigma_per_lag, sigma_tim) ** 2)


def cumulative_log_ratio(logp_target, logp_behavior, mask=None):
    """Лог-отношение префиксов: log w_seq(t) = Σ_{s≤t} m_s·(log π_s − log μ_s), нат.

    Накопленная сумма по последней оси, форма входа сохраняется: элемент t — лог-отношение
    первых t + 1 токенов, последний — ``sequence_log_ratio``. Так видно, как TIM и задержка
    накапливаются с длиной ответа.
    """
    kind = _Kind(logp_target, logp_behavior, mask)
    lt, lb = _logp_pair(logp_target, logp_behavior)
    m = _mask(mask, lt.shape)
    d = _log_ratio_np(lt, lb)
    _seq_sum(d, m)  # +inf и −inf в одной последовательности — ошибка, как у sequence_log_ratio
    return kind.out(np.cumsum(np.where(m, d, 0.0), axis=-1))


_ROWS = 64  # позиций за раз: логиты словаря в 150 тысяч токенов не копируются во float64 целиком


def _logit_pair(logits_a, logits_b, name_a: str, name_b: str, temperature: float):
    """Пары кусков [≤ _ROWS, vocab] логитов a и b (float64, z = logits/T) и форма [..., vocab]."""
    shapes = [tuple(x.shape) if hasattr(x, "shape") else np.shape(x) for x in (logits_a, logits_b)]
    if shapes[0] != shapes[1]:
        raise ValueError(f"{name_a} и {name_b}: формы различаются, {shapes[0]} против {shapes[1]}")
    shape = shapes[0]
    if len(shape) < 1 or shape[-1] < 2:
        raise ValueError(f"{name_a}: нужна форма [..., vocab] со словарём ≥ 2, получено {shape}")
    flat = [x.reshape(-1, shape[-1]) if hasattr(x, "reshape") else np.reshape(x, (-1, shape[-1]))
            for x in (logits_a, logits_b)]  # fmt: skip

    def chunks():
        for start in range(0, flat[0].shape[0], _ROWS):
            yield tuple(
                _floats(f[start : start + _ROWS], name, allow_neg_inf=False) / temperature
                for f, name in zip(flat, (name_a, name_b))
            )

    return chunks(), shape


def _log_softmax_np(z: np.ndarray) -> np.ndarray:
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


def position_shift_report(logits_target, logits_behavior, tokens, temperature: float = 1.0) -> dict:
    """TIM по позициям для одних и тех же токенов y_t (логиты [..., T, vocab], z = logits/T).

    По позициям: ``eps`` — ε_t = max_i |Δz_{t,i}|; ``log_ratio`` — log w_t = log π(y_t) − log μ(y_t)
    (π — softmax(z_target), μ — softmax(z_behavior), без усечения); ``cum_log_ratio`` —
    log w_seq(t); ``cum_bound`` — Σ_{s≤t} 2ε_s ≥ |log w_seq(t)| (граница шага 12.4.3 по токенам,
    сложенная по длине). Сводка: ``eps_max`` (ε — наибольший сдвиг логитов), ``bound`` = 2ε,
    ``max_abs_log_ratio`` (наибольший |log w_t|), ``holds`` — |log w_t| ≤ 2ε_t на всех позициях.
    Всё в натах, массивы numpy формы [..., T].
    """
    temperature = positive("temperature", temperature)
    pairs, shape = _logit_pair(
        logits_target, logits_behavior, "logits_target", "logits_behavior", temperature
    )
    tok = _to_numpy(tokens, "tokens")
    if tok.dtype.kind not in "iu" or tok.shape != shape[:-1]:
        raise ValueError(f"tokens: нужны целые номера формы {shape[:-1]}, получено {tok.shape}")
    if (tok < 0).any() or (tok >= shape[-1]).any():
        raise ValueError(f"tokens: номер вне словаря [0, {shape[-1]})")
    flat_tok = tok.reshape(-1, 1).astype(np.int64)
    eps, d, start = [], [], 0
    for za, zb in pairs:
        y = flat_tok[start : start + len(za)]
        start += len(za)
        eps.append(np.abs(za - zb).max(axis=-1))
        gap = _log_softmax_np(za) - _log_softmax_np(zb)
        d.append(np.take_along_axis(gap, y, -1)[:, 0])
    eps, d = np.concatenate(eps).reshape(shape[:-1]), np.concatenate(d).reshape(shape[:-1])
    return {
        "eps": eps,
        "log_ratio": d,
        "cum_log_ratio": np.cumsum(d, axis=-1),
        "cum_bound": np.cumsum(2 * eps, axis=-1),
        "eps_max": float(eps.max()),
        "bound": 2 * float(eps.max()),
        "max_abs_log_ratio": float(np.abs(d).max()),
        "holds": bool((np.abs(d) <= 2 * eps * (1 + 1e-9) + 1e-12).all()),
    }


def _nucleus(z: np.ndarray, top_p: float):
    """p = softmax(z), масса более вероятных токенов и членство в ядре top-p (масса до токена < p)."""
    p = np.exp(_log_softmax_np(z))
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, -1)
    above = np.empty_like(p)
    np.put_along_axis(above, order, np.cumsum(sorted_p, axis=-1) - sorted_p, -1)
    return p, above, above < top_p


def top_p_flips(logits_a, logits_b, top_p: float, temperature: float = 1.0, limit: int = 5) -> dict:
    """Позиции, где сдвиг логитов переносит токен через границу ядра top-p.

    Ядро — наименьшее множество самых вероятных токенов softmax(z/T) с массой ≥ p (как в
    ``policy.sampling_logprobs``). Токен в ядре a, но не в ядре b (или наоборот) получает у b
    вероятность 0: log μ = −inf, отношение π/μ не определено (``support_violations``), и
    перенормировка ядра меняет вероятности остальных токенов. Возвращает ``count`` (позиций
    с разным ядром), ``share`` (их доля), ``positions`` (индексы [count, ndim − 1]) и
    ``examples`` — до ``limit`` словарей: position, token, p_a и p_b (до усечения), mass_above_a
    и mass_above_b (масса более вероятных токенов), in_a, in_b.
    """
    top_p = real("top_p", top_p, 0.0, 1.0, low_open=True)
    temperature = positive("temperature", temperature)
    limit = integer("limit", limit, 0)
    pairs, shape = _logit_pair(logits_a, logits_b, "logits_a", "logits_b", temperature)
    differ_rows, examples, start = [], [], 0
    for za, zb in pairs:
        (pa, above_a, in_a), (pb, above_b, in_b) = _nucleus(za, top_p), _nucleus(zb, top_p)
        differ = in_a != in_b
        rows = differ.any(axis=-1)
        differ_rows.append(rows)
        for i in np.flatnonzero(rows)[: max(limit - len(examples), 0)]:
            tok = int(np.flatnonzero(differ[i])[0])
            key = tuple(int(k) for k in np.unravel_index(start + i, shape[:-1]))
            examples.append({
                "position": key, "token": tok, "p_a": float(pa[i, tok]), "p_b": float(pb[i, tok]),
                "mass_above_a": float(above_a[i, tok]), "mass_above_b": float(above_b[i, tok]),
                "in_a": bool(in_a[i, tok]), "in_b": bool(in_b[i, tok]),
            })  # fmt: skip
        start += len(za)
    rows = np.concatenate(differ_rows).reshape(shape[:-1])
    return {
        "count": int(rows.sum()),
        "share": float(rows.mean()),
        "positions": np.argwhere(rows).astype(np.int64),
        "examples": examples,
    }


# --------------------------------------------------------------------------- TIM


def _is_ragged(x) -> bool:
    return (
        isinstance(x, (list, tuple))
        and len(x) > 0
        and all(_is_tensor(s) or isinstance(s, (list, tuple, np.ndarray)) for s in x)
    )


def _pad(seqs, name: str):
    rows = [_logprobs(s, f"{name}[{i}]") for i, s in enumerate(seqs)]
    for i, r in enumerate(rows):
        if r.ndim != 1:
            raise ValueError(f"{name}[{i}]: нужна одномерная последовательность, форма {r.shape}")
    width = max((len(r) for r in rows), default=0)
    out = np.zeros((len(rows), width))
    m = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
        m[i, : len(r)] = True
    return out, m, [len(r) for r in rows]


def tim_report(engine_logprobs, trainer_logprobs, mask=None, threshold: float = 1e-3) -> dict:
    """Сводка рассогласования обучения и генерации (TIM) на одной версии весов.

    Δ_t = log π_trainer(y_t) − log μ_engine(y_t) по токенам политики (= log w). Входы — массивы
    [batch, T] с маской (0/1) или списки одномерных последовательностей разной длины (тогда
    маска не нужна). Ключи: ``n_sequences``, ``n_tokens``, ``abs_delta_mean``, ``abs_delta_p99``,
    ``abs_delta_max``, ``mean_delta``, ``share_above_threshold`` (доля |Δ| > threshold),
    ``threshold``, ``seq_log_ratio`` (Σ_t Δ_t по последовательности, вид как у входа),
    ``seq_abs_log_ratio_max``, ``token_ess_fraction`` и ``seq_ess_fraction`` (ESS/n по токенам
    и по последовательностям; NaN при нарушении поддержки), ``support_violations``.
    """
    threshold = positive("threshold", threshold)
    kind = _Kind(*(x[0] if _is_ragged(x) else x for x in (engine_logprobs, trainer_logprobs)))
    if _is_ragged(engine_logprobs) or _is_ragged(trainer_logprobs):
        if not (_is_ragged(engine_logprobs) and _is_ragged(trainer_logprobs)):
            raise ValueError(
                "engine_logprobs и trainer_logprobs: оба должны быть списками последовательностей"
            )
        if mask is not None:
            raise ValueError(
                "mask: для списков последовательностей маска не нужна (задаётся длиной)"
            )
        lb, m, len_e = _pad(engine_logprobs, "engine_logprobs")
        lt, _, len_t = _pad(trainer_logprobs, "trainer_logprobs")
        if len_e != len_t:
            diff = [i for i, (a, b) in enumerate(zip(len_e, len_t)) if a != b][:5]
            raise ValueError(
                f"engine_logprobs и trainer_logprobs: разное число последовательностей "
                f"({len(len_e)} и {len(len_t)}) или разные длины (последовательности {diff})"
            )
    else:
        lb = _logprobs(engine_logprobs, "engine_logprobs")
        lt = _logprobs(trainer_logprobs, "trainer_logprobs")
        _same_shape(lb, lt, "engine_logprobs", "trainer_logprobs")
        if lb.ndim != 2:
            raise ValueError(f"engine_logprobs: нужна форма [batch, T], получено {lb.shape}")
        m = _mask(mask, lb.shape)
    if not m.any():
        raise ValueError("нет ни одного токена политики для сравнения")
    d_all = _log_ratio_np(lt, lb)
    d = d_all[m]
    ad = np.abs(d)
    finite = np.isfinite(ad).all()
    seq = _seq_sum(d_all, m)
    violations = int(support_violations(lt, lb, m)["count"])
    valid_rows = m.any(axis=-1)
    if violations:
        token_ess = seq_ess = float("nan")
    else:
        token_ess = normalized_ess(d, log=True)
        seq_ess = normalized_ess(seq[valid_rows], log=True)
    with np.errstate(invalid="ignore"):
        mean_delta = float(d.mean())
    return {
        "n_sequences": int(lb.shape[0]),
        "n_tokens": int(m.sum()),
        "abs_delta_mean": float(ad.mean()),
        "abs_delta_p99": float(np.percentile(ad, 99, method="linear" if finite else "higher")),
        "abs_delta_max": float(ad.max()),
        "mean_delta": mean_delta,
        "share_above_threshold": float((ad > threshold).mean()),
        "threshold": threshold,
        "seq_log_ratio": kind.out(seq),
        "seq_abs_log_ratio_max": float(np.abs(seq[valid_rows]).max()),
        "token_ess_fraction": token_ess,
        "seq_ess_fraction": seq_ess,
        "support_violations": violations,
    }
