"""12.2.8 — пик памяти при совместном размещении фаз (и с LoRA); информативные группы в секунду."""

import random

from course_utils import fmt, memory
from course_utils.exercises.answers import Choice, Fields, Number, md_table
from course_utils.exercises.common import GIB, group_share
from course_utils.exercises.step import Step, Trap

_COMPONENTS = ("веса движка", "KV-кэш", "веса тренера", "градиенты", "оптимизатор", "активации")
_COMPONENTS += ("буфер синхронизации",)
_ENGINE, _KV, _TRAINER, _GRADS, _OPT, _ACT, _BUF = _COMPONENTS
_PHASES = {  # фаза шага: статьи на GPU
    "generation": (_ENGINE, _KV, _TRAINER, _OPT),
    "transition": (_ENGINE, _TRAINER, _OPT),  # KV-кэш освобождён, веса движка ещё на месте
    "training": (_TRAINER, _GRADS, _OPT, _ACT),
    "sync": (_ENGINE, _TRAINER, _OPT, _BUF),
}
_MODELS = ("SmolLM2-360M", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")
_KEYS = ("peak_gib", "peak_phase", "peak_lora_gib", "informative_groups_per_s")


def _timeline(parts: dict, offload: bool) -> list:
    """Фазы [имя, {статья: ГиБ}]; offload — оптимизатор на время генерации выгружен на CPU."""
    cut = {"generation": {_OPT} if offload else set()}
    return [
        [ph, {c: parts[c] if c in set(on) - cut.get(ph, set()) else 0.0 for c in _COMPONENTS}]
        for ph, on in _PHASES.items()
    ]


def _peak_task(variant: int) -> dict:
    rng = random.Random(12_2_8_000 + 7919 * variant)
    model = _MODELS[(variant + rng.randrange(5)) % 5]
    shape, gib = memory.ModelShape.from_name(model), lambda b: round(memory.to_unit(b, "GiB"), 3)
    world = 8 if shape.num_params > 5 * 10**9 else 1  # 7B и 8B — на 8 GPU
    recipe = rng.choice(["bf16_mixed_adam", "adam8bit_mixed", "mixed_fp32_grads"])
    stage, rank = (3 if world > 1 else 0), rng.choice([16, 32, 64])
    trained = (shape.num_params, memory.lora_trainable_params(shape, rank))
    full, lora = (memory.per_rank_breakdown(n, recipe, world, stage) for n in trained)
    kv = shape.kv_bytes_per_token(2) * rng.choice([16, 32, 64]) * rng.choice([2048, 4096])
    sizes = (shape.weights_bytes(2), kv, full["params"], full["grads"], full["optimizer"])
    parts = dict(zip(_COMPONENTS, map(gib, sizes)))
    parts |= {_ACT: rng.choice([1.5, 2.5, 4.0, 6.0, 9.0]), _BUF: rng.choice([0.5, 1.0, 2.0])}
    offload = rng.random() < 0.5
    lora_parts = {**parts, _GRADS: gib(lora["grads"]), _OPT: gib(lora["optimizer"])}
    n_groups, g = rng.randint(10, 14), rng.choice([4, 6, 8])
    # доли верных ответов по группам; две группы вырождены наверняка (все 0 и все 1)
    ps = [0.0, 1.0] + [rng.choice([0.0, 0.3, 0.5, 0.5, 0.7, 1.0]) for _ in range(n_groups - 2)]
    rng.shuffle(ps)
    groups = {f"q{i:02d}": [int(rng.random() < p) for _ in range(g)] for i, p in enumerate(ps, 1)}
    log = {"duration_s": round(rng.uniform(20, 90), 1), "groups": groups}
    phases = _timeline(parts, offload)
    rows = [(f"`{ph}`", *(f"{v:g}" if v else "—" for v in comps.values())) for ph, comps in phases]
    where = "один GPU" if world == 1 else f"один из {world} GPU (тренер — FSDP full shard)"
    cpu = "; оптимизатор при генерации выгружен на CPU" if offload else ""
    rewards = "; ".join(f"{q}: {''.join(map(str, rs))}" for q, rs in groups.items())
    statement = (
        f"**Пик совместного размещения.** {model}, рецепт `{recipe}`; генерация и обучение по "
        f"очереди делят {where}. Память фаз шага, ГиБ (2³⁰ Б; «—» — статьи нет на GPU{cpu}):\n\n"
        f"{md_table(('фаза', *_COMPONENTS), rows)}\n\nС **LoRA** (ранг {rank}, адаптеры на q, k, "
        f"v, o) градиенты — {lora_parts[_GRADS]:g} ГиБ, оптимизатор — {lora_parts[_OPT]:g} ГиБ, "
        "прочее то же (`task_12_2_8['phases']`, `task_12_2_8['phases_lora']`).\n\n**Журнал** "
        f"(`task_12_2_8['run_log']`): за {log['duration_s']} с завершено "
        f"{fmt.count(n_groups, 'группа', 'группы', 'групп')} по G = {g}, награды correctness: "
        f"{rewards}. Группа вырождена, если все награды в ней равны (все A = 0).\n\nНайдите "
        "(допуск 1 %) `peak_gib` — пик памяти, ГиБ; `peak_phase` — его фазу; `peak_lora_gib` — пик "
        "с LoRA, ГиБ; `informative_groups_per_s` — информативных групп в секунду."
    )
    task = {"model": model, "recipe": recipe, "world_size": world, "lora_rank": rank}
    task |= {"phases": phases, "phases_lora": _timeline(lora_parts, offload), "run_log": log}
    return {"statement": statement, **task}


def _groups_per_s(task: dict) -> float:
    return len(task["run_log"]["groups"]) / task["run_log"]["duration_s"]


def _peak_solve(task: dict) -> dict:
    """B_peak = max_t Σ статей фазы (memory); информативные группы/с = группы/с × (1 − доля)."""
    (peak, phase), (lora, _) = (memory.colocation_peak(task[k]) for k in ("phases", "phases_lora"))
    share = group_share(task["run_log"]["groups"].items())[1]
    return dict(zip(_KEYS, (peak, phase, lora, _groups_per_s(task) * (1 - share))))


def _peak_solution(task: dict, ref: dict) -> str:
    log, (n, share) = task["run_log"], group_share(task["run_log"]["groups"].items())
    rows = [
        (f"`{ph}`", f"{sum(c.values()):.3f}", f"{sum(cl.values()):.3f}")
        for (ph, c), (_, cl) in zip(task["phases"], task["phases_lora"])
    ]
    answer = {k: round(v, 3) if isinstance(v, float) else v for k, v in ref.items()}
    return (
        "**Пик** — максимум по фазам суммы статей фазы, $B_{peak} = \\max_t B(t)$ (не сумма "
        f"максимумов статей, {memory.sum_of_component_maxima(task['phases']):.3f} ГиБ):\n\n"
        f"{md_table(('фаза', 'B(t), ГиБ', 'с LoRA, ГиБ'), rows)}\n\n**Группы:** вырожденных "
        f"{round(share * n)} из {n};\n\n$$\\frac{{{n}}}{{{log['duration_s']}}} \\cdot (1 - "
        f"{share:.3f}) = {ref['informative_groups_per_s']:.3f}\\ \\text{{групп/с}}.$$\n\n"
        f"**Ответ:** `{answer}`."
    )


def _no_base_peak(task: dict) -> float:  # пик LoRA без базовых весов тренера и движка
    no_base = [[ph, {**c, _ENGINE: 0.0, _TRAINER: 0.0}] for ph, c in task["phases_lora"]]
    return memory.colocation_peak(no_base)[0]


_WRONG = {  # ошибка → {ключ ответа: величина с ней}; узнаётся по любому из ключей
    "sum_of_maxima": {
        "peak_gib": lambda t: memory.sum_of_component_maxima(t["phases"]),
        "peak_lora_gib": lambda t: memory.sum_of_component_maxima(t["phases_lora"]),
    },
    "lora_no_base": {"peak_lora_gib": _no_base_peak},
    "groups_not_informative": {"informative_groups_per_s": _groups_per_s},
}
_MESSAGES = {
    "sum_of_maxima": "Сложены максимумы статей всех фаз, а KV-кэш и активации не бывают на GPU вместе.",
    "lora_no_base": "С LoRA убраны базовые веса, а они лишь заморожены: тренеру и движку они нужны.",
    "groups_not_informative": "Это все группы в секунду, а вырожденная группа (все A = 0) политику не учит.",
}
_TRAPS = tuple(Trap(k, m, override=_WRONG[k], by=tuple(_WRONG[k])) for k, m in _MESSAGES.items())
_ANSWER = Fields(dict(zip(_KEYS, (GIB, Choice(tuple(_PHASES)), GIB, Number(0.01, "групп/с")))))
_HINT = "Пик — максимум сумм строк таблицы (не сумма максимумов столбцов), с LoRA — так же. Информативные группы/с = группы/с × (1 − доля групп с равными наградами)."
STEP = Step("12.2.8", _peak_task, _peak_solve, _ANSWER, _HINT, _peak_solution, _TRAPS)
