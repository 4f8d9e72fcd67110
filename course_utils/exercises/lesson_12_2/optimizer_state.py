"""12.2.6 — B_state и байты на ранг при DDP и ZeRO-1/2/3, ГиБ."""

import random

from course_utils import fmt, memory
from course_utils.exercises.answers import Fields, md_table, tex_num
from course_utils.exercises.common import GIB
from course_utils.exercises.step import Step, Trap

# Рецепты с Σb ≠ 16: иначе ошибка «16 байт — закон» совпала бы с верным ответом.
_RECIPES = ("mixed_fp32_grads", "bf16_pure_adam", "adam8bit_mixed", "sgd_momentum_fp32")
_ROUND_N = (1_300_000_000, 3_000_000_000, 14_000_000_000, 32_000_000_000, 70_000_000_000)
_FIELDS = ("param_bytes", "grad_bytes", "m1_bytes", "m2_bytes", "master_bytes")  # b_{param} …
_LABELS = ("веса", "градиенты", "первый момент Adam m1", "второй момент Adam m2", "мастер-копия")
_MODES = ("ddp", "zero1", "zero2", "zero3")  # индекс — стадия ZeRO


def _zero_task(variant: int) -> dict:
    rng = random.Random(12_2_6_000 + 7919 * variant)
    recipe = _RECIPES[variant % len(_RECIPES)]
    model = rng.choice(memory.available_model_configs()) if variant % 2 == 0 else None
    n = memory.ModelShape.from_name(model).num_params if model else rng.choice(_ROUND_N)
    world = rng.choice([4, 8, 16, 32, 64] if n > 10**10 else [2, 4, 8, 16])
    r = memory.RECIPES[recipe]
    b = {f: getattr(r, f) for f in _FIELDS}
    rows = [(t, f"$b_{{{f[:-6]}}}$", f"{b[f]:g}") for f, t in zip(_FIELDS, _LABELS)]
    rows.append(("**итого**", "$\\Sigma b$", f"**{r.total:g}**"))
    source = f"{model}, из `data/model_configs/{model}.json`" if model else "круглое число"
    statement = (
        f"**Состояние модели и ZeRO.** N = {fmt.count(n, 'параметр', 'параметра', 'параметров')} "
        f"({source}), параллелизм данных на D = {world} GPU, рецепт `{recipe}` — {r.label}. "
        f"Байт на параметр:\n\n{md_table(('статья', 'обозначение', 'Б/параметр'), rows)}\n\n"
        "N, таблица и D — `task_12_2_6['n_params']`, `task_12_2_6['bytes_per_param']`, "
        "`task_12_2_6['world_size']`. DDP хранит всё на каждом ранге; ZeRO-1 делит между рангами "
        "m1, m2 и мастер-копию, ZeRO-2 — ещё градиенты, ZeRO-3 (FSDP full shard) — ещё веса.\n\n"
        "Найдите в **ГиБ** (2³⁰ Б, не 10⁹): `B_state` — всё состояние; `ddp`, `zero1`, `zero2`, "
        "`zero3` — его часть на одном ранге (без активаций и буферов). Допуск 1 %, ⌈N/D⌉ не нужен."
    )
    data = {"model": model, "n_params": n, "recipe": recipe, "bytes_per_param": b}
    return {"statement": statement, **data, "world_size": world}


def _zero_solve(task: dict, recipe: str | None = None) -> dict:
    """B_state и байты на ранг при DDP и ZeRO-1/2/3, ГиБ (memory); recipe — подмена рецепта."""
    n, recipe, d = task["n_params"], recipe or task["recipe"], task["world_size"]
    per_rank = [memory.per_rank_state_bytes(n, recipe, d, stage) for stage in range(4)]
    state = [memory.state_bytes(n, recipe), *per_rank]
    return {k: memory.to_unit(v, "GiB") for k, v in zip(("B_state", *_MODES), state)}


def _zero_solution(task: dict, ref: dict) -> str:
    n, d, b = task["n_params"], task["world_size"], task["bytes_per_param"]
    bp, bg, total = b["param_bytes"], b["grad_bytes"], sum(b.values())
    k = total - bp - bg
    g = {key: f"{v:.3f}" for key, v in ref.items()}
    rows = [
        ("DDP", "ничего", f"$N \\cdot {total:g}$", g["ddp"]),
        ("ZeRO-1", "оптимизатор", f"$N({bp:g} + {bg:g}) + N \\cdot {k:g}/{d}$", g["zero1"]),
        ("ZeRO-2", "+ градиенты", f"$N \\cdot {bp:g} + N({bg:g} + {k:g})/{d}$", g["zero2"]),
        ("ZeRO-3 / FSDP", "+ веса", f"$N \\cdot {total:g}/{d}$", g["zero3"]),
    ]
    terms = " + ".join(f"{v:g}" for v in b.values())
    return (
        f"$$B_{{state}} = N \\Sigma b = {tex_num(n)} \\cdot ({terms}) = {tex_num(n * total)}\\ "
        f"\\text{{Б}} = {g['B_state']}\\ \\text{{ГиБ}}.$$\n\nСостояния оптимизатора в "
        f"`{task['recipe']}`: $K = b_{{m1}} + b_{{m2}} + b_{{master}} = {k:g}$ Б/параметр. На ранг "
        f"(D = {d}):\n\n{md_table(('режим', 'делится', 'формула', 'ГиБ'), rows)}\n\n"
        f"**Ответ (ГиБ):** `{ {key: round(v, 3) for key, v in ref.items()} }`."
    )


def _shard_all(task: dict) -> float:  # «ZeRO-1/2 делят всё»: B_state / D
    return _zero_solve(task)["zero3"]


_MESSAGES = {
    "sixteen_law": "«16 Б на параметр» — лишь bf16 с Adam в fp32; у этого рецепта Σb по таблице другая.",
    "shard_everything_at_zero1": "ZeRO-1 делит на D только состояния оптимизатора, а не веса и градиенты.",
    "ddp_divides": "DDP делит между рангами данные, а не модель: каждый ранг хранит всё B_state.",
}
_RULES = {  # ответ с ошибкой: целиком или заменой ключей; _BY — ключи, по любому из них видна
    "sixteen_law": {"wrong": lambda t, ref: _zero_solve(t, "bf16_mixed_adam")},
    "shard_everything_at_zero1": {"override": {"zero1": _shard_all, "zero2": _shard_all}},
    "ddp_divides": {"override": {"ddp": _shard_all}},
}
_BY = {"sixteen_law": ("B_state",), "shard_everything_at_zero1": ("zero1",)}
_ANSWER = Fields(dict.fromkeys(("B_state", *_MODES), GIB))
_HINT = "B_state = N·Σb. На ранг: DDP — всё; ZeRO-1 делит на D только m1 + m2 + мастер-копию, ZeRO-2 — ещё градиенты, ZeRO-3 — всё. ГиБ = Б / 2³⁰."
_TRAPS = tuple(Trap(k, m, **_RULES[k], by=_BY.get(k, ())) for k, m in _MESSAGES.items())
STEP = Step("12.2.6", _zero_task, _zero_solve, _ANSWER, _HINT, _zero_solution, _TRAPS)
