"""12.2.8 — пик памяти при совместном размещении фаз (и с LoRA); информативные группы в секунду."""

import random
from types import SimpleNamespace

from course_utils import fmt, memory, throughput
from course_utils.exercises.answers import Choice, Number
from course_utils.exercises.lesson_12_2.optimizer_state import GIB_1PCT, UnitFields, by_key
from course_utils.exercises.step import Step, Trap

_PHASES = {"generation": "генерация: веса движка и KV-кэш",
           "transition": "переход: KV-кэш освобождён, веса движка ещё на месте",
           "training": "обучение: градиенты и активации", "sync": "синхронизация весов в движок"}  # fmt: skip
_COMPONENTS = ("веса движка", "KV-кэш", "веса тренера", "градиенты", "оптимизатор", "активации",
               "буфер синхронизации")  # fmt: skip
_SETUPS = (("SmolLM2-360M", 1), ("Qwen2.5-0.5B", 1), ("Qwen2.5-1.5B", 1), ("Qwen2.5-7B", 8),
           ("Llama-3.1-8B", 8))  # fmt: skip


def _timeline(parts: dict, offload: bool) -> list:
    """Фазы [имя, {статья: ГиБ}] по статьям ``parts``; offload — оптимизатор на CPU в генерации."""
    gen = ("веса движка", "KV-кэш", "веса тренера") + (() if offload else ("оптимизатор",))
    rows = {"generation": gen, "transition": ("веса движка", "веса тренера", "оптимизатор"),
            "training": ("веса тренера", "градиенты", "оптимизатор", "активации"),
            "sync": ("веса движка", "веса тренера", "оптимизатор", "буфер синхронизации")}  # fmt: skip
    return [[ph, {c: (parts[c] if c in rows[ph] else 0.0) for c in _COMPONENTS}] for ph in rows]


def make_task(variant: int) -> dict:
    rng = random.Random(12_2_8_000 + 7919 * variant)
    model, world = _SETUPS[(variant + rng.randrange(5)) % 5]
    shape, r3 = memory.ModelShape.from_name(model), lambda b: round(memory.to_unit(b, "GiB"), 3)
    recipe = rng.choice(["bf16_mixed_adam", "adam8bit_mixed", "mixed_fp32_grads"])
    stage, n, rank = (3 if world > 1 else 0), shape.num_params, rng.choice([16, 32, 64])
    full, lora = (memory.per_rank_breakdown(k, recipe, world, stage)
                  for k in (n, memory.lora_trainable_params(shape, rank)))  # fmt: skip
    kv_tokens = rng.choice([16, 32, 64]) * rng.choice([2048, 4096])
    parts = {"веса движка": r3(shape.weights_bytes(2)), "веса тренера": r3(full["params"]),
             "KV-кэш": r3(shape.kv_bytes_per_token(2) * kv_tokens), "градиенты": r3(full["grads"]),
             "оптимизатор": r3(full["optimizer"]), "активации": rng.choice([1.5, 2.5, 4.0, 6.0, 9.0]),
             "буфер синхронизации": rng.choice([0.5, 1.0, 2.0])}  # fmt: skip
    offload = rng.random() < 0.5
    lora_parts = {**parts, "градиенты": r3(lora["grads"]), "оптимизатор": r3(lora["optimizer"])}
    n_groups, g = rng.randint(10, 14), rng.choice([4, 6, 8])
    # доли верных ответов по группам; две группы вырождены наверняка (все 0 и все 1)
    probs = [0.0, 1.0] + [rng.choice([0.0, 0.3, 0.5, 0.5, 0.7, 1.0]) for _ in range(n_groups - 2)]
    rng.shuffle(probs)
    groups = {f"q{i + 1:02d}": [int(rng.random() < p) for _ in range(g)] for i, p in enumerate(probs)}  # fmt: skip
    log = {"duration_s": round(rng.uniform(20, 90), 1), "groups": groups}
    table = "\n".join(f"| `{ph}` | " + " | ".join(f"{v:g}" if v else "—" for v in comps.values()) + " |"
                      for ph, comps in _timeline(parts, offload))  # fmt: skip
    groups_table = "\n".join(f"| {k} | {' '.join(map(str, v))} |" for k, v in groups.items())
    where = "один GPU" if world == 1 else f"один из {world} GPU (тренер — FSDP full shard)"
    statement = (
        f"**Пик совместного размещения.** {model}, рецепт `{recipe}`; генерация и обучение по "
        f"очереди делят {where}. Память устройства по фазам одного шага, ГиБ (2³⁰ Б), «—» = статьи "
        f"нет на GPU{' (оптимизатор на время генерации выгружен на CPU)' if offload else ''}:\n\n| "
        f"фаза | {' | '.join(_COMPONENTS)} |\n|---|{'---|' * len(_COMPONENTS)}\n{table}\n\nФазы: "
        f"{'; '.join(f'`{k}` — {v}' for k, v in _PHASES.items())}. Таблица есть и в "
        f"`task_12_2_8['phases']` (с LoRA — в `task_12_2_8['phases_lora']`).\n\n**LoRA** (ранг "
        f"{rank}, адаптеры на q, k, v, o всех слоёв): меняются только две статьи — градиенты "
        f"становятся {lora_parts['градиенты']:g} ГиБ, оптимизатор — {lora_parts['оптимизатор']:g} "
        "ГиБ; остальные статьи (замороженные базовые веса, KV-кэш, активации, буфер) те же.\n\n"
        f"**Журнал запуска:** за {log['duration_s']} с завершено "
        f"{fmt.count(n_groups, 'группа', 'группы', 'групп')} по G = "
        f"{fmt.count(g, 'ответ', 'ответа', 'ответов')}; награды correctness (они же в "
        f"`task_12_2_8['run_log']`):\n\n| группа | награды |\n|---|---|\n{groups_table}\n\nГруппа "
        "вырождена, если скалярные награды всех её ответов равны: тогда у всех ответов "
        "преимущество A = 0 (здесь скалярная награда — одна correctness, формат-награды в журнале "
        "нет).\n\nНайдите: `peak_gib` — пик памяти, ГиБ; `peak_phase` — фазу пика (ключ из первого "
        "столбца); `peak_lora_gib` — пик с LoRA, ГиБ; `informative_groups_per_s` — информативные "
        'группы в секунду.\n\nОтвет — словарь `{"peak_gib": …, "peak_phase": …, "peak_lora_gib": …, '
        '"informative_groups_per_s": …}`; числа с относительным допуском 1 % (rtol = 1e-2).'
    )  # fmt: skip
    return {"statement": statement, "model": model, "recipe": recipe, "world_size": world,
            "lora_rank": rank, "phases": _timeline(parts, offload),
            "phases_lora": _timeline(lora_parts, offload), "run_log": log}  # fmt: skip


def _group_stats(log: dict) -> tuple[int, float]:
    """(число групп, доля вырожденных) — через throughput.degenerate_group_share."""
    return throughput.degenerate_group_share([
        SimpleNamespace(group_id=q, prompt_id=q, sample_id=f"{q}-{i}", reward={"correctness": float(r)})
        for q, rs in log["groups"].items() for i, r in enumerate(rs)])  # fmt: skip


def solve(task: dict) -> dict:
    (peak, phase), (peak_lora, _) = map(memory.colocation_peak, (task["phases"], task["phases_lora"]))  # fmt: skip
    n, share = _group_stats(task["run_log"])
    return {"peak_gib": peak, "peak_phase": phase, "peak_lora_gib": peak_lora,
            "informative_groups_per_s": n / task["run_log"]["duration_s"] * (1 - share)}  # fmt: skip


def _sum_of_maxima(task: dict) -> dict:  # сумма максимумов статей вместо максимума сумм
    return {**solve(task), "peak_gib": memory.sum_of_component_maxima(task["phases"]),
            "peak_lora_gib": memory.sum_of_component_maxima(task["phases_lora"])}  # fmt: skip


def _no_base_peak(task: dict) -> float:  # пик LoRA без базовых весов тренера и движка
    base = ("веса движка", "веса тренера")
    return memory.colocation_peak([[ph, {c: v for c, v in comps.items() if c not in base}]
                                   for ph, comps in task["phases_lora"]])[0]  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    log, (n, share) = task["run_log"], _group_stats(task["run_log"])
    rows = "\n".join(f"| `{ph}` | {sum(c.values()):.3f} | {sum(cl.values()):.3f} |"
                     for (ph, c), (_, cl) in zip(task["phases"], task["phases_lora"]))  # fmt: skip
    answer = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ref.items()}
    return (
        "**Пик.** Складываем статьи внутри каждой фазы, затем берём максимум по времени: $B_{peak} "
        "= \\max_t B(t)$.\n\n| фаза | B(t), ГиБ | B(t) с LoRA, ГиБ |\n|---|---|---|\n"
        f"{rows}\n\nПик — {ref['peak_gib']:.3f} ГиБ в фазе `{ref['peak_phase']}`; с LoRA — "
        f"{ref['peak_lora_gib']:.3f} ГиБ. Сумма максимумов статей "
        f"({memory.sum_of_component_maxima(task['phases']):.3f} ГиБ) завышает смету: KV-кэш и "
        "активации никогда не лежат на GPU одновременно.\n\nLoRA уменьшает градиенты и оптимизатор "
        f"до размера адаптеров, но замороженные базовые веса тренера и веса движка остаются: "
        f"память генерации не исчезает.\n\n**Информативные группы.** За {log['duration_s']} с "
        f"завершено {fmt.count(n, 'группа', 'группы', 'групп')}, из них вырожденных (скалярные "
        f"награды всех ответов равны) {round(share * n)}, доля "
        f"{share:.3f}:\n\n$$\\frac{{{n}}}{{{log['duration_s']}}} \\cdot (1 - {share:.3f}) = "
        f"{ref['informative_groups_per_s']:.3f}\\ \\text{{групп/с}}.$$\n\n**Ответ:** `{answer}`."
    )


STEP = Step(
    id="12.2.8", make_task=make_task, solve=solve, solution=solution,
    answer=UnitFields({"peak_gib": GIB_1PCT, "peak_phase": Choice(tuple(_PHASES)), "peak_lora_gib": GIB_1PCT,
                       "informative_groups_per_s": Number(rtol=1e-2, unit="групп/с")}),
    hint="Сложите статьи в каждой строке таблицы и возьмите максимум строк — это пик; не складывайте "
    "максимумы столбцов. Для LoRA замените в каждой строке градиенты и оптимизатор и снова "
    "возьмите "
    "максимум. Информативные группы/с = группы/с × (1 − доля групп, где все награды равны).",
    traps=(
        Trap("sum_of_maxima", "Вы сложили максимумы статей по всем фазам. Но KV-кэш генерации и "
             "активации обучения не лежат в памяти одновременно: пик — максимум по времени суммы "
             "статей одной фазы, B_peak = max_t B(t).",
             **by_key(("peak_gib", "peak_lora_gib"), _sum_of_maxima, GIB_1PCT)),
        Trap("lora_no_base", "С LoRA вы убрали базовые веса. Они заморожены, но нужны для прямого "
             "прохода тренеру и для генерации движку: LoRA сокращает только градиенты и состояния "
             "оптимизатора, а не память весов.", override={"peak_lora_gib": _no_base_peak}),
        Trap("groups_not_informative", "Это все группы в секунду. Вырожденная группа (все награды "
             "равны) даёт нулевое преимущество и не учит политику: информативные группы/с = "
             "группы/с × (1 − доля вырожденных групп).",
             override={"informative_groups_per_s":
                       lambda t: _group_stats(t["run_log"])[0] / t["run_log"]["duration_s"]}),
    ),
)  # fmt: skip
