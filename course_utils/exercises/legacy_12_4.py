"""Проверочные шаги урока 12.4: отношения токенов и лог-отношение последовательности (12.4.6),
ESS, клиппирование и max |log w| (12.4.7), задержка политики или TIM и log μ при температуре и top-p
(12.4.8), аудит журнала синхронизации весов (12.4.9).

Модуль регистрирует упражнения при импорте. Все верные ответы считают функции курса:
``course_utils.offpolicy`` (отношения, ESS, доля клиппирования, log μ после top-p) и
``course_utils.weight_sync.audit_log`` — поэтому упражнения и библиотека не могут разойтись.
torch при импорте модуля не загружается: ``offpolicy.behavior_logprob`` / ``raw_logprob`` и
``weight_sync`` (он импортирует torch) вызываются лениво, только в функциях 12.4.8 и 12.4.9.

Типичная ошибка узнаётся семейством (``_Family``): канонический неверный ответ + правило
``accepts``, которое узнаёт ту же ошибку, даже если остальная часть ответа другая.
"""

from __future__ import annotations

import json
import math
import numbers
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils import offpolicy
from course_utils.exercises.common import (
    CodeFamily as _CodeFamily,
    Family as _Family,
    get_key as _get,
    norm as _norm,
    norm_dict as _norm_dict,
    plain as _plain,
)
from course_utils.grading import Exercise, Misconception, register

# ---------------------------------------------------------------- общее
RTOL, ATOL = 1e-2, 2e-3
_TOL = "допуск — 1 % от верного значения или 0.002 по абсолютной величине (что больше)"


def _num(x: Any) -> float | None:
    x = _plain(x)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    return float(x)


def _close(expected: float, given: Any) -> bool:
    """|given − expected| ≤ max(1 % · |expected|, 0.002)."""
    g = _num(given)
    return (
        g is not None and math.isfinite(g) and abs(g - expected) <= max(RTOL * abs(expected), ATOL)
    )


def _close_list(expected: list, given: Any) -> bool:
    g = _plain(given)
    return (
        isinstance(g, (list, tuple))
        and len(g) == len(expected)
        and all(_close(e, x) for e, x in zip(expected, g))
    )


def _compare_with(same: Callable[[Any, Any], bool]) -> Callable[[Any, Any, float], bool]:
    """Сравнение для Exercise.compare: семейство ошибки — своим правилом, верный ответ — ``same``."""

    def compare(expected: Any, given: Any, rtol: float) -> bool:
        if isinstance(expected, (_Family, _CodeFamily)):
            return bool(expected.accepts(given))
        return bool(same(expected, given))

    return compare


def _family(ref: dict, wrong: dict, test: Callable[[Any], bool]) -> _Family:
    """Семейство: канонический ответ = верный с подменой ``wrong``; узнаёт любой ответ с test(given)."""
    return _Family({**ref, **wrong}, test)


def _distinct(values: list[float], rel: float = 0.05, gap: float = 0.01) -> bool:
    """Все значения попарно различимы с запасом (иначе ошибки совпадали бы с верным ответом)."""
    return all(
        abs(a - b) > rel * max(abs(a), abs(b)) + gap
        for i, a in enumerate(values)
        for b in values[i + 1 :]
    )


def _validate_numbers(answer: Any, keys: dict[str, str]) -> str | None:
    """Словарь ровно с ключами ``keys``; ключ → 'list' (список чисел) или 'num' (число)."""
    shape = "{" + ", ".join(f'"{k}": …' for k in keys) + "}"
    g = _norm_dict(answer)
    if g is None:
        return f"Ожидается словарь {shape}; получено: {type(answer).__name__}."
    missing = [k for k in keys if _norm(k) not in g]
    extra = [str(k) for k in answer if _norm(k) not in {_norm(x) for x in keys}]
    if missing or extra:
        return (
            f"Ожидается словарь {shape}; не хватает: {', '.join(missing) or '—'}, "
            f"лишние: {', '.join(extra) or '—'}."
        )
    for key, kind in keys.items():
        value = _plain(g[_norm(key)])
        if kind == "list":
            if not isinstance(value, (list, tuple)) or not value:
                return f"{key}: нужен непустой список чисел, получено {value!r}."
            bad = [x for x in value if _num(x) is None or not math.isfinite(_num(x))]
            if bad:
                return f"{key}: все элементы — конечные числа, а есть {bad[0]!r}."
        elif _num(value) is None or not math.isfinite(_num(value)):
            return f"{key}: нужно конечное число, получено {value!r}."
    return None


def _wrong_keys(checks: dict[str, bool]) -> str:
    wrong = [k for k, ok in checks.items() if not ok]
    return f"Неверны значения: {', '.join(wrong)}." if wrong else "Ответ не совпал с верным."


def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


# ================================================================ 12.4.6 — отношения и log w_seq
def _dialogue(rng: random.Random) -> list[tuple[str, list[str]]]:
    """Многоходовой ответ: реплики политики и ответы инструмента (среды)."""
    a, b = rng.randint(12, 89), rng.randint(3, 29)
    if rng.random() < 0.5:
        return [("policy", ["Посчитаю", ":", " calc", f"({a}*{b})"]),
                ("env", ["<tool>", f"{a * b}", "</tool>"]),
                ("policy", [" Ответ", ":", f" {a * b}", "<eos>"])]  # fmt: skip
    c = rng.randint(2, 9)
    return [("policy", [" calc", f"({a}+{b})"]), ("env", ["<tool>", f"{a + b}", "</tool>"]),
            ("policy", [" calc", f"({a + b}*{c})"]), ("env", ["<tool>", f"{(a + b) * c}", "</tool>"]),
            ("policy", [" Ответ", f" {(a + b) * c}", "<eos>"])]  # fmt: skip


def _values_12_4_6(task: dict) -> dict:
    """Верный ответ и неверные величины трёх типичных ошибок (через offpolicy)."""
    lt, lb = np.array(task["logp_target"]), np.array(task["logp_behavior"])
    m = np.array(task["mask"], dtype=bool)
    seq = float(offpolicy.sequence_log_ratio(lt, lb, m))
    return {
        "ratios": offpolicy.importance_ratios(lt[m], lb[m]).tolist(),
        "seq": seq,
        "all_ratios": offpolicy.importance_ratios(lt, lb).tolist(),
        "seq_all": float(offpolicy.sequence_log_ratio(lt, lb)),
        "inverted": offpolicy.importance_ratios(lb[m], lt[m]).tolist(),
        "mean": seq / int(m.sum()),
    }


def _task_12_4_6(variant: int) -> dict:
    rng = random.Random(12_4_6_000 + 7919 * variant)
    while True:
        tokens, mask, lt, lb = [], [], [], []
        for who, words in _dialogue(rng):
            for word in words:
                tokens.append(word)
                mask.append(1 if who == "policy" else 0)
                if who == "policy":  # движок выбрал токен; тренер пересчитал чуть иначе
                    behavior = -rng.uniform(0.02, 2.0)
                    target = behavior + rng.choice([-1, 1]) * rng.uniform(0.01, 0.3)
                    target = min(target, -0.005)
                else:  # токены инструмента: политика их не выбирала, числа посчитаны зря
                    target = -rng.uniform(1.0, 6.0)
                    behavior = min(target + rng.choice([-1, 1]) * rng.uniform(0.3, 1.5), -0.01)
                lt.append(round(target, 3))
                lb.append(round(behavior, 3))
        task = {"tokens": tokens, "mask": mask, "logp_target": lt, "logp_behavior": lb}
        v = _values_12_4_6(task)
        d = [abs(a - b) for a, b, k in zip(lt, lb, mask) if k]
        if (
            abs(v["seq"]) >= 0.15
            and max(d) >= 0.05
            and _distinct([v["seq"], -v["seq"], v["seq_all"], v["mean"], -v["seq_all"]])
        ):
            break
    rows = "\n".join(
        f"| {t} | `{tok}` | {'политика' if k else 'среда'} | {k} | {a:.3f} | {b:.3f} |"
        for t, (tok, k, a, b) in enumerate(zip(tokens, mask, lt, lb))
    )
    statement = (
        "**Отношения токенов и лог-отношение последовательности.** Многоходовой ответ модели "
        "(запрос не показан): модель вызывает калькулятор, ответ инструмента вставлен в "
        "последовательность, затем модель продолжает. Маска $m_t$: 1 — токен выбрала политика, "
        "0 — токен среды (ответ инструмента). Для каждого токена записаны $\\log\\pi_\\theta$ "
        "(тренер пересчитал последовательность) и $\\log\\mu$ (движок генерации, политика "
        "поведения), в натах. Небрежный конвейер записал числа и для токенов среды.\n\n"
        "| t | токен | чей | $m_t$ | $\\log\\pi_\\theta$ | $\\log\\mu$ |\n|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        "Те же данные — в `task['tokens']`, `task['mask']`, `task['logp_target']` "
        "($\\log\\pi_\\theta$) и `task['logp_behavior']` ($\\log\\mu$).\n\n"
        "Найдите:\n"
        "1. `ratios` — отношения важности $\\rho_t = \\pi_\\theta/\\mu$ для каждого токена "
        "политики, по порядку (список, по числу токенов с $m_t = 1$; можно округлить до 3 знаков);\n"
        "2. `seq_log_ratio` — логарифм отношения всей последовательности $\\log w_{seq}$, в натах.\n\n"
        'Ответ — словарь `{"ratios": [...], "seq_log_ratio": …}`; '
        f"{_TOL}."
    )
    return {"statement": statement, **task}


def _reference_12_4_6(task: dict) -> dict:
    v = _values_12_4_6(task)
    return {"ratios": v["ratios"], "seq_log_ratio": v["seq"]}


def _same_12_4_6(expected: dict, given: Any) -> bool:
    return _close_list(expected["ratios"], _get(given, "ratios")) and _close(
        expected["seq_log_ratio"], _get(given, "seq_log_ratio")
    )


def _mc_env_included(task: dict) -> _Family:
    v = _values_12_4_6(task)
    wrong = {"ratios": v["all_ratios"], "seq_log_ratio": v["seq_all"]}

    def test(given: Any) -> bool:
        return _close(v["seq_all"], _get(given, "seq_log_ratio")) or _close_list(
            v["all_ratios"], _get(given, "ratios")
        )

    return _family(_reference_12_4_6(task), wrong, test)


def _mc_inverted(task: dict) -> _Family:
    v = _values_12_4_6(task)

    def test(given: Any) -> bool:
        return _close_list(v["inverted"], _get(given, "ratios")) or _close(
            -v["seq"], _get(given, "seq_log_ratio")
        )

    return _Family({"ratios": v["inverted"], "seq_log_ratio": -v["seq"]}, test)


def _mc_mean(task: dict) -> _Family:
    v = _values_12_4_6(task)
    return _family(
        _reference_12_4_6(task),
        {"seq_log_ratio": v["mean"]},
        lambda given: _close(v["mean"], _get(given, "seq_log_ratio")),
    )


def _mismatch_12_4_6(expected: dict, answer: Any, task: dict) -> str:
    given = _plain(_get(answer, "ratios"))
    n = len(expected["ratios"])
    if isinstance(given, (list, tuple)) and len(given) != n:
        return (
            f"В ratios нужно {n} чисел — по одному на токен политики ($m_t = 1$), а получено "
            f"{len(given)}."
        )
    return _wrong_keys(
        {"ratios": _close_list(expected["ratios"], given),
         "seq_log_ratio": _close(expected["seq_log_ratio"], _get(answer, "seq_log_ratio"))}
    )  # fmt: skip


def _solution_12_4_6(task: dict) -> str:
    v = _values_12_4_6(task)
    rows, terms = [], []
    for t, (tok, k, a, b) in enumerate(
        zip(task["tokens"], task["mask"], task["logp_target"], task["logp_behavior"])
    ):
        if k:
            rows.append(
                f"| {t} | `{tok}` | {a:.3f} − ({b:.3f}) = {a - b:+.3f} | {math.exp(a - b):.4f} |"
            )
            terms.append(f"({a - b:+.3f})")
        else:
            rows.append(f"| {t} | `{tok}` | токен среды: $m_t = 0$, не входит | — |")
    ratios = ", ".join(f"{r:.4f}" for r in v["ratios"])
    return (
        "Отношение важности токена — $\\rho_t = \\exp(\\log\\pi_\\theta - \\log\\mu)$; "
        "лог-отношение последовательности — сумма по токенам **политики**:\n\n"
        "$$\\log w_{seq} = \\sum_t m_t\\,(\\log\\pi_\\theta(y_t) - \\log\\mu(y_t)).$$\n\n"
        "| t | токен | $\\log\\pi_\\theta - \\log\\mu$ | $\\rho_t$ |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n\n$$\\log w_{{seq}} = {' + '.join(terms)} = {v['seq']:.4f}\\ \\text{{нат}},"
        f"\\quad w_{{seq}} = e^{{{v['seq']:.4f}}} = {math.exp(v['seq']):.4f}.$$\n\n"
        f'**Ответ:** `{{"ratios": [{ratios}], "seq_log_ratio": {v["seq"]:.4f}}}`.\n\n'
        "Токены инструмента выбирала среда, а не политика: их вероятности под $\\pi$ и $\\mu$ "
        "не описывают ни одного решения политики, поэтому маска их исключает. С ними сумма "
        f"была бы {v['seq_all']:.4f} нат — чужой вклад {v['seq_all'] - v['seq']:+.4f} нат. "
        "Отношение — $\\pi/\\mu$ (целевая над поведенческой), а не наоборот; и это сумма, а не "
        f"среднее: среднее ({v['mean']:.4f}) — уже другая величина (геометрическое среднее "
        "в режиме `geometric`)."
    )


register(
    Exercise(
        id="12.4.6",
        title="Отношения вероятностей токенов и маскированный лог-коэффициент последовательности",
        make_task=_task_12_4_6,
        reference=_reference_12_4_6,
        solution=_solution_12_4_6,
        hint=(
            "Берите только строки с m_t = 1. Для каждой: ρ_t = exp(log π_θ − log μ). "
            "log w_seq = Σ_t m_t·(log π_θ − log μ) — сумма (не среднее) разностей по токенам "
            "политики; в натах, без экспоненты."
        ),
        misconceptions=[
            Misconception(
                "env_tokens_included",
                "Вы учли токены среды (m_t = 0). Ответ инструмента выбирала не политика, и его "
                "log-вероятности не относятся к её решениям: в отношения и в сумму входят только "
                "токены с маской 1.",
                _mc_env_included,
            ),
            Misconception(
                "ratio_inverted",
                "Отношение перевёрнуто: вы посчитали μ/π. Вес выборки по важности — "
                "ρ_t = π_θ/μ = exp(log π_θ − log μ): целевая политика в числителе, политика "
                "поведения (та, что породила токены) в знаменателе.",
                _mc_inverted,
            ),
            Misconception(
                "mean_not_sum",
                "Это среднее разностей, а не сумма. Отношение последовательности — произведение "
                "токеновых отношений, значит log w_seq = Σ_t m_t·(log π_θ − log μ); среднее "
                "даёт геометрическое среднее, другую величину.",
                _mc_mean,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_4_6),
        validate_answer=lambda a, t: _validate_numbers(
            a, {"ratios": "list", "seq_log_ratio": "num"}
        ),
        describe_mismatch=_mismatch_12_4_6,
    )
)


# ================================================================ 12.4.7 — ESS, клиппирование, |log w|
_KEYS_12_4_7 = {"ess": "num", "ess_norm": "num", "clip_fraction": "num", "max_abs_log_w": "num"}


def _values_12_4_7(task: dict) -> dict:
    w, a = np.array(task["weights"]), np.array(task["advantages"])
    el, eh = task["eps_low"], task["eps_high"]
    stats = offpolicy.log_weight_stats(np.log(w))
    return {
        "ess": offpolicy.effective_sample_size(w),
        "ess_norm": offpolicy.normalized_ess(w),
        "clip_fraction": offpolicy.clip_fraction(w, el, advantages=a, eps_high=eh),
        "max_abs_log_w": stats["max_abs_log_ratio"],
        "clip_no_sign": offpolicy.clip_fraction(w, el, eps_high=eh),
        "n": len(w),
        "mean_w": float(w.mean()),
        "sum_w": float(w.sum()),
    }


def _draw_weight(rng: random.Random, kind: str, el: float, eh: float) -> float:
    low, high = 1 - el, 1 + eh
    if kind == "high":
        return rng.uniform(high + 0.04, 2.8)
    if kind == "low":
        return rng.uniform(0.25, low - 0.04)
    return rng.uniform(low + 0.03, high - 0.03)


def _task_12_4_7(variant: int) -> dict:
    rng = random.Random(12_4_7_000 + 7919 * variant)
    el = 0.2
    eh = rng.choice([0.2, 0.28])
    n = rng.choice([8, 8, 10])
    while True:
        # (положение w, знак A): хотя бы одно срабатывание и хотя бы один выход за полосу
        # с «неправильным» знаком A — там клиппирование не срабатывает.
        kinds = [("high", 1), rng.choice([("low", 1), ("high", -1)])]
        kinds += [rng.choice([("low", -1), ("low", 1), ("high", -1), ("high", 1)])]
        kinds += [("in", rng.choice([-1, 1])) for _ in range(n - len(kinds))]
        rng.shuffle(kinds)
        weights = [round(_draw_weight(rng, k, el, eh), 3) for k, _ in kinds]
        adv = [round(s * rng.uniform(0.2, 1.6), 2) for _, s in kinds]
        task = {"weights": weights, "advantages": adv, "eps_low": el, "eps_high": eh}
        v = _values_12_4_7(task)
        if v["ess_norm"] <= 0.85 and _distinct(
            [v["ess"], v["n"], v["mean_w"], v["sum_w"], v["ess_norm"]]
        ):
            break
    rows = "\n".join(
        f"| o{i + 1} | {w:.3f} | {a:+.2f} |" for i, (w, a) in enumerate(zip(weights, adv))
    )
    band = f"[1 − {el}, 1 + {eh}] = [{1 - el:.2f}, {1 + eh:.2f}]"
    asym = " (асимметричная полоса, как clip-higher в DAPO)" if eh != el else ""
    statement = (
        f"**ESS, клиппирование и max |log w|.** Группа из n = {n} ответов на один запрос собрана "
        "политикой поведения μ, обновление идёт по текущей политике π_θ. Для каждого ответа "
        "известны последовательностный вес $w_i = \\pi_\\theta(y_i\\mid x)/\\mu(y_i\\mid x)$ "
        "— одно отношение на ответ, полное произведение токеновых отношений (GSPO берёт его "
        "нормированным по длине, $(\\pi_\\theta/\\mu)^{1/|y_i|}$; здесь нормировки нет) — и "
        "преимущество $A_i$ (GRPO):\n\n"
        f"| ответ | $w_i$ | $A_i$ |\n|---|---|---|\n{rows}\n\n"
        f"Клиппирование PPO: $\\varepsilon_{{low}} = {el}$, $\\varepsilon_{{high}} = {eh}$, "
        f"полоса {band}{asym}. Данные — в `task['weights']`, `task['advantages']`, "
        "`task['eps_low']`, `task['eps_high']`.\n\nНайдите:\n"
        "1. `ess` — эффективный размер выборки (ESS Киша) по весам $w_i$;\n"
        "2. `ess_norm` — ESS/n;\n"
        "3. `clip_fraction` — долю ответов, на которых клиппирование **действительно "
        "срабатывает**, то есть обрезанная ветвь цели PPO заменяет необрезанную (так считают "
        "`clip_ratio` в TRL и `pg_clipfrac` в verl); доля от 0 до 1;\n"
        "4. `max_abs_log_w` — $\\max_i |\\log w_i|$, в натах.\n\n"
        'Ответ — словарь `{"ess": …, "ess_norm": …, "clip_fraction": …, "max_abs_log_w": …}`; '
        f"{_TOL}."
    )
    return {"statement": statement, **task}


def _reference_12_4_7(task: dict) -> dict:
    v = _values_12_4_7(task)
    return {k: v[k] for k in _KEYS_12_4_7}


def _same_12_4_7(expected: dict, given: Any) -> bool:
    return all(_close(expected[k], _get(given, k)) for k in _KEYS_12_4_7)


def _mc_clip_no_sign(task: dict) -> _Family:
    v = _values_12_4_7(task)
    return _family(
        _reference_12_4_7(task),
        {"clip_fraction": v["clip_no_sign"]},
        lambda given: _close(v["clip_no_sign"], _get(given, "clip_fraction")),
    )


def _mc_ess_mean(task: dict) -> _Family:
    v = _values_12_4_7(task)

    def test(given: Any) -> bool:
        ess = _get(given, "ess")
        return any(_close(x, ess) for x in (v["n"], v["mean_w"], v["sum_w"])) or _close(
            v["mean_w"], _get(given, "ess_norm")
        )

    return _family(_reference_12_4_7(task), {"ess": float(v["n"]), "ess_norm": 1.0}, test)


def _mc_ess_not_norm(task: dict) -> _Family:
    v = _values_12_4_7(task)
    return _family(
        _reference_12_4_7(task),
        {"ess_norm": v["ess"]},
        lambda given: _close(v["ess"], _get(given, "ess_norm")),
    )


def _validate_12_4_7(answer: Any, task: dict) -> str | None:
    problem = _validate_numbers(answer, _KEYS_12_4_7)
    if problem:
        return problem
    for key in ("ess", "ess_norm", "max_abs_log_w"):
        if _num(_get(answer, key)) < 0:
            return f"{key}: величина неотрицательна, получено {_get(answer, key)!r}."
    clip = _num(_get(answer, "clip_fraction"))
    if not 0 <= clip <= 1:
        return f"clip_fraction: нужна доля от 0 до 1 (не проценты), получено {clip!r}."
    return None


def _solution_12_4_7(task: dict) -> str:
    v = _values_12_4_7(task)
    w, a, el, eh = task["weights"], task["advantages"], task["eps_low"], task["eps_high"]
    low, high = 1 - el, 1 + eh
    rows = []
    for i, (wi, ai) in enumerate(zip(w, a)):
        where = "выше" if wi > high else "ниже" if wi < low else "внутри"
        binds = (wi > high and ai > 0) or (wi < low and ai < 0)
        why = "да" if binds else ("нет: знак A не тот" if where != "внутри" else "нет")
        rows.append(f"| o{i + 1} | {wi:.3f} | {ai:+.2f} | {math.log(wi):+.4f} | {where} | {why} |")
    s1, s2 = sum(w), sum(x * x for x in w)
    k = round(v["clip_fraction"] * v["n"])
    k_all = round(v["clip_no_sign"] * v["n"])
    return (
        "**ESS Киша:** $\\mathrm{ESS} = (\\sum_i w_i)^2 / \\sum_i w_i^2$, "
        f"$\\sum w = {s1:.3f}$, $\\sum w^2 = {s2:.4f}$:\n\n"
        f"$$\\mathrm{{ESS}} = \\frac{{{s1:.3f}^2}}{{{s2:.4f}}} = {v['ess']:.4f},\\qquad "
        f"\\mathrm{{ESS}}/n = \\frac{{{v['ess']:.4f}}}{{{v['n']}}} = {v['ess_norm']:.4f}.$$\n\n"
        "**Клиппирование срабатывает**, когда обрезанная ветвь $\\min(\\rho A, "
        "\\mathrm{clip}(\\rho)A)$ меньше необрезанной: при $\\rho > 1 + \\varepsilon_{high}$ и "
        "$A > 0$ или при $\\rho < 1 - \\varepsilon_{low}$ и $A < 0$. Вне полосы с другим знаком "
        f"A минимум берёт необрезанную ветвь — градиент течёт. Полоса [{low:.2f}, {high:.2f}]:\n\n"
        "| ответ | $w_i$ | $A_i$ | $\\log w_i$ | где w | срабатывает |\n|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n\nСрабатывает на {k} из {v['n']}: доля {v['clip_fraction']:.4f} (вне полосы — "
        f"{k_all} из {v['n']}, но это не доля клиппирования).\n\n"
        f"**max |log w|** = {v['max_abs_log_w']:.4f} нат (смотрите на модуль: малый вес "
        "$w \\ll 1$ — такое же сильное рассогласование, как большой).\n\n"
        f"**Ответ:** `{ {key: round(v[key], 4) for key in _KEYS_12_4_7} }`.\n\n"
        "ESS — диагностика концентрации весов, а не доказательство несмещённости: при "
        "ESS/n заметно меньше 1 несколько ответов тянут градиент сильнее остальных."
    )


register(
    Exercise(
        id="12.4.7",
        title="ESS, ESS/n, доля клиппирования со знаком преимущества, max |log w|",
        make_task=_task_12_4_7,
        reference=_reference_12_4_7,
        solution=_solution_12_4_7,
        hint=(
            "ESS = (Σw)²/Σw²; ESS/n делите на число весов. Клиппирование срабатывает только при "
            "(w > 1 + ε_high и A > 0) или (w < 1 − ε_low и A < 0) — выход за полосу с другим "
            "знаком A не считается. max |log w| — по модулю натурального логарифма."
        ),
        misconceptions=[
            Misconception(
                "clip_ignores_sign",
                "Вы посчитали долю весов вне полосы [1 − ε_low, 1 + ε_high] без учёта знака "
                "преимущества. Клиппирование срабатывает только при w > 1 + ε_high и A > 0 или "
                "при w < 1 − ε_low и A < 0; в остальных случаях min(ρA, clip(ρ)A) берёт "
                "необрезанную ветвь, и градиент не обрезается (так считают TRL и verl).",
                _mc_clip_no_sign,
            ),
            Misconception(
                "ess_mean_weight",
                "ESS — не число примеров n и не средний (или суммарный) вес. Эффективный размер "
                "выборки Киша: ESS = (Σw)²/Σw²; он равен n только при равных весах и падает к 1, "
                "когда доминирует один пример.",
                _mc_ess_mean,
            ),
            Misconception(
                "ess_not_normalized",
                "В ess_norm вы записали сам ESS. Нормированная величина — ESS/n ∈ (0, 1]: её "
                "удобно сравнивать между пакетами разного размера.",
                _mc_ess_not_norm,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_4_7),
        validate_answer=_validate_12_4_7,
        describe_mismatch=lambda e, a, t: _wrong_keys({k: _close(e[k], _get(a, k)) for k in e}),
    )
)


# ================================================================ 12.4.8 — lag или TIM; log μ при top-p
_LABELS = ("lag", "tim")
_LOG_KINDS = (("lag", "tim"), ("tim", "lag"), ("tim", "tim"))
_VOCAB = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "<eos>", "+", "=", "-"]


def _log_excerpt(rng: random.Random, kind: str, name: str, seed: int) -> list[dict]:
    """Три строки журнала: версии и статистика log w (offpolicy.simulate_log_ratios)."""
    u = rng.randint(120, 480)
    sigma_tim = rng.choice([0.01, 0.03, 0.06]) if kind == "tim" else 0.005
    sigma_lag = rng.choice([0.01, 0.02, 0.04])
    rows = []
    for i in range(3):
        lag = rng.randint(1, 3) if kind == "lag" else 0
        length = rng.choice([96, 160, 256, 384, 512])
        lw = offpolicy.simulate_log_ratios(lag, length, 1, sigma_lag, sigma_tim, seed=seed + i)
        stats = offpolicy.log_weight_stats(lw)
        seq = float(lw[0].sum())  # log w_seq = Σ_t log w_t
        rows.append(
            {"sample_id": f"{name}-{rng.randint(1000, 9999)}", "behavior_version": u - lag,
             "trainer_version": u, "response_tokens": length,
             "mean_abs_log_w": round(stats["mean_abs_log_ratio"], 4),
             "max_abs_log_w": round(stats["max_abs_log_ratio"], 3), "seq_log_w": round(seq, 3)}
        )  # fmt: skip
        u += rng.randint(0, 1)
    return rows


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _nucleus(
    logits: list[float], temperature: float, top_p: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """(вероятности softmax(z/T), маска ядра top-p, наименьший зазор до порога 1 − p).

    Правило то же, что в policy.sampling_logprobs: сортируем по возрастанию, отбрасываем
    токены с накопленной вероятностью ≤ 1 − p, самый вероятный остаётся всегда.
    """
    p = _softmax(np.array(logits) / temperature)
    order = np.argsort(p, kind="stable")
    cum = np.cumsum(p[order])
    drop_sorted = cum <= 1 - top_p
    drop_sorted[-1] = False
    keep = np.ones(len(p), dtype=bool)
    keep[order[drop_sorted]] = False
    return p, keep, float(np.abs(cum[:-1] - (1 - top_p)).min())


def _logprobs_12_4_8(task: dict) -> dict:
    """log μ (верно), log softmax(z/T) без top-p и log μ без температуры — через offpolicy."""
    z, tok = np.array(task["logits"]), task["token_index"]
    T, p = task["temperature"], task["top_p"]
    return {
        "behavior": float(offpolicy.behavior_logprob(z, tok, T, p)),
        "raw": float(offpolicy.raw_logprob(z, tok, T)),
        "no_temp": float(offpolicy.behavior_logprob(z, tok, 1.0, p)),
        "no_temp_raw": float(offpolicy.raw_logprob(z, tok, 1.0)),
    }


def _diagnosis(task: dict) -> dict:
    return {
        name: "tim" if all(r["behavior_version"] == r["trainer_version"] for r in rows) else "lag"
        for name, rows in task["logs"].items()
    }


def _task_12_4_8(variant: int) -> dict:
    rng = random.Random(12_4_8_000 + 7919 * variant)
    kinds = _LOG_KINDS[variant % len(_LOG_KINDS)]  # хотя бы один журнал — TIM
    logs = {name: _log_excerpt(rng, kind, name, 1000 * variant + 10 * i)
            for i, (name, kind) in enumerate(zip("AB", kinds))}  # fmt: skip
    temperature = rng.choice([0.6, 0.7, 0.8, 1.2, 1.4])
    top_p = rng.choice([0.7, 0.8, 0.9])
    vocab = rng.sample(_VOCAB, 6)
    while True:
        logits = [round(rng.uniform(-1.5, 3.0), 2) for _ in vocab]
        if len(set(logits)) < len(logits):
            continue
        p_t, keep_t, gap_t = _nucleus(logits, temperature, top_p)
        _, keep_1, gap_1 = _nucleus(logits, 1.0, top_p)
        both = [i for i in range(len(vocab)) if keep_t[i] and keep_1[i]]
        if min(gap_t, gap_1) < 0.01 or keep_t.all() or len(both) < 2:
            continue
        token = rng.choice(both)
        lp = _logprobs_12_4_8({"logits": logits, "token_index": token,
                               "temperature": temperature, "top_p": top_p})  # fmt: skip
        if _distinct([lp["behavior"], lp["raw"], lp["no_temp"], lp["no_temp_raw"]]):
            break
    cols = ("sample_id", "behavior_version", "trainer_version", "response_tokens",
            "mean_abs_log_w", "max_abs_log_w", "seq_log_w")  # fmt: skip
    tables = []
    for name, rows in logs.items():
        body = "\n".join("| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows)
        tables.append(
            f"Журнал **{name}**:\n\n| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n{body}"
        )
    logit_row = " | ".join(f"{z:.2f}" for z in logits)
    statement = (
        "**Задержка политики или TIM; log-вероятность поведения при температуре и top-p.**\n\n"
        "**Часть 1.** Два фрагмента журналов обучения. В каждой строке — роллаут: "
        "`behavior_version` — версия весов движка, которая его породила (v), "
        "`trainer_version` — версия политики тренера в момент обновления (u), и статистика "
        "$\\log w = \\log\\pi - \\log\\mu$ по токенам ответа: средний и максимальный "
        "|log w| и сумма по последовательности `seq_log_w` (наты).\n\n"
        + "\n\n".join(tables)
        + '\n\nДля каждого журнала поставьте диагноз: `"lag"` — задержка политики '
        '(роллауты собраны более старой версией, v < u) или `"tim"` — рассогласование '
        "обучения и генерации (версия та же, v = u, а вероятности всё равно различаются).\n\n"
        f"**Часть 2.** Движок семплирует с температурой T = {temperature} и top-p p = {top_p} "
        "(ядро — наименьшее множество самых вероятных токенов с суммарной вероятностью ≥ p; "
        "вероятности внутри ядра перенормируются). Логиты крошечного словаря на одном шаге:\n\n"
        f"| токен | {' | '.join(f'`{v}`' for v in vocab)} |\n|---|{'---|' * len(vocab)}\n"
        f"| логит z | {logit_row} |\n\n"
        f"Выбран токен `{vocab[token]}` (номер {token}, с нуля). Найдите `behavior_logprob` — "
        "$\\log\\mu(y)$, логарифм вероятности этого токена под распределением, из которого "
        "движок действительно семплировал, в натах.\n\n"
        "Данные — в `task['logs']`, `task['vocab']`, `task['logits']`, `task['token_index']`, "
        "`task['temperature']`, `task['top_p']`.\n\n"
        'Ответ — словарь `{"diagnosis": {"A": "lag" или "tim", "B": …}, '
        f'"behavior_logprob": …}}`; для log-вероятности {_TOL}.'
    )
    return {"statement": statement, "logs": logs, "vocab": vocab, "logits": logits,
            "token_index": token, "temperature": temperature, "top_p": top_p}  # fmt: skip


def _reference_12_4_8(task: dict) -> dict:
    return {"diagnosis": _diagnosis(task), "behavior_logprob": _logprobs_12_4_8(task)["behavior"]}


def _given_diagnosis(given: Any) -> dict | None:
    d = _norm_dict(_get(given, "diagnosis"))
    if d is None or not all(isinstance(v, str) for v in d.values()):
        return None
    return {k: _norm(v) for k, v in d.items()}


def _same_12_4_8(expected: dict, given: Any) -> bool:
    want = {_norm(k): v for k, v in expected["diagnosis"].items()}
    return _given_diagnosis(given) == want and _close(
        expected["behavior_logprob"], _get(given, "behavior_logprob")
    )


def _mc_raw(task: dict) -> _Family:
    raw = _logprobs_12_4_8(task)["raw"]
    return _family(
        _reference_12_4_8(task),
        {"behavior_logprob": raw},
        lambda given: _close(raw, _get(given, "behavior_logprob")),
    )


def _mc_no_temp(task: dict) -> _Family:
    lp = _logprobs_12_4_8(task)

    def test(given: Any) -> bool:
        value = _get(given, "behavior_logprob")
        return _close(lp["no_temp"], value) or _close(lp["no_temp_raw"], value)

    return _family(_reference_12_4_8(task), {"behavior_logprob": lp["no_temp"]}, test)


def _mc_staleness(task: dict) -> _Family:
    all_lag = {name: "lag" for name in task["logs"]}
    return _family(
        _reference_12_4_8(task),
        {"diagnosis": all_lag},
        lambda given: _given_diagnosis(given) == {_norm(k): v for k, v in all_lag.items()},
    )


def _validate_12_4_8(answer: Any, task: dict) -> str | None:
    shape = '{"diagnosis": {"A": "lag" или "tim", "B": …}, "behavior_logprob": …}'
    g = _norm_dict(answer)
    if g is None or set(g) != {"diagnosis", "behavior_logprob"}:
        return f"Ожидается словарь {shape}."
    diag = _norm_dict(g["diagnosis"])
    names = sorted(task["logs"])
    if diag is None or set(diag) != {_norm(n) for n in names}:
        return f"diagnosis: словарь с ключами {', '.join(names)} (по журналу на ключ)."
    for name, label in diag.items():
        if _norm(label) not in _LABELS:
            return f'diagnosis[{name.upper()!r}]: допустимы "lag" и "tim", получено {label!r}.'
    value = _num(g["behavior_logprob"])
    if value is None or math.isnan(value):
        return f"behavior_logprob: нужно число (наты), получено {g['behavior_logprob']!r}."
    if value > 0:
        return f"behavior_logprob: логарифм вероятности ≤ 0, получено {value!r}."
    return None


def _mismatch_12_4_8(expected: dict, answer: Any, task: dict) -> str:
    diag = _given_diagnosis(answer) or {}
    wrong = [k for k, v in expected["diagnosis"].items() if diag.get(_norm(k)) != v]
    notes = [f"диагноз журнала {', '.join(wrong)}"] if wrong else []
    if not _close(expected["behavior_logprob"], _get(answer, "behavior_logprob")):
        notes.append("behavior_logprob")
    return f"Неверно: {'; '.join(notes)}." if notes else "Ответ не совпал с верным."


def _solution_12_4_8(task: dict) -> str:
    ref = _reference_12_4_8(task)
    lp = _logprobs_12_4_8(task)
    parts = []
    for name, rows in task["logs"].items():
        pairs = ", ".join(f"{r['behavior_version']}/{r['trainer_version']}" for r in rows)
        biggest = max(abs(r["seq_log_w"]) for r in rows)
        if ref["diagnosis"][name] == "lag":
            why = "есть строки с v < u: роллауты собраны старой версией — задержка"
        else:
            why = (
                "во всех строках v = u: задержки нет, а log w ≠ 0 — это TIM (разные ядра, "
                "точность, порядок редукций)"
            )
        parts.append(
            f"- Журнал **{name}**: v/u = {pairs}; {why}. Наибольший |seq_log_w| = {biggest:.3f} "
            f"нат. **Диагноз: `{ref['diagnosis'][name]}`.**"
        )
    T, p, tok = task["temperature"], task["top_p"], task["token_index"]
    probs, keep, _ = _nucleus(task["logits"], T, p)
    mass = float(probs[keep].sum())
    rows = "\n".join(
        f"| `{v}` | {z:.2f} | {z / T:.4f} | {q:.4f} | {'да' if k else 'нет'} | "
        f"{(q / mass if k else 0.0):.4f} |"
        for v, z, q, k in zip(task["vocab"], task["logits"], probs, keep)
    )
    y = task["vocab"][tok]
    return (
        "**Часть 1.** Диагноз ставится по версиям, а не по величине отношений: задержка "
        "измеряется номером версии (v < u), TIM — на нулевой задержке (v = u). Большой |log w| "
        "бывает и при TIM (длинный ответ, низкая точность), маленький — и при задержке в одну "
        "версию.\n\n" + "\n".join(parts) + "\n\n"
        f"**Часть 2.** $z/T$ при T = {T}, softmax, затем ядро top-p (p = {p}): отбрасываем "
        "наименее вероятные токены, пока их суммарная вероятность ≤ 1 − p, и перенормируем "
        "оставшиеся.\n\n"
        "| токен | z | z/T | softmax(z/T) | в ядре | μ после перенормировки |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n"
        f"Масса ядра — {mass:.4f}; для выбранного токена y = `{y}`:\n\n"
        f"$$\\log\\mu(y) = \\log\\mathrm{{softmax}}(z/T)_y - \\log(\\text{{масса ядра}}) = "
        f"{lp['raw']:.4f} - ({math.log(mass):.4f}) = {lp['behavior']:.4f}\\ \\text{{нат}}.$$\n\n"
        f'**Ответ:** `{{"diagnosis": {json.dumps(ref["diagnosis"])}, "behavior_logprob": '
        f"{lp['behavior']:.4f}}}`.\n\n"
        f"Логарифм исходного softmax(z/T) ({lp['raw']:.4f}) — не политика поведения: движок "
        "семплировал из усечённого и перенормированного распределения. Без температуры "
        f"(ядро по softmax(z)) получилось бы {lp['no_temp']:.4f} — тоже не то распределение."
    )


register(
    Exercise(
        id="12.4.8",
        title="Задержка политики или рассогласование обучения и генерации; log μ при температуре и top-p",
        make_task=_task_12_4_8,
        reference=_reference_12_4_8,
        solution=_solution_12_4_8,
        hint=(
            "Часть 1: сравните behavior_version и trainer_version — величина log w диагноз не "
            "ставит. Часть 2: поделите логиты на T, возьмите softmax, отбросьте наименее "
            "вероятные токены, пока их суммарная вероятность ≤ 1 − p, перенормируйте остальные: "
            "log μ(y) = z_y/T − logsumexp(z/T по ядру)."
        ),
        misconceptions=[
            Misconception(
                "raw_softmax_under_top_p",
                "Это log softmax(z/T) без усечения. Движок семплировал из ядра top-p, "
                "перенормированного до суммы 1: log μ(y) = log softmax(z/T)_y − log(масса ядра). "
                "Логарифм исходного softmax — не политика поведения.",
                _mc_raw,
            ),
            Misconception(
                "no_temperature",
                "Вы забыли температуру: движок делит логиты на T до softmax и до отбора ядра "
                "top-p (от T зависит и само ядро). Считайте softmax(z/T), затем ядро и "
                "перенормировку.",
                _mc_no_temp,
            ),
            Misconception(
                "staleness_everywhere",
                "Вы объяснили каждое рассогласование задержкой. Задержка — это v < u; если "
                "версии совпадают (v = u), а log w ≠ 0, это TIM: одинаковые веса не гарантируют "
                "одинаковых вероятностей (ядра, точность, порядок редукций, декодирование).",
                _mc_staleness,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_4_8),
        validate_answer=_validate_12_4_8,
        describe_mismatch=_mismatch_12_4_8,
    )
)


# ================================================================ 12.4.9 — аудит журнала синхронизации
# Внедряемые нарушения → коды audit_log, которые они вызывают (тесты сверяют с audit_log).
_INJECTIONS = {
    "commit_no_wait": ("commit_before_barrier", "serve_before_barrier"),
    "serve_from_staging": ("serve_before_barrier", "serve_uncommitted"),  # до любого commit
    "early_commit": ("commit_before_barrier", "serve_before_barrier", "replicas_diverged"),
    "barrier_not_ready": ("barrier_not_ready",),
    "verify_ok_mismatch": ("checksum_mismatch",),
    "commit_mismatch": ("checksum_mismatch",),
    "skip_verify": ("commit_without_verify",),
    "stale_request": ("version_backwards", "replicas_diverged"),
    "inplace": ("inplace_update",),
    "missed_commit": ("replicas_diverged",),
}
_BARRIER_KINDS = ("commit_no_wait", "serve_from_staging", "early_commit", "barrier_not_ready")
_CHECKSUM_KINDS = ("verify_ok_mismatch", "commit_mismatch")
_BARRIER_CODES = {"serve_before_barrier", "commit_before_barrier", "barrier_not_ready"}
_PUBLISHER = "publisher"


def _weight_sync():
    from course_utils import weight_sync  # импортирует torch: только когда шаг 12.4.9 нужен

    return weight_sync


def _plan_12_4_9(variant: int) -> dict:
    """Сценарий варианта: реплики, версии, внедрённые нарушения (по публикациям), отменённая
    публикация-ловушка. В условие не попадает; тесты сверяют коды с audit_log.

    Варианты 0..3 несут нарушение барьера и нарушение контрольной суммы (на них проверяются
    все типичные ошибки); дальше — 0–2 нарушения любого вида, бывает и чистый журнал.
    """
    rng = random.Random(12_4_9_000 + 7919 * variant)
    replicas = [f"replica-{i}" for i in range(rng.choice([2, 3]))]
    n_pub = rng.choice([1, 2])
    if variant < 4:
        kinds = [
            random.Random(12_4_9).sample(_BARRIER_KINDS, 4)[variant],
            rng.choice(_CHECKSUM_KINDS),
        ]
    else:
        while True:
            kinds = rng.sample(sorted(_INJECTIONS), rng.choice([0, 1, 1, 2, 2]))
            if sum(k in _BARRIER_KINDS for k in kinds) <= 1:
                break
    pubs: list[dict[str, str]] = [{} for _ in range(n_pub)]
    for kind in kinds:
        free = [(i, r) for i in range(n_pub) for r in replicas if r not in pubs[i].values()]
        i, r = rng.choice(free)
        pubs[i][kind] = r
    abort_at = rng.randrange(n_pub) if rng.random() < 0.4 else None
    return {"replicas": replicas, "v0": rng.randint(10, 60), "publications": pubs,
            "abort_before": abort_at, "abort_replica": rng.choice(replicas),
            "seed": rng.randrange(10**9)}  # fmt: skip


def _expected_codes(plan: dict) -> set[str]:
    return {code for pub in plan["publications"] for kind in pub for code in _INJECTIONS[kind]}


class _Journal:
    """Журнал событий схемы weight_sync.EVENT_FIELDS: seq по порядку, t растёт."""

    def __init__(self, rng: random.Random):
        self.rng, self.events, self.t, self.requests = rng, [], 0.0, 0
        self.current: dict[str, tuple[int, str]] = {}  # реплика → (версия, сумма) активного буфера

    def checksum(self) -> str:
        return f"{self.rng.getrandbits(32):08x}"

    def add(self, event: str, replica: str, version: int, **fields: Any) -> None:
        self.t += self.rng.uniform(0.003, 0.05)
        row = {"seq": len(self.events), "t": round(self.t, 3), "replica": replica,
               "event": event, "version": version, "checksum": None, "expected_checksum": None,
               "request_id": None, "buffer": None, "detail": ""}  # fmt: skip
        row.update(fields)
        self.events.append(row)

    def serve(self, replica: str, version: int | None = None, checksum: str | None = None) -> None:
        v, c = self.current[replica] if version is None else (version, checksum)
        self.requests += 1
        self.add("serve", replica, v, checksum=c, request_id=f"req-{self.requests:03d}")

    def commit(self, replica: str, version: int, checksum: str, buffer: str) -> None:
        self.add("commit", replica, version, checksum=checksum, buffer=buffer)
        self.current[replica] = (version, checksum)

    def serve_all(self, replicas: list[str]) -> None:
        for r in self.rng.sample(replicas, len(replicas)):
            self.serve(r)


def _aborted(j: _Journal, replicas: list[str], v: int, failed: str) -> None:
    """Ловушка: проверка одной реплики не прошла → abort, никто не переключился. Это норма."""
    ck, bad = j.checksum(), j.checksum()
    for r in replicas:
        j.add("stage_start", r, v, buffer="staging")
    j.serve(j.rng.choice(replicas))
    for r in replicas:
        j.add("stage_done", r, v, checksum=bad if r == failed else ck, buffer="staging")
    for r in replicas:
        if r == failed:
            j.add("verify_fail", r, v, checksum=bad, expected_checksum=ck,
                  detail="сумма буфера ≠ ожидаемой")  # fmt: skip
        else:
            j.add("verify_ok", r, v, checksum=ck, expected_checksum=ck)
            j.add("ready", r, v)
    j.add("abort", _PUBLISHER, v, detail=f"не прошли проверку: {failed}")
    j.serve_all(replicas)


def _published(j: _Journal, replicas: list[str], v: int, inj: dict[str, str]) -> None:
    """Публикация версии v по протоколу шага 12.4.5 с внедрёнными нарушениями ``inj``."""
    ck, bad, prev = j.checksum(), j.checksum(), dict(j.current)
    staged = {r: bad if r == inj.get("verify_ok_mismatch") else ck for r in replicas}
    switched = {r: bad if r in (inj.get("verify_ok_mismatch"), inj.get("commit_mismatch")) else ck
                for r in replicas}  # fmt: skip
    buf = {r: "active" if r == inj.get("inplace") else "staging" for r in replicas}

    def verify_ready(r: str) -> None:
        if r != inj.get("skip_verify"):
            j.add("verify_ok", r, v, checksum=staged[r], expected_checksum=ck)
        j.add("ready", r, v)

    def commit(r: str) -> None:
        if r != inj.get("missed_commit"):
            j.commit(r, v, switched[r], buf[r])

    for r in replicas:
        j.add("stage_start", r, v, buffer=buf[r])
    j.serve(j.rng.choice(replicas))  # старая версия, пока пишется второй буфер — это норма
    for r in replicas:
        j.add("stage_done", r, v, checksum=staged[r], buffer=buf[r])
    if "serve_from_staging" in inj:
        r = inj["serve_from_staging"]
        j.serve(r, v, staged[r])
    others = [
        r for r in replicas if r not in (inj.get("early_commit"), inj.get("barrier_not_ready"))
    ]
    if "commit_no_wait" in inj:  # каждая реплика переключается сама, барьер записан потом
        for r in replicas:
            verify_ready(r)
            commit(r)
        j.serve_all(replicas)
        j.add("barrier", _PUBLISHER, v)
    elif "early_commit" in inj:
        r = inj["early_commit"]
        verify_ready(r)
        commit(r)
        j.serve(r)
        for x in others:
            verify_ready(x)
        j.add("barrier", _PUBLISHER, v)
        for x in others:
            commit(x)
    elif "barrier_not_ready" in inj:
        for x in others:
            verify_ready(x)
        j.add("barrier", _PUBLISHER, v)
        verify_ready(inj["barrier_not_ready"])
        for x in replicas:
            commit(x)
    else:
        for x in replicas:
            verify_ready(x)
        j.add("barrier", _PUBLISHER, v)
        for x in replicas:
            commit(x)
    j.serve_all(replicas)
    if "stale_request" in inj:
        r = inj["stale_request"]
        j.serve(r, *prev[r])


def _events_12_4_9(plan: dict) -> list[dict]:
    j = _Journal(random.Random(plan["seed"]))
    replicas, v = plan["replicas"], plan["v0"]
    ck0 = j.checksum()
    for r in replicas:
        j.add("init", r, v, checksum=ck0, buffer="active")
        j.current[r] = (v, ck0)
    j.serve_all(replicas)
    for i, inj in enumerate(plan["publications"]):
        if plan["abort_before"] == i:
            v += 1
            _aborted(j, replicas, v, plan["abort_replica"])
        v += 1
        _published(j, replicas, v, inj)
    return j.events


def _task_12_4_9(variant: int) -> dict:
    ws = _weight_sync()
    plan = _plan_12_4_9(variant)
    events = _events_12_4_9(plan)
    cols = ("seq", "t", "replica", "event", "version", "checksum", "expected_checksum",
            "request_id", "buffer", "detail")  # fmt: skip
    body = "\n".join(
        "| " + " | ".join("—" if e[c] in (None, "") else str(e[c]) for c in cols) + " |"
        for e in events
    )
    types = "\n".join(f"- `{k}` — {text}" for k, text in ws.EVENT_TYPES.items())
    rules = "\n".join(f"- `{k}` — {text}" for k, text in ws.AUDIT_RULES.items())
    statement = (
        f"**Аудит журнала синхронизации весов.** Публикатор (`{_PUBLISHER}`) раздаёт новые "
        f"версии весов {len(plan['replicas'])} репликам движка генерации. Протокол шага 12.4.5: "
        "реплика пишет версию во второй (staging) буфер, проверяет её контрольной суммой "
        "(`checksum` против присланной `expected_checksum`), сообщает `ready`; когда готовы все "
        "реплики, публикатор записывает `barrier`, и только после него реплики переключаются "
        "(`commit`) и обслуживают новую версию. Запрос (`serve`) закрепляет за собой версию "
        "активного буфера; `checksum` у `serve` и `commit` — сумма активных весов.\n\n"
        f"Журнал (событий: {len(events)}, по времени; он же — `task['events']`, удобно "
        "`pd.DataFrame(task['events'])`):\n\n"
        f"| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n{body}\n\n"
        f"Типы событий:\n{types}\n\nПравила аудита (коды — `task['rules']`):\n{rules}\n\n"
        "Какие правила нарушены в этом журнале? Ответ — список кодов (каждый код один раз, "
        'порядок не важен), например `["inplace_update"]`; если журнал чистый — `[]`. '
        "Ищите сами; после проверки можно сверить с `weight_sync.audit_log(task['events'])`."
    )
    return {"statement": statement, "events": events, "rules": dict(ws.AUDIT_RULES)}


def _audit_messages(task: dict) -> list[str]:
    return _weight_sync().audit_log(task["events"])


def _reference_12_4_9(task: dict) -> list[str]:
    found = {m[1 : m.index("]")] for m in _audit_messages(task)}
    return [code for code in task["rules"] if code in found]


def _given_codes(given: Any) -> set[str] | None:
    given = _plain(given)
    if not isinstance(given, (list, tuple, set, frozenset)):
        return None
    if not all(isinstance(x, str) for x in given):
        return None
    return {_norm(x).strip("[]` ") for x in given}


def _same_12_4_9(expected: list[str], given: Any) -> bool:
    return _given_codes(given) == set(expected)


def _mc_everything(task: dict) -> _CodeFamily:
    codes = list(task["rules"])

    def test(given: Any) -> bool:
        g = _given_codes(given)
        return g is not None and g != set(_reference_12_4_9(task)) and len(g) >= len(codes) - 1

    return _CodeFamily(codes, test)


def _mc_commit_enough(task: dict) -> _CodeFamily:
    ref = set(_reference_12_4_9(task))
    missed = ref & _BARRIER_CODES

    def test(given: Any) -> bool:
        g = _given_codes(given)
        return g is not None and g < ref and bool(ref - g) and (ref - g) <= missed

    return _CodeFamily([c for c in task["rules"] if c in ref - missed], test)


def _mc_checksum_ignored(task: dict) -> _CodeFamily:
    ref = set(_reference_12_4_9(task))
    wrong = ref - {"checksum_mismatch"}

    def test(given: Any) -> bool:
        return "checksum_mismatch" in ref and _given_codes(given) == wrong

    return _CodeFamily([c for c in task["rules"] if c in wrong], test)


def _validate_12_4_9(answer: Any, task: dict) -> str | None:
    codes = _given_codes(answer)
    if codes is None:
        return (
            'Ожидается список кодов нарушений (строк), например ["inplace_update"], или [] '
            f"для чистого журнала; получено: {type(answer).__name__}."
        )
    unknown = sorted(codes - set(task["rules"]))
    if unknown:
        return (
            f"Неизвестные коды: {', '.join(unknown)}. Допустимы ключи AUDIT_RULES: "
            f"{', '.join(task['rules'])}."
        )
    return None


def _mismatch_12_4_9(expected: list[str], answer: Any, task: dict) -> str:
    g = _given_codes(answer) or set()
    ref = set(expected)
    if not ref:
        return f"В ответе {len(g)} кодов, а журнал стоит перепроверить: нарушено ли что-то на самом деле?"
    return (
        f"Нарушенных правил в журнале: {len(ref)}. Вы верно назвали {len(ref & g)}, лишних "
        f"(не нарушенных) кодов в ответе: {len(g - ref)}."
    )


def _solution_12_4_9(task: dict) -> str:
    ref = _reference_12_4_9(task)
    messages = _audit_messages(task)
    events = task["events"]
    lines = "\n".join(f"- {m}" for m in messages)
    aborted = sorted({e["version"] for e in events if e["event"] == "abort"})
    notes = [
        "запрос `serve` старой версии, пока новая пишется во второй буфер, — не нарушение: "
        "ради этого и нужен двойной буфер"
    ]
    if aborted:
        notes.append(
            f"`verify_fail` и `abort` версии {', '.join(map(str, aborted))} — протокол "
            "сработал: проверка поймала порчу, и ни одна реплика не переключилась"
        )
    found = (
        f"`audit_log` находит нарушения (сообщений: {len(messages)}):\n\n{lines}"
        if messages
        else "`audit_log` нарушений не находит: журнал чистый."
    )
    replicas = sorted({e["replica"] for e in events if e["replica"] != _PUBLISHER})
    return (
        f"Идём по журналу по времени и для каждой реплики ({', '.join(replicas)}) и версии "
        "проверяем порядок stage → verify_ok (сумма = ожидаемой) → ready → barrier (когда ready "
        "прислали все) → commit → serve; после переключения все реплики должны обслуживать "
        "одну версию, и версия реплики не убывает.\n\n"
        f"{found}\n\n**Ответ:** `{ref}`.\n\nНе нарушения: " + "; ".join(notes) + ".\n\n"
        "Барьер нужен не для красоты: реплика, переключившаяся или начавшая обслуживать новую "
        "версию до барьера, может оказаться единственной с этой версией (остальные ещё не "
        "готовы или провалят проверку) — и в пакет попадут роллауты разных политик."
    )


register(
    Exercise(
        id="12.4.9",
        title="Аудит журнала синхронизации весов: нарушения протокола",
        make_task=_task_12_4_9,
        reference=_reference_12_4_9,
        solution=_solution_12_4_9,
        hint=(
            "Для каждой версии: у всех ли реплик были verify_ok с checksum = expected_checksum "
            "и ready до barrier? Не было ли commit или serve новой версии до barrier? Совпадает "
            "ли сумма commit/serve с эталоном версии? Писались ли веса в staging? После "
            "переключений — одна ли версия у всех реплик, не уменьшается ли она?"
        ),
        misconceptions=[
            Misconception(
                "everything_wrong",
                "Вы перечислили (почти) все правила. Аудит — это поиск конкретных нарушений: "
                "найдите событие, которое нарушает каждое названное правило; остальные коды "
                "уберите.",
                _mc_everything,
            ),
            Misconception(
                "commit_is_enough",
                "Вы пропустили нарушения барьера готовности. Переключение (commit) и проверка "
                "одной реплики не делают версию доступной: обслуживать и включать её можно "
                "только после barrier, когда ready прислали все реплики (и barrier не должен "
                "опережать их ready).",
                _mc_commit_enough,
            ),
            Misconception(
                "checksum_ignored",
                "Вы не сверили контрольные суммы. verify_ok ещё не значит, что checksum равна "
                "expected_checksum, а commit и serve должны нести сумму той же версии — иначе "
                "реплика обслуживает не те веса.",
                _mc_checksum_ignored,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_4_9),
        validate_answer=_validate_12_4_9,
        describe_mismatch=_mismatch_12_4_9,
    )
)
