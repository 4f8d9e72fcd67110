"""12.2.6 — B_state и байты на ранг при DDP и ZeRO-1/2/3; здесь же помощники шагов 12.2.6–12.2.8."""

import random
from collections.abc import Callable
from typing import Any

from course_utils import fmt, memory
from course_utils.exercises.answers import Fields, Number, norm
from course_utils.exercises.step import Step, Trap


class UnitFields(Fields):
    """Fields, чей отзыв называет все неверные ключи и объясняет первый (отношение 2³⁰ и т. п.)."""

    def mismatch(self, expected: Any, given: Any) -> str:
        wrong = self.wrong_keys(expected, given)
        if len(wrong) == 1:
            return super().mismatch(expected, given)
        e, g = ({norm(k): v for k, v in d.items()} for d in (expected, given))
        why = self.fields[wrong[0]].mismatch(e[norm(wrong[0])], g[norm(wrong[0])])
        return f"Неверны значения: {', '.join(wrong)}. {wrong[0]}: {why[0].lower()}{why[1:]}"


def by_key(keys: str | tuple, wrong: Callable[[dict], dict], kind: Number) -> dict:
    """wrong и matches для Trap: ответ — wrong(task); ошибка узнаётся, если совпал один из keys."""
    keys = (keys,) if isinstance(keys, str) else keys
    return {"wrong": lambda task, ref: wrong(task), "matches": lambda task, given: any(
        kind.same(wrong(task)[k], {norm(x): v for x, v in given.items()}[norm(k)]) for k in keys)}  # fmt: skip


def tex(n: int) -> str:
    """Целое для формулы LaTeX: разряды через тонкий пробел \\, (как fmt.num, но в $$…$$)."""
    return fmt.num(int(n)).replace(fmt.NBSP, "\\,")


# Рецепты с Σb ≠ 16: иначе ошибка «16 байт — закон» совпала бы с верным ответом.
_RECIPES = ("mixed_fp32_grads", "bf16_pure_adam", "adam8bit_mixed", "sgd_momentum_fp32")
_ROUND_N = (1_300_000_000, 3_000_000_000, 14_000_000_000, 32_000_000_000, 70_000_000_000)
_FIELDS = (("param_bytes", "веса", "b_{param}"), ("grad_bytes", "градиенты", "b_{grad}"),
           ("m1_bytes", "первый момент Adam m1", "b_{m1}"), ("m2_bytes", "второй момент Adam m2", "b_{m2}"),
           ("master_bytes", "fp32-мастер-копия весов", "b_{master}"))  # fmt: skip
GIB_1PCT = Number(rtol=1e-2, unit="ГиБ")


def make_task(variant: int) -> dict:
    rng = random.Random(12_2_6_000 + 7919 * variant)
    recipe = _RECIPES[variant % len(_RECIPES)]
    model = rng.choice(memory.available_model_configs()) if variant % 2 == 0 else None
    n = memory.ModelShape.from_name(model).num_params if model else rng.choice(_ROUND_N)
    source = (f"{model}: точное число по `data/model_configs/{model}.json`" if model
              else "круглое число для прикидки")  # fmt: skip
    world = rng.choice([4, 8, 16, 32, 64] if n > 10**10 else [2, 4, 8, 16])
    r = memory.RECIPES[recipe]
    rows = "\n".join(f"| {text} | ${sym}$ | {getattr(r, f):g} |" for f, text, sym in _FIELDS)
    statement = (
        f"**Состояние модели и ZeRO.** Модель: N = "
        f"{fmt.count(n, 'параметр', 'параметра', 'параметров')} ({source}). Рецепт `{recipe}` — "
        f"{r.label}. Байт на параметр:\n\n| статья | обозначение | Б/параметр "
        f"|\n|---|---|---|\n{rows}\n| **итого** | $\\Sigma b$ | **{r.total:g}** |\n\nОбучение с "
        f"параллелизмом данных на D = {world} GPU (N, таблица и D — в `task_12_2_6['n_params']`, "
        "`task_12_2_6['bytes_per_param']`, `task_12_2_6['world_size']`). Напоминание: в DDP каждый "
        "ранг хранит полную копию состояния; ZeRO-1 делит между рангами состояния оптимизатора "
        "(m1, m2 и мастер-копию), ZeRO-2 — ещё и градиенты, ZeRO-3 (= FSDP full shard) — ещё и "
        "веса.\n\nНайдите в **ГиБ** (1 ГиБ = 2³⁰ Б, не путать с ГБ = 10⁹ Б):\n1. `B_state` — "
        "полное модельное состояние;\n2. `ddp`, `zero1`, `zero2`, `zero3` — постоянную часть "
        "состояния на один ранг (без активаций, буферов связи и временной сборки слоёв).\n\n"
        'Ответ — словарь `{"B_state": …, "ddp": …, "zero1": …, "zero2": …, "zero3": …}`, числа в '
        "ГиБ; относительный допуск 1 % (rtol = 1e-2), так что долю N/D можно не округлять до "
        "целого ⌈N/D⌉."
    )  # fmt: skip
    return {"statement": statement, "model": model, "n_params": n, "recipe": recipe,
            "bytes_per_param": {f: getattr(r, f) for f, _, _ in _FIELDS}, "world_size": world}  # fmt: skip


def solve(task: dict, recipe: str | None = None) -> dict:
    """B_state и байты на ранг при DDP и ZeRO-1/2/3 (ГиБ) по memory; recipe — подмена рецепта."""
    n, recipe, world = task["n_params"], recipe or task["recipe"], task["world_size"]
    out = {"B_state": memory.to_unit(memory.state_bytes(n, recipe), "GiB")}
    for stage, key in enumerate(("ddp", "zero1", "zero2", "zero3")):
        out[key] = memory.to_unit(memory.per_rank_state_bytes(n, recipe, world, stage), "GiB")
    return out


def _split_all(task: dict) -> dict:  # «ZeRO-1 делит всё»: zero1 = zero2 = zero3 = B_state / D
    r = solve(task)
    return {**r, **dict.fromkeys(("zero1", "zero2", "zero3"), r["B_state"] / task["world_size"])}


def solution(task: dict, ref: dict) -> str:
    n, d, b = task["n_params"], task["world_size"], task["bytes_per_param"]
    bp, bg, k = b["param_bytes"], b["grad_bytes"], b["m1_bytes"] + b["m2_bytes"] + b["master_bytes"]
    total, terms = bp + bg + k, " + ".join(f"{v:g}" for v in b.values())
    g, who = (
        {key: f"{v:.3f}" for key, v in ref.items()},
        f"{task['model']}, " if task["model"] else "",
    )
    return (
        f"Модель: {who}N = {fmt.count(n, 'параметр', 'параметра', 'параметров')}, рецепт "
        f"`{task['recipe']}`, D = {d}. Всё модельное состояние — сумма хранимых представлений:\n\n"
        "$$B_{state} = N(b_{param} + b_{grad} + b_{m1} + b_{m2} + b_{master}) = "
        f"{tex(n)} \\cdot ({terms}) = {tex(n * total)}\\ \\text{{Б}} = {g['B_state']}\\ "
        f"\\text{{ГиБ}}.$$\n\nСостояния оптимизатора (в смысле ZeRO): $K = b_{{m1}} + b_{{m2}} + "
        f"b_{{master}} = {k:g}$ Б/параметр. На один ранг из D = {d}:\n\n| режим | что делится на D "
        f"| формула | ГиБ |\n|---|---|---|---|\n| DDP | ничего | $N \\cdot {total:g}$ | {g['ddp']} "
        f"|\n| ZeRO-1 | m1, m2, мастер-копия | $N({bp:g} + {bg:g}) + N \\cdot {k:g}/{d}$ | "
        f"{g['zero1']} |\n| ZeRO-2 | + градиенты | $N \\cdot {bp:g} + N({bg:g} + {k:g})/{d}$ | "
        f"{g['zero2']} |\n| ZeRO-3 / FSDP | + веса | $N \\cdot {total:g}/{d}$ | {g['zero3']} |\n\n"
        f"**Ответ (ГиБ):** `{ {key: round(v, 3) for key, v in ref.items()} }`.\n\nDDP ничего не "
        "делит: каждый ранг держит всё. ZeRO-1 не трогает веса и градиенты, поэтому делится лишь "
        "часть K. Рецепт здесь не «16 байт»: считайте по таблице, а не по правилу большого пальца. "
        "$B_{state}/D$ — это только ZeRO-3, и то без временной сборки слоёв."
    )


STEP = Step(
    id="12.2.6", make_task=make_task, solve=solve, solution=solution,
    answer=UnitFields({k: GIB_1PCT for k in ("B_state", "ddp", "zero1", "zero2", "zero3")}),
    hint="B_state = N·(сумма строк таблицы рецепта). На ранг: в DDP — всё; ZeRO-1 делит на D только "
    "m1 + m2 + мастер-копию; ZeRO-2 — ещё градиенты; ZeRO-3 — всё. Переведите байты в ГиБ делением на 2³⁰.",
    traps=(
        Trap("sixteen_law", "Вы взяли «16 байт на параметр», а у этого рецепта другая сумма. 16 Б "
             "— лишь сценарий bf16-весов с Adam во float32 и мастер-копией; считайте "
             "B_state = N·(b_param + b_grad + b_m1 + b_m2 + b_master) по таблице условия.",
             **by_key("B_state", lambda t: solve(t, "bf16_mixed_adam"), GIB_1PCT)),
        Trap("shard_everything_at_zero1", "На ZeRO-1 вы разделили на D всё состояние. ZeRO-1 "
             "шардирует только состояния оптимизатора (m1, m2, мастер-копию); веса и градиенты на "
             "каждом ранге остаются целиком. Градиенты делятся с ZeRO-2, веса — только с ZeRO-3 "
             "(FSDP full shard).", **by_key("zero1", _split_all, GIB_1PCT)),
        Trap("ddp_divides", "В DDP вы разделили состояние на D. DDP делит между рангами данные "
             "(мини-пакет), а не модель: каждый ранг хранит полную копию весов, градиентов и "
             "оптимизатора, то есть все B_state.", override={"ddp": lambda t: _split_all(t)["zero3"]}),
    ),
)  # fmt: skip
