"""Данные другой политики (урок 12.4): отношения важности, ESS, клиппирование, TIM.

μ_v — политика поведения (движок), π_old — знаменатель PPO-подобной цели, π_θ — обучаемая;
задержка — v < u, TIM — разные вероятности при одной версии весов. Входы — torch, numpy или
списки; результат — массив numpy float64, сводки — float. μ = 0 < π даёт log w = +inf
(``support_violations``), π = 0 — w = 0; NaN и log-вероятность > ``_LOGPROB_TOL`` — ошибка входа.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from course_utils.args import integer, is_number, nonnegative, optional_integer, positive, real

# Допуск на округление: log-вероятность до +1e-6 ещё принимается (float32 log_softmax даёт
# +1e-7 там, где точное значение 0); больше — это вероятность > 1, то есть ошибка входа.
_LOGPROB_TOL = 1e-6


# --------------------------------------------------------------------------- общие помощники


def _is_tensor(x) -> bool:
    """Тензор torch (если torch не импортирован, тензоров на входе быть не может)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _to_numpy(x, name: str) -> np.ndarray:
    if x is None:
        raise ValueError(f"{name}: нужен массив, получено None")
    if _is_tensor(x):
        x = x.detach().cpu()
        return (x.double() if x.is_floating_point() else x).numpy()
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
    """Массив log-вероятностей: без NaN и +inf, −inf разрешён (p = 0), значения ≤ _LOGPROB_TOL."""
    arr = _floats(x, name)
    above = arr > _LOGPROB_TOL
    if above.any():
        raise ValueError(
            f"{name}: log-вероятность должна быть ≤ 0 (допуск {_LOGPROB_TOL:g} на округление), "
            f"а на {int(above.sum())} позициях больше, максимум {float(arr.max()):.4g} — "
            "похоже, переданы сами вероятности, а не их логарифмы"
        )
    return arr


def _mask(mask, shape: tuple) -> np.ndarray:
    """Булева маска формы ``shape``; None — все позиции учитываются. Значения только 0/1."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = _to_numpy(mask, "mask")
    if m.shape != tuple(shape):
        raise ValueError(f"mask: форма {m.shape} не совпадает с формой данных {tuple(shape)}")
    mf = m.astype(np.float64)
    if not np.isin(mf, (0.0, 1.0)).all():
        raise ValueError("mask: допустимы только значения 0 и 1 (или True/False)")
    return mf == 1.0


def _pair(logp_target, logp_behavior, mask=None):
    """Проверенные log π и log μ одной формы и маска (None — все позиции)."""
    lt, lb = _logprobs(logp_target, "logp_target"), _logprobs(logp_behavior, "logp_behavior")
    if lt.shape != lb.shape:
        raise ValueError(f"logp_target и logp_behavior: формы различаются, {lt.shape} и {lb.shape}")
    return lt, lb, _mask(mask, lt.shape)


def _log_ratio_np(lt: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """log w = log π − log μ с соглашениями: π = 0 ⇒ −inf; μ = 0 < π ⇒ +inf."""
    with np.errstate(invalid="ignore"):
        d = lt - lb
    d[np.isneginf(lt)] = -np.inf
    return d


def _ratios(ratios, *, weights: bool) -> np.ndarray:
    """Непустые отношения w ≥ 0; weights=True — веса TIS/MIS, там w = +inf — ошибка."""
    w = _floats(ratios, "ratios", allow_pos_inf=True, allow_neg_inf=False)
    if (w < 0).any():
        raise ValueError(f"ratios: отношения важности неотрицательны, найдено {int((w < 0).sum())}")
    if w.size == 0:
        what = "веса" if weights else "токена, доля не определена"
        raise ValueError(f"ratios: нет ни одного {what}")
    bad = np.isposinf(w)
    if weights and bad.any():
        raise ValueError(
            f"ratios: w = +inf на {int(bad.sum())} позициях — там μ = 0, а π > 0, условие поддержки "
            "нарушено; усечение и маскирование его не восстанавливают (см. support_violations)"
        )
    return w


def log_softmax(z: np.ndarray) -> np.ndarray:
    """log softmax по последней оси: z_i − max z − log Σ_j exp(z_j − max z), нат."""
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


# --------------------------------------------------------------------------- отношения важности


def importance_ratios(logp_target, logp_behavior):
    """Поэлементно w = π(y)/μ(y) = exp(log π(y) − log μ(y)); μ = 0 < π даёт +inf, π = 0 — 0."""
    lt, lb, _ = _pair(logp_target, logp_behavior)
    with np.errstate(over="ignore"):
        return np.exp(_log_ratio_np(lt, lb))[()]


def _seq_sum(d: np.ndarray, m: np.ndarray) -> np.ndarray:
    if d.ndim == 0:
        raise ValueError("logp_target: нужна хотя бы одна ось токенов [..., T]")
    masked = np.where(m, d, 0.0)
    both = np.isposinf(masked).any(axis=-1) & np.isneginf(masked).any(axis=-1)
    if both.any():
        rows = np.argwhere(np.atleast_1d(both)).tolist()[:5]
        raise ValueError(
            "log w_seq не определён: в последовательности есть и +inf (μ = 0 < π), и −inf (π = 0); "
            f"последовательности {rows} (см. support_violations)"
        )
    return masked.sum(axis=-1)


def sequence_log_ratio(logp_target, logp_behavior, mask=None):
    """Последовательностный логарифм отношения: log w_seq = Σ_t m_t·(log π_t − log μ_t), нат.
    Сумма по последней оси; маска m (0/1) исключает токены запроса и среды — не политики."""
    lt, lb, m = _pair(logp_target, logp_behavior, mask)
    return _seq_sum(_log_ratio_np(lt, lb), m)[()]


# --------------------------------------------------------------------------- ESS


def _ess(weights, log: bool) -> tuple[float, int]:
    name = "log_weights" if log else "weights"
    v = _floats(weights, name, allow_pos_inf=True, allow_neg_inf=log).ravel()
    if v.size == 0:
        raise ValueError(f"{name}: нет ни одного веса")
    if np.isposinf(v).any():
        raise ValueError(
            f"{name}: вес +inf на {int(np.isposinf(v).sum())} позициях — нарушено условие "
            "поддержки (μ = 0, π > 0), ESS не определён (см. support_violations)"
        )
    if not log and (v < 0).any():
        raise ValueError(f"weights: веса должны быть ≥ 0, найдено {int((v < 0).sum())} < 0")
    top = v.max()
    if top == (-np.inf if log else 0):
        raise ValueError(f"{name}: все веса равны нулю, ESS не определён")
    v = np.exp(v - top) if log else v / top  # масштаб не влияет на ESS, переполнения нет
    ess = float(v.sum() ** 2 / np.square(v).sum())
    return min(max(ess, 1.0), float(v.size)), int(v.size)


def effective_sample_size(weights, *, log: bool = False) -> float:
    """Эффективный размер выборки Киша: ESS = (Σ_i w_i)² / Σ_i w_i², 1 ≤ ESS ≤ n, роллаутов;
    веса ≥ 0 конечны, ``log=True`` — на входе log w."""
    return _ess(weights, log)[0]


def normalized_ess(weights, *, log: bool = False) -> float:
    """ESS/n ∈ (0, 1], где n — число учтённых весов; 1 — все веса равны."""
    ess, n = _ess(weights, log)
    return ess / n


# --------------------------------------------------------------------------- клиппирование


def clipped(ratio, advantages, eps: float = 0.2, eps_high: float | None = None):
    """Где клиппированный член PPO активен (его градиент 0): ρ > 1+ε_high при A > 0 или
    ρ < 1−ε при A < 0. Поэлементно для массивов numpy и тензоров torch одной формы (булев)."""
    eps_high = eps if eps_high is None else eps_high
    return ((ratio > 1 + eps_high) & (advantages > 0)) | ((ratio < 1 - eps) & (advantages < 0))


def grpo_loss(new_logp, old_logp, advantages, mask=None, *, clip_eps: float = 0.2, num_tokens=None):
    """Потеря PPO/GRPO по токенам (тензоры torch), нат·ед. A: ρ_t = exp(log π_θ − log π_old),
    L = −(1/N) Σ_t m_t · min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t); N — num_tokens (весь пакет при
    микропакетах), иначе Σ m_t (без маски m_t = 1 — число токенов)."""
    ratio = (new_logp - old_logp).exp()  # ρ_t, безразмерное
    surr = ratio * advantages
    surr = surr.minimum(ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    if mask is not None:  # токены среды (m_t = 0) не входят в потерю; N = Σ m_t
        surr = surr * mask
        num_tokens = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
    return -surr.mean() if num_tokens is None else -surr.sum() / num_tokens


def clip_fraction(ratios, eps: float = 0.2, advantages=None, eps_high=None) -> float:
    """Доля клиппирования PPO среди токенов: без A — доля r вне [1 − ε, 1 + ε_high]
    (ε_high = ε по умолчанию); с A (по токену или последовательности) — доля ``clipped``."""
    eps = real("eps", eps, 0.0, 1.0, low_open=True, high_open=True)
    eps_high = eps if eps_high is None else positive("eps_high", eps_high)
    r = _ratios(ratios, weights=False)
    if advantages is None:
        hit = (r < 1 - eps) | (r > 1 + eps_high)
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
    return float(hit.mean())


def log_weight_stats(log_weights) -> dict:
    """Сводка log w, нат: mean/max |log w|, mean/min/max log w, n_tokens, support_violations
    (число +inf); среднее при ±inf — NaN."""
    d = _floats(log_weights, "log_weights", allow_pos_inf=True).ravel()
    if d.size == 0:
        raise ValueError("log_weights: нет ни одного токена")
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


# --------------------------------------------------------------------------- log μ движка


def _token_ids(tokens, shape: tuple, name: str) -> np.ndarray:
    """Целые номера токенов формы shape[:-1] из словаря [0, shape[-1]) → int64."""
    tok = _to_numpy(tokens, name)
    if tok.dtype.kind not in "iu" or tok.shape != tuple(shape[:-1]):
        raise ValueError(
            f"{name}: нужны целые номера формы {tuple(shape[:-1])}, получено {tok.shape}"
        )
    if (tok < 0).any() or (tok >= shape[-1]).any():
        raise ValueError(f"{name}: номер вне словаря [0, {shape[-1]})")
    return tok.astype(np.int64)


def behavior_logprob(logits, token, temperature: float = 1.0, top_p: float = 1.0):
    """log μ(y) под распределением, из которого реально семплировали, нат: z = logits/T, вне ядра
    top-p — −inf, в ядре z_y − logsumexp(z ядра); через ``policy.sampling_logprobs`` (float32)."""
    import torch

    from course_utils.policy import sampling_logprobs

    z = logits if _is_tensor(logits) else torch.from_numpy(_floats(logits, "logits"))
    if z.dim() < 1 or z.shape[-1] < 1 or torch.isnan(z).any() or torch.isposinf(z).any():
        raise ValueError("logits: нужна форма [..., vocab] без NaN и +inf")
    tok = _token_ids(token, tuple(z.shape), "token")
    lp = sampling_logprobs(z, real("temperature", temperature), real("top_p", top_p))
    out = lp.gather(-1, torch.from_numpy(tok).to(lp.device).unsqueeze(-1)).squeeze(-1)
    return out if _is_tensor(logits) else out.detach().cpu().numpy()[()]


def raw_logprob(logits, token, temperature: float = 1.0):
    """log softmax(z/T)_y без top-p, нат: НЕ политика поведения, если движок усекал ядро
    (``behavior_logprob − raw_logprob`` = −log(масса ядра) ≥ 0 для токенов ядра)."""
    return behavior_logprob(logits, token, temperature, 1.0)


# --------------------------------------------------------------------------- TIS и MIS


def truncated_weights(ratios, cap: float):
    """Усечённые веса (TIS): w̃ = min(w, C). Возвращает (w̃, доля весов с w > C)."""
    cap = positive("cap", cap)
    w = _ratios(ratios, weights=True)
    return np.minimum(w, cap)[()], float((w > cap).mean())


def masked_weights(ratios, low: float, high: float):
    """Маскированные веса (MIS/IcePop): w̃ = w·1[a ≤ w ≤ b], 0 ≤ a < b ≤ inf. Возвращает (w̃,
    доля весов вне [a, b])."""
    low = nonnegative("low", low)
    if not (is_number(high) and high > low):
        raise ValueError(f"high должно быть числом > low = {low:g} (можно inf), получено {high!r}")
    w = _ratios(ratios, weights=True)
    inside = (w >= low) & (w <= float(high))
    return np.where(inside, w, 0.0)[()], float((~inside).mean())


# --------------------------------------------------------------------------- условие поддержки


def support_violations(logp_target, logp_behavior, mask=None) -> dict:
    """Позиции, где μ(y) = 0 (log μ = −inf), а π(y) > 0: там w = π/μ = +inf. Ключи: count,
    share (доля маски), indices ([count, ndim]), target_mass = Σ π(y) по ним (масса вне носителя μ).
    """
    lt, lb, m = _pair(logp_target, logp_behavior, mask)
    bad = np.isneginf(lb) & ~np.isneginf(lt) & m
    n = int(m.sum())
    return {
        "count": int(bad.sum()),
        "share": float(bad.sum() / n) if n else 0.0,
        "indices": np.argwhere(bad).astype(np.int64),
        "target_mass": float(np.exp(lt[bad]).sum()),
    }


_ROWS = 64  # позиций за раз: логиты словаря в 150 тысяч токенов не копируются во float64 целиком


def _logit_pair(logits_a, logits_b, name_a: str, name_b: str, temperature: float):
    """Куски (начало, z_a, z_b) по ≤ _ROWS позиций (float64, z = logits/T) и форма [..., vocab]."""
    arrays = [x if hasattr(x, "reshape") else np.asarray(x) for x in (logits_a, logits_b)]
    shape, other = (tuple(x.shape) for x in arrays)  # тензор остаётся тензором до куска
    if shape != other:
        raise ValueError(f"{name_a} и {name_b}: формы различаются, {shape} против {other}")
    if len(shape) < 1 or shape[-1] < 2:
        raise ValueError(f"{name_a}: нужна форма [..., vocab] со словарём ≥ 2, получено {shape}")
    flat = [x.reshape(-1, shape[-1]) for x in arrays]

    def chunks():
        for start in range(0, flat[0].shape[0], _ROWS):
            za, zb = (
                _floats(f[start : start + _ROWS], name, allow_neg_inf=False) / temperature
                for f, name in zip(flat, (name_a, name_b))
            )
            yield start, za, zb

    return chunks(), shape


# --------------------------------------------------------------------------- симуляция


def _sigma(lag, sigma_per_lag, sigma_tim) -> float:
    """σ = sqrt(σ_tim² + (σ_lag·lag)²), нат на токен; lag ≥ 0 — задержка в версиях."""
    lag = integer("lag", lag, 0)
    sigma_per_lag = nonnegative("sigma_per_lag", sigma_per_lag)
    return math.sqrt(nonnegative("sigma_tim", sigma_tim) ** 2 + (sigma_per_lag * lag) ** 2)


def simulate_log_ratios(
    lag: int,
    length: int,
    n: int,
    sigma_per_lag: float = 0.02,
    sigma_tim: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Синтетические log w [n, length], нат: log w_t ~ N(−σ²/2, σ²) независимо,
    σ = sqrt(σ_tim² + (σ_lag·lag)²), E[w] = 1 (коэффициенты иллюстративные)."""
    sigma = _sigma(lag, sigma_per_lag, sigma_tim)
    shape = (integer("n", n, 1), integer("length", length, 1))
    rng = np.random.default_rng(optional_integer("seed", seed, 0))
    return rng.normal(-(sigma**2) / 2, sigma, size=shape)


def expected_ess_fraction(
    lag: int, length: int = 1, sigma_per_lag: float = 0.02, sigma_tim: float = 0.0
) -> float:
    """Предел ESS/n при n → ∞ для ``simulate_log_ratios``: exp(−length·σ²), доля
    (для w = e^X, X ~ N(m, s²): (E w)²/E w² = e^{−s²}, у последовательности s² = length·σ²)."""
    sigma = _sigma(lag, sigma_per_lag, sigma_tim)
    return math.exp(-integer("length", length, 1) * sigma**2)


# --------------------------------------------------------------------------- TIM по позициям


def position_shift_report(logits_target, logits_behavior, tokens) -> dict:
    """TIM по позициям токенов y_t (логиты z [..., T, vocab]), нат. Массивы [..., T]: eps —
    ε_t = max_i |Δz_{t,i}|, log_ratio — log π(y_t) − log μ(y_t), cum_log_ratio, cum_bound —
    Σ_{s≤t} 2ε_s; eps_max, bound = 2·eps_max, holds — |log w_t| ≤ 2ε_t везде."""
    names = ("logits_target", "logits_behavior")
    pairs, shape = _logit_pair(logits_target, logits_behavior, *names, 1.0)
    flat_tok = _token_ids(tokens, shape, "tokens").reshape(-1, 1)
    eps, d = [], []
    for start, za, zb in pairs:
        y = flat_tok[start : start + len(za)]
        eps.append(np.abs(za - zb).max(axis=-1))
        d.append(np.take_along_axis(log_softmax(za) - log_softmax(zb), y, -1)[:, 0])
    eps, d = np.concatenate(eps).reshape(shape[:-1]), np.concatenate(d).reshape(shape[:-1])
    out = {"eps": eps, "log_ratio": d, "cum_log_ratio": np.cumsum(d, axis=-1)}
    out |= {"cum_bound": np.cumsum(2 * eps, axis=-1), "eps_max": float(eps.max())}
    out |= {"bound": 2 * float(eps.max()), "max_abs_log_ratio": float(np.abs(d).max())}
    return out | {"holds": bool((np.abs(d) <= 2 * eps * (1 + 1e-9) + 1e-12).all())}


def _nucleus(z: np.ndarray, top_p: float):
    """p = softmax(z), масса более вероятных токенов и ядро top-p (масса до токена < top_p)."""
    p = np.exp(log_softmax(z))
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, -1)
    above = np.empty_like(p)
    np.put_along_axis(above, order, np.cumsum(sorted_p, axis=-1) - sorted_p, -1)
    return p, above, above < top_p


def top_p_flips(logits_a, logits_b, top_p: float, temperature: float = 1.0, limit: int = 5) -> dict:
    """Позиции, где сдвиг логитов переносит токен через границу ядра top-p softmax(z/T) (у b
    вероятность 0, log μ = −inf): count, share, positions и до limit examples (position, token,
    p_a, p_b, mass_above_a/b — масса более вероятных токенов, in_a, in_b)."""
    top_p = real("top_p", top_p, 0.0, 1.0, low_open=True)
    temperature = positive("temperature", temperature)
    limit = integer("limit", limit, 0)
    pairs, shape = _logit_pair(logits_a, logits_b, "logits_a", "logits_b", temperature)
    differ_rows, examples = [], []
    for start, za, zb in pairs:
        (pa, above_a, in_a), (pb, above_b, in_b) = _nucleus(za, top_p), _nucleus(zb, top_p)
        differ = in_a != in_b
        rows = differ.any(axis=-1)
        differ_rows.append(rows)
        for i in np.flatnonzero(rows)[: max(limit - len(examples), 0)]:
            tok = int(np.flatnonzero(differ[i])[0])
            key = tuple(int(k) for k in np.unravel_index(start + i, shape[:-1]))
            vals = {"p_a": pa, "p_b": pb, "mass_above_a": above_a, "mass_above_b": above_b}
            ex = {"position": key, "token": tok} | {k: float(v[i, tok]) for k, v in vals.items()}
            examples.append(ex | {"in_a": bool(in_a[i, tok]), "in_b": bool(in_b[i, tok])})
    rows = np.concatenate(differ_rows).reshape(shape[:-1])
    out = {"count": int(rows.sum()), "share": float(rows.mean())}
    return out | {"positions": np.argwhere(rows).astype(np.int64), "examples": examples}


# --------------------------------------------------------------------------- TIM


def _is_ragged(x) -> bool:
    items = isinstance(x, list | tuple) and len(x) > 0
    return items and all(_is_tensor(s) or isinstance(s, list | tuple | np.ndarray) for s in x)


def _pad(seqs, name: str):
    """Список одномерных log-вероятностей → (массив [n, max T] с нулями, маска, длины)."""
    rows = [_logprobs(s, f"{name}[{i}]") for i, s in enumerate(seqs)]
    for i, r in enumerate(rows):
        if r.ndim != 1:
            raise ValueError(f"{name}[{i}]: нужна одномерная последовательность, форма {r.shape}")
    lengths = [len(r) for r in rows]
    m = np.arange(max(lengths)) < np.array(lengths)[:, None]
    out = np.zeros(m.shape)
    out[m] = np.concatenate(rows)
    return out, m, lengths


def tim_report(engine_logprobs, trainer_logprobs) -> dict:
    """Сводка TIM на одной версии весов, нат: Δ_t = log π_trainer(y_t) − log μ_engine(y_t) по
    токенам ответов (входы — списки последовательностей log-вероятностей). Ключи:
    abs_delta_mean/p99/max, mean_delta, share_above_threshold (|Δ| > 10⁻³ нат), seq_log_ratio
    (Σ_t Δ_t), token_/seq_ess_fraction (ESS/n; NaN при нарушении поддержки) и счётчики."""
    threshold = 1e-3  # нат
    if not (_is_ragged(engine_logprobs) and _is_ragged(trainer_logprobs)):
        raise ValueError("engine_logprobs и trainer_logprobs: нужны списки последовательностей")
    lb, m, len_e = _pad(engine_logprobs, "engine_logprobs")
    lt, _, len_t = _pad(trainer_logprobs, "trainer_logprobs")
    if len_e != len_t:
        raise ValueError(f"engine_logprobs и trainer_logprobs: длины {len_e} и {len_t}")
    if not m.any():
        raise ValueError("нет ни одного токена политики для сравнения")
    d_all = _log_ratio_np(lt, lb)
    d, seq, rows = d_all[m], _seq_sum(d_all, m), m.any(axis=-1)
    ad, stats = np.abs(d), log_weight_stats(d)
    violations = stats["support_violations"]  # Δ = +inf: μ = 0 < π
    nan, method = float("nan"), "linear" if np.isfinite(ad).all() else "higher"
    out = {"n_sequences": int(lb.shape[0]), "n_tokens": stats["n_tokens"]}
    out |= {
        "abs_delta_mean": stats["mean_abs_log_ratio"],
        "abs_delta_p99": float(np.percentile(ad, 99, method=method)),
    }
    out |= {"abs_delta_max": stats["max_abs_log_ratio"], "mean_delta": stats["mean_log_ratio"]}
    out |= {"share_above_threshold": float((ad > threshold).mean()), "threshold": threshold}
    out |= {"seq_log_ratio": seq, "seq_abs_log_ratio_max": float(np.abs(seq[rows]).max())}
    out["token_ess_fraction"] = nan if violations else normalized_ess(d, log=True)
    out["seq_ess_fraction"] = nan if violations else normalized_ess(seq[rows], log=True)
    return out | {"support_violations": violations}
