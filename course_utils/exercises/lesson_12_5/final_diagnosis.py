"""12.5.13 — итоговый диагноз: узкое место, память, риск несвежести, пробелы восстановления."""

import math
import random

from course_utils import checkpoint, fmt, memory, pipeline
from course_utils.exercises.answers import Bool, Choice, Fields, IdSet, md_table
from course_utils.exercises.common import has_state, json_cached, trace_table
from course_utils.exercises.step import Step, Trap

_STAGES = ("generation", "reward", "ref_logprob", "training", "weight_sync")
_ESS_FLOOR, _CRASH, _RISKS = 0.5, "crash_test", ("высокий", "низкий")
_MODELS = ("Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")


def _diag_trace(gens: list, r: float, f: float, t: float, s: float) -> list[dict]:
    """Шаг «на шаг позади»: сборщики → награды; на тренере ref_logprob → training → weight_sync."""
    rows = [("generation", f"gen-{i}", 0.0, g, []) for i, g in enumerate(gens)]
    rows.append(("reward", "verifier-0", max(gens), round(max(gens) + r, 1), [*range(len(gens))]))
    for stage, length in (("ref_logprob", f), ("training", t), ("weight_sync", s)):
        start = rows[-1][3] if rows[-1][1] == "trainer-0" else 0.0
        rows.append((stage, "trainer-0", start, round(start + length, 1), []))
    keys = ("stage", "worker", "start_s", "end_s", "depends_on")
    return [{**dict(zip(keys, row)), "row": i} for i, row in enumerate(rows)]


def _diag_path(trace: list[dict]) -> dict:
    """Критический путь (pipeline.critical_path): длина, вклад стадий на пути, вся работа стадий."""
    length, chain = pipeline.critical_path(trace, {r["row"]: r["depends_on"] for r in trace})
    on_path: dict[str, float] = {}
    for stage, a, b in zip(chain["stage"], chain["start_s"], chain["end_s"]):
        on_path[stage] = on_path.get(stage, 0.0) + float(b - a)
    work = {st: sum(r["end_s"] - r["start_s"] for r in trace if r["stage"] == st) for st in _STAGES}
    return {"length": float(length), "on_path": on_path, "work": work, "chain": list(chain.index)}


def _draw_trace(rng: random.Random, target: str) -> list[dict]:
    """Путь однозначен, узкое место — target, а больше всего работы — у другого этапа."""
    while True:
        n, base = rng.randint(4, 8), rng.uniform(15, 45)
        gens = [round(base * math.exp(rng.gauss(0, 0.25)), 1) for _ in range(n)]
        r, f = round(rng.uniform(3, 70), 1), round(rng.uniform(3, 40), 1)
        t, s = round(rng.uniform(10, 90), 1), round(rng.uniform(2, 60), 1)
        gen_chain, train_chain = max(gens) + r, f + t + s
        if max(gen_chain, train_chain) < 1.1 * min(gen_chain, train_chain):
            continue
        work = dict(zip(_STAGES, (sum(gens), r, f, t, s)))
        gen_path = {"generation": max(gens), "reward": r}
        on_path = gen_path if gen_chain > train_chain else dict(list(work.items())[2:])
        top, most = max(on_path, key=on_path.get), max(work, key=work.get)
        rest = max(v for k, v in on_path.items() if k != top)
        if top == target and on_path[top] >= 1.2 * rest and most != target:
            if work[most] >= 1.2 * on_path[top]:
                return _diag_trace(gens, r, f, t, s)


def _diag_memory(mem: dict) -> dict:
    """Память на GPU, Б: по рецепту задачи и по «16 Б на параметр» (bf16_mixed_adam)."""
    shape = memory.ModelShape.from_name(mem["model"])
    tokens = mem["sequences"] * mem["tokens_per_sequence"]
    kv = memory.kv_cache_bytes(shape.num_layers, shape.num_kv_heads, shape.head_dim, tokens, 2)
    args = (shape.num_params, mem["recipe"], mem["world_size"], mem["zero_stage"])
    state16 = memory.per_rank_state_bytes(shape.num_params, "bf16_mixed_adam", *args[2:])
    state, reserve = memory.per_rank_state_bytes(*args), mem["reserve_gib"] * memory.GIB
    m = {"shape": shape, "kv": kv, "state": state, "cap": mem["gpu_gb"] * memory.GB}
    m |= {"need": state + kv + reserve, "need16": state16 + kv + reserve}
    return m | {"breakdown": memory.per_rank_breakdown(*args)}


def _draw_memory(rng: random.Random, recipe_name: str | None) -> dict:
    """Вывод далеко от границы (ГБ или ГиБ его не меняют), «16 Б» меняет вывод, KV не заслоняет."""
    stages = (1, 2) if recipe_name == "fp32_adam" else (0, 1, 2, 3)
    while True:
        mem = {"model": rng.choice(_MODELS)}
        mem["recipe"] = recipe_name or rng.choice(list(memory.RECIPES)[:5])
        mem |= {"world_size": rng.choice([2, 4, 8]), "zero_stage": rng.choice(stages)}
        mem["sequences"] = rng.choice([16, 32, 64, 128])
        mem["tokens_per_sequence"] = rng.choice([1024, 2048, 4096])
        mem |= {"reserve_gib": rng.randint(2, 8), "gpu_gb": rng.choice((24, 40, 48, 80, 94, 141))}
        m = _diag_memory(mem)
        ratio, ratio16 = m["need"] / m["cap"], m["need16"] / m["cap"]
        if abs(ratio - 1) >= 0.1 and m["kv"] <= 0.6 * m["need"] and abs(ratio16 - 1) >= 0.1:
            if (ratio < 1) != (ratio16 < 1):
                return mem


def _draw_queue(rng: random.Random, mode: str) -> dict:
    """mode: lag — хвост задержки выше предела, ess — пакет с ESS/n < 0,5, both; средние в норме."""
    bound = rng.choice([1, 2, 3])
    while True:
        counts = [rng.randint(40, 160)] + [rng.randint(10, 90) for _ in range(bound)]
        counts += [rng.randint(2, 9)] if mode in ("lag", "both") else []
        mean_lag = sum(k * c for k, c in enumerate(counts)) / sum(counts)
        n_batches, size = rng.randint(4, 6), rng.choice([64, 128, 256])
        shares = [rng.uniform(0.58, 0.95) for _ in range(n_batches)]
        if mode in ("ess", "both"):
            shares[rng.randrange(n_batches)] = rng.uniform(0.25, 0.45)
        ess = [round(x * size, 1) for x in shares]
        batches = [
            {"batch": f"b{rng.randint(100, 999)}{i}", "n": size, "ess": e}
            for i, e in enumerate(ess)
        ]
        if mean_lag <= bound - 0.2 and sum(ess) / size / n_batches >= _ESS_FLOOR + 0.05:
            lags = [{"lag": k, "rollouts": c} for k, c in enumerate(counts)]
            return {"max_lag": bound, "lag_counts": lags, "batches": batches}


def _diag_task(variant: int) -> dict:
    rng = random.Random(12_5_13_000 + 7919 * variant)
    # каждая ошибка меняет ответ; поэтому генерация не бывает узким местом
    if variant < 4:
        target = ("training", "reward", "weight_sync", "ref_logprob")[variant]
        recipe = ("adam8bit_mixed", "fp32_adam", "bf16_pure_adam", "fp32_adam")[variant]
        mode = ("lag", "ess", "lag", "ess")[variant]
    else:
        target, recipe, mode = rng.choice(_STAGES[1:]), None, rng.choice(["lag", "ess", "both"])
    task = {"stages": _draw_trace(rng, target), "memory": _draw_memory(rng, recipe)}
    task["queue"] = _draw_queue(rng, mode)
    run = {"curriculum": rng.random() < 0.5, "running_reward_norm": rng.random() < 0.5}
    run["asynchronous"] = True
    have = [c for c in checkpoint.COMPONENTS if has_state(c, run)]
    lost = rng.sample([c for c in have if c not in ("policy", "optimizer")], rng.randint(1, 3))
    kept = [c for c in have if c not in lost]  # crash_tested=False, иначе no_crash_test — верный
    task["checkpoint"] = {**run, "components": kept, "crash_tested": False}
    return {"statement": _diag_statement(task), **task}


def _diag_statement(d: dict) -> str:
    mem, queue, ck = d["memory"], d["queue"], d["checkpoint"]
    shape, recipe = memory.ModelShape.from_name(mem["model"]), memory.recipe(mem["recipe"])
    ess_rows = [[b["batch"], b["n"], f"{b['ess']:.1f}"] for b in queue["batches"]]
    lags = " · ".join(f"{x['lag']}: {x['rollouts']}" for x in queue["lag_counts"])
    zero = "DDP (ZeRO-0)" if mem["zero_stage"] == 0 else f"ZeRO-{mem['zero_stage']}"
    extras = ["учебная программа"] if ck["curriculum"] else []
    extras += ["скользящая нормировка наград"] if ck["running_reward_norm"] else []
    extras = ", ".join(extras) or "нет ни учебной программы, ни скользящей нормировки наград"
    return (
        f"**Итоговый диагноз.** Асинхронный GRPO «на шаг позади»: пока тренер учится на пакете k, сборщики генерируют пакет k + 1. Данные — `task_12_5_13['stages']`, `['memory']`, `['queue']`, `['checkpoint']`.\n\n**1. Стадии шага** (время — с от начала шага; интервал ждёт предыдущий интервал своего исполнителя и строки последнего столбца):\n\n{trace_table(d['stages'])}\n\n"
        f"**2. Память одной GPU** (обучение и генерация на одних GPU). {mem['model']}: N = {fmt.num(shape.num_params)}, L = {shape.num_layers}, H_kv = {shape.num_kv_heads}, d_h = {shape.head_dim}; рецепт `{mem['recipe']}`: {recipe.describe()}; D = {mem['world_size']} GPU, {zero}. KV-кэш в bf16 (2 Б): {mem['sequences']} последовательностей по {mem['tokens_per_sequence']} токенов. Резерв — {mem['reserve_gib']} ГиБ, память GPU — {mem['gpu_gb']} ГБ ({mem['gpu_gb']}·10⁹ Б).\n\n"
        f"**3. Очередь.** Предел задержки политики — {queue['max_lag']}; роллаутов по задержке: {lags}. ESS по пакетам:\n\n{md_table(['пакет', 'n', 'ESS'], ess_rows)}\n\n"
        f"**4. Восстановление.** У запуска: {extras}. Манифест содержит {', '.join(f'`{c}`' for c in ck['components'])} (все компоненты — `checkpoint.COMPONENTS`, шаг 12.5.6); проверку аварией не проводили.\n\n"
        f'Ответ: `bottleneck` — этап с наибольшим вкладом (суммой длительностей) в **критический путь** — самую длинную цепочку зависимых интервалов, одно из {", ".join(_STAGES)}; `memory_fits` — помещаются ли состояние на ранг (`memory.per_rank_state_bytes`) + KV (2·L·H_kv·d_h·токены·2 Б) + резерв; `staleness_risk` — `"высокий"`, если наибольшая задержка выше предела или ESS/n какого-либо пакета < {_ESS_FLOOR}, иначе `"низкий"`; `recovery_gaps` — нужные запуску компоненты, которых нет в манифесте, и `"crash_test"`, если восстановление не проверено аварией.'
    )


@json_cached
def _diagnosis(task: dict) -> dict:
    """Величины разбора (путь, память, задержка и ESS/n, пробелы) — один раз на условие."""
    q, ck = task["queue"], task["checkpoint"]
    path, m = _diag_path(task["stages"]), _diag_memory(task["memory"])
    v = {"path": path, "mem": m, "fits": m["need"] <= m["cap"], "fits16": m["need16"] <= m["cap"]}
    v["bottleneck"] = max(path["on_path"], key=path["on_path"].get)
    v["most_work"] = max(path["work"], key=path["work"].get)
    lags, shares = q["lag_counts"], [b["ess"] / b["n"] for b in q["batches"]]
    v["max_lag"] = max(x["lag"] for x in lags if x["rollouts"] > 0)
    v["mean_lag"] = sum(x["lag"] * x["rollouts"] for x in lags) / sum(x["rollouts"] for x in lags)
    v |= {"shares": shares, "mean_share": sum(shares) / len(shares)}
    high = v["max_lag"] > q["max_lag"] or min(shares) < _ESS_FLOOR
    high_by_mean = v["mean_lag"] > q["max_lag"] or v["mean_share"] < _ESS_FLOOR
    v |= {"risk": _RISKS[not high], "mean_risk": _RISKS[not high_by_mean]}
    needed = (c for c in checkpoint.COMPONENTS if has_state(c, ck))
    v["missing"] = [c for c in needed if c not in ck["components"]]
    v["gaps"] = v["missing"] + ([] if ck["crash_tested"] else [_CRASH])
    return v


def _diag_solve(task: dict) -> dict:
    v = _diagnosis(task)
    return dict(zip(_DIAG_ANSWER.fields, (v["bottleneck"], v["fits"], v["risk"], v["gaps"])))


def _diag_solution(task: dict, ref: dict) -> str:
    v, mem, q, ck = _diagnosis(task), task["memory"], task["queue"], task["checkpoint"]
    path, m, gib = v["path"], v["mem"], memory.GIB
    chain = " → ".join("{stage} ({worker})".format(**task["stages"][i]) for i in path["chain"])
    rows = [[s, f"{path['on_path'].get(s, 0.0):.1f}", f"{path['work'][s]:.1f}"] for s in _STAGES]
    contrib = md_table(["этап", "вклад в критический путь, с", "вся работа, с"], rows)
    b, shape = m["breakdown"], m["shape"]
    fits = ("помещается" if v["fits"] else "**не** помещается", "да" if v["fits16"] else "нет")
    lag_sign = ">" if v["max_lag"] > q["max_lag"] else "≤"
    ess_sign = "<" if min(v["shares"]) < _ESS_FLOOR else "≥"
    na = ", ".join(f"`{c}`" for c in checkpoint.COMPONENTS if not has_state(c, ck)) or "—"
    return f"**1. Узкое место.** Длиннейшая цепочка (`pipeline.critical_path`): {chain}, {path['length']:.1f} с. У генерации на пути только самый медленный сборщик.\n\n{contrib}\n\nУзкое место — **{ref['bottleneck']}**; больше всего работы у `{v['most_work']}` ({path['work'][v['most_work']]:.1f} с), но не на пути: её ускорение шаг не сокращает.\n\n**2. Память** (`{mem['recipe']}`, D = {mem['world_size']}, ZeRO-{mem['zero_stage']}): веса {b['params'] / gib:.2f} + градиенты {b['grads'] / gib:.2f} + оптимизатор {b['optimizer'] / gib:.2f} = {m['state'] / gib:.2f} ГиБ; KV = 2·{shape.num_layers}·{shape.num_kv_heads}·{shape.head_dim}·({mem['sequences']}·{mem['tokens_per_sequence']})·2 Б = {m['kv'] / gib:.2f} ГиБ; + резерв {mem['reserve_gib']} ГиБ = {m['need'] / gib:.2f} ГиБ против {mem['gpu_gb']} ГБ = {m['cap'] / gib:.2f} ГиБ — {fits[0]}. По «16 Б на параметр» вышло бы {m['need16'] / gib:.2f} ГиБ (помещается: {fits[1]}) — это один рецепт, не закон.\n\n**3. Несвежесть.** Наибольшая задержка {v['max_lag']} {lag_sign} предела {q['max_lag']}; min ESS/n = {min(v['shares']):.2f} {ess_sign} {_ESS_FLOOR} (по пакетам: {', '.join(f'{x:.2f}' for x in v['shares'])}). Риск — **{ref['staleness_risk']}**; средние (задержка {v['mean_lag']:.2f}, ESS/n {v['mean_share']:.2f}) хвост прячут.\n\n**4. Восстановление.** Нет в манифесте: {', '.join(f'`{c}`' for c in v['missing'])} (не нужны запуску: {na}); проверки аварией не было — нужен `crash_test`: каталог на месте ещё не доказывает, что запуск можно продолжить.\n\n**Ответ:** `{ref!r}`."


_DIAG_SLIPS = {  # ошибка → (ключ ответа, значение с ошибкой из _diagnosis)
    "off_critical_path": ("bottleneck", lambda v: v["most_work"]),
    "sixteen_bytes": ("memory_fits", lambda v: v["fits16"]),
    "staleness_by_mean": ("staleness_risk", lambda v: v["mean_risk"]),
    "weights_only_ok": ("recovery_gaps", lambda v: []),
    "no_crash_test": ("recovery_gaps", lambda v: v["missing"]),
}
_DIAG_TEXT = {
    "off_critical_path": "Назван этап с наибольшей суммарной работой, но время шага задаёт критический путь: работа параллельных сборщиков или перекрытой цепочки на нём не лежит целиком.",
    "sixteen_bytes": "Вывод о памяти совпадает с расчётом по «16 Б на параметр»: это смешанная точность с Adam во float32, а не закон. Считайте байты по рецепту задачи и стадии ZeRO.",
    "staleness_by_mean": "Вывод о риске совпадает с расчётом по средним: средние в норме, но роллауты за пределом задержки или пакет с низким ESS/n уже портят обновление. Смотрите на максимум и минимум.",
    "weights_only_ok": "Пробелов нет, раз сохранены веса и оптимизатор? Продолжение того же эксперимента требует и остальных нужных компонентов, и проверки аварией.",
    "no_crash_test": "Недостающие компоненты названы, но восстановление не проверено аварией: каталог контрольной точки на месте ещё не доказывает, что запуск можно продолжить.",
}
_ALLOWED_GAPS = (*checkpoint.COMPONENTS, _CRASH)
_DIAG_FIELDS = {"bottleneck": Choice(_STAGES), "memory_fits": Bool()}
_DIAG_FIELDS["staleness_risk"] = Choice(_RISKS, {"high": "высокий", "low": "низкий"})
_DIAG_FIELDS["recovery_gaps"] = IdSet(lambda t: _ALLOWED_GAPS, "имён компонентов (или crash_test)")
_DIAG_ANSWER = Fields(_DIAG_FIELDS)

_HINT = "Узкое место — этап с наибольшим вкладом в длиннейшую цепочку зависимых интервалов. Память — per_rank_state_bytes по рецепту задачи (не 16 Б/параметр) + KV + резерв. Риск — по максимуму задержки и минимуму ESS/n, не по средним; пробелы — недостающие нужные компоненты и crash_test."
_TRAPS = tuple(
    Trap(k, _DIAG_TEXT[k], override={key: lambda t, f=f: f(_diagnosis(t))})
    for k, (key, f) in _DIAG_SLIPS.items()
)
STEP = Step("12.5.13", _diag_task, _diag_solve, _DIAG_ANSWER, _HINT, _diag_solution, _TRAPS)
