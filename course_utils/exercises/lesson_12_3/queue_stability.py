"""12.3.8 — устойчивость очереди (λ < μ), скорость роста и порог обратного давления в токенах."""

import random
from fractions import Fraction

from course_utils import fmt
from course_utils.exercises.answers import Bool, Fields, Number, get, md_table, sig, tex_num
from course_utils.exercises.common import traps
from course_utils.exercises.step import Step

_CONFIGS = ("A", "B", "C")
_GROWTH = Number(rtol=1e-2, unit="токенов/с")
_STABLE, _GROWTHS = (Fields(dict.fromkeys(_CONFIGS, t)) for t in (Bool(), _GROWTH))
_THETA = Number(rtol=1e-2, unit="токенов", integer=True)
_ANSWER = Fields({"stable": _STABLE, "growth_tokens_per_s": _GROWTHS, "threshold_tokens": _THETA})


def _queue_task(variant: int) -> dict:
    rng = random.Random(12_3_8_000 + 7919 * variant)
    while True:  # ρ — роллаутов/с на сборщика
        c_eq, mean_len = rng.choice([4, 5, 6, 8, 10]), rng.choice([256, 384, 512, 640, 768, 1024])
        rho, batch = rng.choice([0.125, 0.2, 0.25, 0.4, 0.5]), rng.choice([8192, 16384, 32768])
        step = batch / (c_eq * Fraction(str(rho)) * mean_len)  # λ = μ ровно при c_eq сборщиках
        if step.denominator in (1, 2, 4, 5, 10, 20, 25, 50, 100) and 1 <= step <= 30:
            break
    counts = [c_eq - rng.randint(1, min(3, c_eq - 2)), c_eq, c_eq + rng.randint(2, 4)]
    rng.shuffle(counts)
    collectors = dict(zip(_CONFIGS, counts))
    big = max(collectors, key=collectors.get)
    while True:  # порог в худшем случае положителен и не меньше B/4
        lag = rng.choice([1, 2, 3, 4])
        max_tokens = rng.choice([m for m in (1024, 2048, 4096, 8192) if m >= 2 * mean_len])
        if lag * batch - collectors[big] * max_tokens >= batch // 4:
            break
    statement = (
        f"**Очередь роллаутов и обратное давление.** Сборщики кладут роллауты в очередь FIFO, тренер забирает за шаг t = {float(step):g} с пакет B = {fmt.count(batch, 'токен', 'токена', 'токенов')}. Сборщик выдаёт в среднем ρ = {rho} роллаута/с; средняя длина ℓ̄ = {fmt.count(mean_len, 'токен', 'токена', 'токенов')}, но длины сильно разнятся — до max_tokens = {max_tokens}. Сборщиков по конфигурациям (`task_12_3_8['collectors']`):\n\n"
        f"{md_table(('конфигурация', 'сборщиков'), collectors.items())}\n\nДля каждой конфигурации найдите `stable` — устойчива ли очередь без обратного давления (True/False) — и `growth_tokens_per_s` — средний рост очереди, токенов/с (0, если не растёт). `threshold_tokens` — наибольший целый порог θ для {big}: сборщик начинает роллаут, только если в очереди не больше θ токенов, а начатый не отменяется; глубина не должна превысить L·B при L = {lag}, даже если все сборщики разом начнут роллауты предельной длины, а тренер ничего не заберёт. Допуск 1 %."
    )
    task = {"collectors": collectors, "rollouts_per_s_per_collector": rho, "mean_tokens": mean_len}
    task |= {"max_tokens": max_tokens, "batch_tokens": batch, "step_s": float(step)}
    return {"statement": statement, **task, "max_lag_steps": lag, "backpressure_config": big}


def _queue_growth(task: dict) -> dict[str, Fraction]:
    """λ − μ по конфигурациям, токенов/с, точными дробями (λ = μ без округлений)."""
    per_collector = Fraction(str(task["rollouts_per_s_per_collector"])) * task["mean_tokens"]
    mu = task["batch_tokens"] / Fraction(str(task["step_s"]))
    return {c: n * per_collector - mu for c, n in task["collectors"].items()}


def _config_with_sign(task: dict, sign: int) -> str:  # знак λ − μ: −1, 0, +1 — по одной
    return next(c for c, x in _queue_growth(task).items() if (x > 0) - (x < 0) == sign)


def _threshold(task: dict, in_flight: int) -> int:  # θ = L·B − C·ℓ, ℓ — роллаут в полёте
    C = task["collectors"][task["backpressure_config"]]
    return task["max_lag_steps"] * task["batch_tokens"] - C * in_flight


def _queue_solve(task: dict) -> dict:
    growth = _queue_growth(task)
    return {
        "stable": {c: x < 0 for c, x in growth.items()},
        "growth_tokens_per_s": {c: float(max(x, 0)) for c, x in growth.items()},
        "threshold_tokens": _threshold(task, task["max_tokens"]),
    }


def _queue_solution(task: dict, ref: dict) -> str:
    B, L, m = task["batch_tokens"], task["max_lag_steps"], task["max_tokens"]
    big = task["backpressure_config"]
    rho, ell, C = task["rollouts_per_s_per_collector"], task["mean_tokens"], task["collectors"][big]
    mu = B / Fraction(str(task["step_s"]))
    theta_unit = fmt.plural(ref["threshold_tokens"], "токен", "токена", "токенов")
    rows = [
        (c, f"{n} · {rho} · {ell} = {sig(float(x + mu), 6)}", "<=>"[(x > 0) - (x < 0) + 1])
        + ("да" if ref["stable"][c] else "нет", sig(ref["growth_tokens_per_s"][c], 6))
        for (c, n), x in zip(task["collectors"].items(), _queue_growth(task).values())
    ]
    head = ("конфигурация", "λ = C · ρ · ℓ̄, токенов/с", "λ ? μ", "устойчива", "рост, токенов/с")
    return (
        f"μ = B / t = {sig(B)} / {task['step_s']:g} = {sig(float(mu), 6)} токенов/с:\n\n{md_table(head, rows)}\n\n"
        f"Устойчива только при строгом λ < μ, рост — max(λ − μ, 0). При λ = μ ({_config_with_sign(task, 0)}) средний рост нулевой, но колебания длин не гасятся, и глубина блуждает неограниченно.\n\n"
        f"**Порог для {big}.** Начатые роллауты придут и после закрытия порога: до max_tokens = {m} от каждого из {C} сборщиков (средняя длина гарантии не даёт):\n\n"
        f"$$\\theta = L \\cdot B - C \\cdot \\text{{max\\_tokens}} = {L} \\cdot {tex_num(B)} - {C} \\cdot {m} = {tex_num(ref['threshold_tokens'])}\\ \\text{{{theta_unit}}}.$$\n\n**Ответ:** `{ref}`."
    )


def _queue_slips(task: dict, ref: dict) -> dict[str, dict]:
    signed = {c: float(x) for c, x in _queue_growth(task).items()}
    return {
        "stable_if_equal": ref | {"stable": {**ref["stable"], _config_with_sign(task, 0): True}},
        "negative_growth": ref | {"growth_tokens_per_s": signed},
        "ignore_inflight": ref | {"threshold_tokens": _threshold(task, 0)},
        "count_not_tokens": ref | {"threshold_tokens": _threshold(task, task["mean_tokens"])},
    }


_TRAP_TEXT = {  # отзыв на типичную ошибку; ответ с ней — _queue_slips
    "stable_if_equal": "При λ = μ очередь не устойчива: средний рост нулевой, но колебания длин ничем не гасятся, и глубина блуждает неограниченно.",
    "negative_growth": "Рост получился отрицательным. При λ < μ очередь не уходит ниже нуля: она ограничена, а тренер часть времени голодает.",
    "ignore_inflight": "Порог равен L·B — забыты роллауты в полёте: уже начатые (по одному на сборщика, до max_tokens) всё равно придут.",
    "count_not_tokens": "Начатые роллауты посчитаны по средней длине. Длины сильно разнятся, и гарантию даёт только предельная длина.",
}
_TRAP_MATCH = {  # ошибки устойчивости и роста — по конфигурации, порога — по threshold_tokens
    "stable_if_equal": lambda t, g: bool(get(get(g, "stable"), _config_with_sign(t, 0))),
    "negative_growth": lambda t, g: _GROWTH.same(
        _queue_growth(t)[c := _config_with_sign(t, -1)], get(get(g, "growth_tokens_per_s"), c)
    ),
}
_HINT = "Переведите обе скорости в токены/с: λ = сборщики × роллаутов/с × средняя длина, μ = B / t; устойчивость — строгое λ < μ. Порог закрывает только запуск новых роллаутов: к θ добавится по роллауту предельной длины от каждого сборщика."
_TRAPS = traps(_queue_slips, _TRAP_TEXT, _TRAP_MATCH, default=("threshold_tokens",))
STEP = Step("12.3.8", _queue_task, _queue_solve, _ANSWER, _HINT, _queue_solution, _TRAPS)
