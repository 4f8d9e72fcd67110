"""12.3.8 — устойчивость очереди (λ < μ), скорость роста и порог обратного давления в токенах."""

import random
from fractions import Fraction

from course_utils.exercises.answers import Bool, Fields, Number, sig
from course_utils.exercises.step import Step, Trap
from course_utils.fmt import NBSP

from .pipeline_split import TOLERANCE, s, shape, value

_CONFIGS = ("A", "B", "C")
_GROWTH = Number(rtol=1e-2, unit="токенов/с")
ANSWER = Fields({"stable": Fields(dict.fromkeys(_CONFIGS, Bool())),
                 "growth_tokens_per_s": Fields(dict.fromkeys(_CONFIGS, _GROWTH)),
                 "threshold_tokens": Number(rtol=1e-2, unit="токенов", integer=True)})  # fmt: skip


def _tex(n: float) -> str:
    """Целое для формулы LaTeX: разряды через тонкий пробел ``\\,`` (32768 → 32\\,768)."""
    return sig(int(n)).replace(NBSP, "\\,")


def make_task(variant: int) -> dict:
    rng = random.Random(12_3_8_000 + 7919 * variant)
    while True:
        c_eq = rng.choice([4, 5, 6, 8, 10])
        mean_len = rng.choice([256, 384, 512, 640, 768, 1024])
        rho = rng.choice([0.125, 0.2, 0.25, 0.4, 0.5])  # роллаутов/с на сборщика
        batch = rng.choice([8192, 16384, 32768])
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
    lines = "\n".join(f"| {c} | {n} |" for c, n in collectors.items())
    statement = (
        "**Очередь роллаутов и обратное давление.** Сборщики кладут роллауты в очередь FIFO; "
        f"тренер забирает пакеты по B = {sig(batch)} токенов, шаг на пакете — t = {float(step):g} "
        f"с, после шага публикуется новая версия весов. Сборщик выдаёт в среднем ρ = {rho} "
        f"роллаута/с, средняя длина роллаута ℓ̄ = {mean_len} токенов, но длины сильно разнятся: "
        f"от десятков токенов до max_tokens = {max_tokens}. Три конфигурации пула генерации (они "
        "же в `task_12_3_8['collectors']`):\n\n| конфигурация | сборщиков "
        f'|\n|---|---|\n{lines}\n\nНайдите:\n1. `stable` — словарь `{{"A": …, "B": …, "C": …}}` '
        "из True/False: устойчива ли очередь без обратного давления (глубина ограничена, а не "
        "растёт со временем);\n2. `growth_tokens_per_s` — словарь по конфигурациям: средняя "
        "скорость роста очереди, токенов/с (0, если в среднем не растёт);\n3. `threshold_tokens` "
        f"— порог обратного давления для конфигурации {big}: сборщик начинает новый роллаут, "
        "только если в очереди не больше θ токенов; начатый роллаут не отменяется и приходит "
        f"целиком. Глубина очереди никогда не должна превышать L·B токенов при L = {lag} (тогда "
        "роллаут ждёт не больше L шагов тренера и задержка политики ограничена). Худший случай: "
        "в очереди ровно θ токенов, все сборщики разом начинают роллауты предельной длины, "
        "тренер ничего не забирает, пока они не придут. Нужен наибольший такой θ — целое число "
        f"токенов.\n\nОтвет — словарь `{shape(ANSWER)}`; числа — {TOLERANCE}."
    )
    return {"statement": statement, "collectors": collectors, "rollouts_per_s_per_collector": rho,
            "mean_tokens": mean_len, "max_tokens": max_tokens, "batch_tokens": batch,
            "step_s": float(step), "max_lag_steps": lag, "backpressure_config": big}  # fmt: skip


def _lam_mu(task: dict) -> tuple[dict[str, Fraction], Fraction]:
    """λ по конфигурациям и μ, токенов/с — точными дробями (равенство λ = μ без округлений)."""
    per_collector = Fraction(str(task["rollouts_per_s_per_collector"])) * task["mean_tokens"]
    lam = {c: n * per_collector for c, n in task["collectors"].items()}
    return lam, task["batch_tokens"] / Fraction(str(task["step_s"]))


def _growth(task: dict) -> dict[str, Fraction]:
    """λ − μ по конфигурациям (со знаком), токенов/с."""
    lam, mu = _lam_mu(task)
    return {c: x - mu for c, x in lam.items()}


def _config(task: dict, sign: int) -> str:
    """Конфигурация, где знак λ − μ равен ``sign`` (−1, 0, +1); в каждом варианте по одной."""
    return next(c for c, x in _growth(task).items() if (x > 0) - (x < 0) == sign)


def _threshold(task: dict, in_flight: int) -> int:
    """θ = L·B − C·ℓ: предел глубины минус по роллауту длины ℓ в полёте от каждого сборщика."""
    C = task["collectors"][task["backpressure_config"]]
    return task["max_lag_steps"] * task["batch_tokens"] - C * in_flight


def solve(task: dict) -> dict:
    growth = _growth(task)
    return {"stable": {c: x < 0 for c, x in growth.items()},
            "growth_tokens_per_s": {c: float(max(x, 0)) for c, x in growth.items()},
            "threshold_tokens": _threshold(task, task["max_tokens"])}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    (lam, mu), rho, ell = _lam_mu(task), task["rollouts_per_s_per_collector"], task["mean_tokens"]
    B, L, m = task["batch_tokens"], task["max_lag_steps"], task["max_tokens"]
    big = task["backpressure_config"]
    C = task["collectors"][big]
    rows = "\n".join(f"| {c} | {n} | {n} · {rho} · {ell} = {sig(int(lam[c]))} | "
                     f"{'<' if lam[c] < mu else '=' if lam[c] == mu else '>'} | "
                     f"{'да' if ref['stable'][c] else 'нет'} | {s(ref['growth_tokens_per_s'][c])} |"
                     for c, n in task["collectors"].items())  # fmt: skip
    return (
        f"**Скорости — в токенах в секунду.** Тренер потребляет $\\mu = B / t = {_tex(B)} / "
        f"{task['step_s']:g} = {_tex(mu)}$ токенов/с, сборщики поставляют $\\lambda = C \\cdot ρ "
        "\\cdot \\bar\\ell$:\n\n| конфигурация | C | λ, токенов/с | λ ? μ | устойчива | рост, "
        f"токенов/с |\n|---|---|---|---|---|---|\n{rows}\n\nОчередь устойчива только при строгом "
        "$\\lambda < \\mu$; при $\\lambda > \\mu$ она растёт в среднем на $\\lambda - \\mu$ "
        f"токенов/с. Конфигурация {_config(task, 0)} с $\\lambda = \\mu$ в среднем не растёт, но и "
        "не устойчива: колебания длин ничем не возвращаются к нулю, глубина блуждает неограниченно. "
        "Отрицательного роста не бывает: пустая очередь не уходит ниже нуля, тренер голодает.\n\n"
        f"**Порог для {big}.** Порог останавливает запуск новых роллаутов, но не начатые: в худшем "
        f"случае каждый из {C} сборщиков уже начал роллаут до max_tokens = {m} токенов, и все они "
        "придут после закрытия порога (перелёт). Считать их по средней длине нельзя — гарантию даёт "
        "только предельная длина:\n\n$$\\theta + C \\cdot \\text{max\\_tokens} \\le L \\cdot B "
        f"\\;\\Rightarrow\\; \\theta = {L} \\cdot {_tex(B)} - {C} \\cdot {m} = "
        f"{_tex(ref['threshold_tokens'])}\\ \\text{{токенов}}.$$\n\nНаблюдаемая глубина может "
        "превышать θ на работу «в полёте», и при медленном тренере — большую часть времени (урок "
        "12.3.4): это следствие правила запуска, а не ошибка счётчика; его стоит записать в "
        f"контракт очереди.\n\n**Ответ:** `{ref}`."
    )


STEP = Step(
    id="12.3.8", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint="Переведите обе скорости в токены/с: λ = сборщики × роллаутов/с × средняя длина, μ = B / t; "
    "устойчивость — строгое λ < μ. Порог закрывает только запуск новых роллаутов: к θ добавится по "
    "роллауту предельной длины от каждого сборщика, и сумма не должна превысить L·B.",
    traps=(
        Trap("stable_if_equal", "При λ = μ очередь не устойчива: средний рост нулевой, но колебания "
             "длин ничем не гасятся, и глубина блуждает неограниченно. Нужно строгое λ < μ.",
             override={"stable": lambda t: {**solve(t)["stable"], _config(t, 0): True}},
             matches=lambda t, g: Bool().same(True, value(value(g, "stable"), _config(t, 0)))),
        Trap("negative_growth", "Рост получился отрицательным. При λ < μ очередь не уходит ниже "
             "нуля: она ограничена, а тренер часть времени голодает. Рост — max(λ − μ, 0).",
             override={"growth_tokens_per_s": lambda t: {c: float(x) for c, x in _growth(t).items()}},
             matches=lambda t, g: _GROWTH.same(_growth(t)[_config(t, -1)],
                                               value(value(g, "growth_tokens_per_s"), _config(t, -1)))),
        Trap("ignore_inflight", "Порог равен L·B — забыты роллауты в полёте: уже начатые (по одному "
             "на сборщика, до max_tokens) всё равно придут, поэтому θ = L·B − C·max_tokens.",
             override={"threshold_tokens": lambda t: _threshold(t, 0)}),
        Trap("count_not_tokens", "Начатые роллауты посчитаны по средней длине, то есть очередь "
             "ограничена числом роллаутов. Длины сильно разнятся, гарантию даёт только предельная "
             "длина: θ = L·B − C·max_tokens.",
             override={"threshold_tokens": lambda t: _threshold(t, t["mean_tokens"])}),
    ),
)  # fmt: skip
