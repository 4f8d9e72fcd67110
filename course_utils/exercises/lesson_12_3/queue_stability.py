"""12.3.8 — устойчивость очереди (λ < μ), скорость роста и порог обратного давления в токенах."""

import random
from fractions import Fraction

from course_utils.exercises.answers import Bool, Fields, Number, num
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
    return num(int(n)).replace(NBSP, "\\,")


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
        f"тренер забирает из неё пакеты по B = {num(batch)} токенов, шаг на пакете занимает "
        f"t = {float(step):g} с, после шага публикуется новая версия весов. Каждый сборщик "
        f"выдаёт в среднем ρ = {rho} роллаута/с; средняя длина роллаута в токенах "
        f"ℓ̄ = {mean_len}, но длины сильно разнятся: от десятков токенов до предела "
        f"max_tokens = {max_tokens}. Рассматриваются три конфигурации пула генерации (они же в "
        f"`task_12_3_8['collectors']`):\n\n| конфигурация | сборщиков |\n|---|---|\n{lines}\n\n"
        'Найдите:\n1. `stable` — словарь `{"A": …, "B": …, "C": …}` из True/False: устойчива ли '
        "очередь без обратного давления (глубина остаётся ограниченной, а не растёт со временем);\n"
        "2. `growth_tokens_per_s` — словарь по конфигурациям: средняя скорость роста очереди, "
        "токенов/с (0, если в среднем очередь не растёт);\n"
        f"3. `threshold_tokens` — порог обратного давления для конфигурации {big}. Сборщик "
        "начинает новый роллаут, только если в очереди не больше θ токенов; начатый роллаут "
        "не отменяется и приходит в очередь целиком. Требование: глубина очереди никогда не "
        f"превышает L·B токенов при L = {lag} (тогда роллаут ждёт в очереди не больше L шагов "
        "тренера и задержка политики ограничена). Считайте худший случай: в очереди ровно θ "
        "токенов, все сборщики в этот момент начинают роллауты предельной длины, а тренер "
        "ничего не забирает, пока они не придут. Нужен наибольший такой θ — целое число "
        f"токенов.\n\nОтвет — словарь `{shape(ANSWER)}`; числа — {TOLERANCE}."
    )
    return {"statement": statement, "collectors": collectors, "rollouts_per_s_per_collector": rho,
            "mean_tokens": mean_len, "max_tokens": max_tokens, "batch_tokens": batch,
            "step_s": float(step), "max_lag_steps": lag, "backpressure_config": big}  # fmt: skip


def _rates(task: dict) -> tuple[dict[str, Fraction], Fraction]:
    """λ по конфигурациям и μ, токенов/с — точными дробями (равенство λ = μ без округлений)."""
    per_collector = Fraction(str(task["rollouts_per_s_per_collector"])) * task["mean_tokens"]
    lam = {c: n * per_collector for c, n in task["collectors"].items()}
    return lam, task["batch_tokens"] / Fraction(str(task["step_s"]))


def _growth(task: dict) -> dict[str, Fraction]:
    """λ − μ по конфигурациям (со знаком), токенов/с."""
    lam, mu = _rates(task)
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
    (lam, mu), rho, ell = _rates(task), task["rollouts_per_s_per_collector"], task["mean_tokens"]
    B, L, m, big = (
        task[k] for k in ("batch_tokens", "max_lag_steps", "max_tokens", "backpressure_config")
    )
    rows = "\n".join(f"| {c} | {n} | {n} · {rho} · {ell} = {num(int(lam[c]))} | "
                     f"{'<' if lam[c] < mu else '=' if lam[c] == mu else '>'} | "
                     f"{'да' if ref['stable'][c] else 'нет'} | {s(ref['growth_tokens_per_s'][c])} |"
                     for c, n in task["collectors"].items())  # fmt: skip
    return (
        "**Скорости в одних единицах — токенах в секунду.** Тренер потребляет "
        f"$\\mu = B / t = {_tex(B)} / {task['step_s']:g} = {_tex(mu)}$ токенов/с. Сборщики "
        "поставляют $\\lambda = C \\cdot ρ \\cdot \\bar\\ell$:\n\n"
        "| конфигурация | C | λ, токенов/с | λ ? μ | устойчива | рост, токенов/с |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n"
        "Очередь устойчива только при строгом $\\lambda < \\mu$; при $\\lambda > \\mu$ она "
        f"растёт в среднем на $\\lambda - \\mu$ токенов/с. Конфигурация {_config(task, 0)} с "
        "$\\lambda = \\mu$ не растёт в среднем, но и не устойчива: случайные колебания длин ничем "
        "не возвращаются к нулю, и глубина блуждает неограниченно. Отрицательной скорости роста "
        "не бывает: пустая очередь не уходит ниже нуля, тренер просто голодает.\n\n"
        f"**Порог для {big}.** Порог останавливает запуск новых работ, но не начатые "
        f"роллауты: в худшем случае каждый из {task['collectors'][big]} сборщиков уже начал "
        f"роллаут длиной до max_tokens = {m}, и все они придут в очередь после закрытия порога "
        "(перелёт). Считать начатые роллауты по средней длине нельзя: длины сильно разнятся, "
        "гарантию даёт только предельная длина. Поэтому\n\n"
        f"$$\\theta + C \\cdot \\text{{max\\_tokens}} \\le L \\cdot B \\;\\Rightarrow\\; "
        f"\\theta = {L} \\cdot {_tex(B)} - {task['collectors'][big]} \\cdot {m} = "
        f"{_tex(ref['threshold_tokens'])}\\ \\text{{токенов}}.$$\n\n"
        "Наблюдаемая глубина очереди может превышать θ на объём работы «в полёте», и не "
        "обязательно ненадолго: при медленном тренере очередь держится выше θ большую часть "
        "времени (урок 12.3.4). Это следствие правила запуска, а не ошибка счётчика; его стоит "
        f"записать в контракт очереди.\n\n**Ответ:** `{ref}`."
    )


STEP = Step(
    id="12.3.8", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint="Переведите обе скорости в токены/с: λ = сборщики × роллаутов/с × средняя длина, "
    "μ = B / t. Устойчивость — строгое λ < μ. Порог закрывает только запуск новых роллаутов: к θ "
    "в худшем случае добавится по роллауту предельной длины от каждого сборщика, и сумма не "
    "должна превысить L·B.",
    traps=(
        Trap("stable_if_equal", "При λ = μ очередь не устойчива: средний рост нулевой, но "
             "случайные колебания длин ничем не гасятся, и глубина блуждает неограниченно. "
             "Условие устойчивости — строгое λ < μ.",
             override={"stable": lambda t: {**solve(t)["stable"], _config(t, 0): True}},
             matches=lambda t, g: Bool().same(True, value(value(g, "stable"), _config(t, 0)))),
        Trap("negative_growth", "Скорость роста получилась отрицательной. При λ < μ очередь не "
             "уходит ниже нуля: она остаётся ограниченной, а тренер часть времени голодает. "
             "Рост — max(λ − μ, 0).",
             override={"growth_tokens_per_s": lambda t: {c: float(x) for c, x in _growth(t).items()}},
             matches=lambda t, g: _GROWTH.same(_growth(t)[_config(t, -1)],
                                               value(value(g, "growth_tokens_per_s"), _config(t, -1)))),
        Trap("ignore_inflight", "Порог равен L·B — вы забыли работы в полёте. Порог останавливает "
             "только запуск новых роллаутов; уже начатые (по одному на сборщика, до max_tokens "
             "каждый) всё равно придут в очередь, поэтому θ = L·B − C·max_tokens.",
             override={"threshold_tokens": lambda t: _threshold(t, 0)}),
        Trap("count_not_tokens", "Начатые роллауты вы посчитали по средней длине — по сути, "
             "ограничили очередь числом роллаутов. Длины сильно разнятся: один роллаут может быть "
             "в разы длиннее среднего, и гарантию даёт только предельная длина: "
             "θ = L·B − C·max_tokens.",
             override={"threshold_tokens": lambda t: _threshold(t, t["mean_tokens"])}),
    ),
)  # fmt: skip
