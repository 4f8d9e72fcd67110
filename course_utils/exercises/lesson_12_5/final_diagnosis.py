"""12.5.13 — итоговый диагноз: узкое место, память, риск несвежести данных, пробелы восстановления."""

import math
import random
from collections.abc import Callable
from typing import Any

from course_utils import fmt, guarantees, memory, pipeline
from course_utils.exercises.answers import Bool, Choice, Fields, IdSet
from course_utils.exercises.step import Step, Trap

STAGES = ("generation", "reward", "ref_logprob", "training", "weight_sync")
_NAMES = {"generation": "генерация ответов (сборщики)", "reward": "проверка и награды (верификатор)",
          "ref_logprob": "log-вероятности эталонной модели (на тренере)",
          "training": "шаг обучения", "weight_sync": "публикация весов"}  # fmt: skip
_ESS_FLOOR, _CRASH = 0.5, "crash_test"
_MODELS = ("Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")
_FEATURE = {"queue_policy": "asynchronous", "curriculum": "curriculum",
            "reward_normalizer": "running_reward_norm"}  # fmt: skip


def _applies(component: str, run: dict) -> bool:
    return _FEATURE.get(component) is None or bool(run[_FEATURE[component]])


def _trace(gens: list, r: float, f: float, t: float, s: float) -> list[dict]:
    """Шаг «на шаг позади»: сборщики → награды; на тренере подряд ref_logprob, training, weight_sync."""
    big = max(gens)
    rows = [{"stage": "generation", "worker": f"gen-{i}", "start_s": 0.0, "end_s": g, "depends_on": []}
            for i, g in enumerate(gens)]  # fmt: skip
    rows.append({"stage": "reward", "worker": "verifier-0", "start_s": big, "end_s": round(big + r, 1),
                 "depends_on": list(range(len(gens)))})  # fmt: skip
    clock = 0.0
    for stage, length in (("ref_logprob", f), ("training", t), ("weight_sync", s)):
        rows.append({"stage": stage, "worker": "trainer-0", "start_s": clock,
                     "end_s": round(clock + length, 1), "depends_on": []})  # fmt: skip
        clock = round(clock + length, 1)
    return [{**row, "row": i} for i, row in enumerate(rows)]


def _path(trace: list[dict]) -> dict:
    """Критический путь через pipeline.critical_path: длина, вклад стадий на пути, вся работа."""
    import pandas as pd

    frame = pd.DataFrame(trace)
    deps = {r["row"]: r["depends_on"] for r in trace if r["depends_on"]}
    length, chain = pipeline.critical_path(frame, deps)
    on_path = (chain["end_s"] - chain["start_s"]).groupby(chain["stage"]).sum()
    work = (frame["end_s"] - frame["start_s"]).groupby(frame["stage"]).sum()
    return {"length": float(length), "on_path": {k: float(v) for k, v in on_path.items()},
            "work": {k: float(work.get(k, 0.0)) for k in STAGES}, "chain": [int(i) for i in chain.index]}  # fmt: skip


def _draw_trace(rng: random.Random, target: str) -> list[dict]:
    while True:
        n = rng.randint(4, 8)
        base = rng.uniform(15, 45)
        gens = [round(base * math.exp(rng.gauss(0, 0.25)), 1) for _ in range(n)]
        r, f = round(rng.uniform(3, 70), 1), round(rng.uniform(3, 40), 1)
        t, s = round(rng.uniform(10, 90), 1), round(rng.uniform(2, 60), 1)
        gen_chain, train_chain = max(gens) + r, f + t + s
        if max(gen_chain, train_chain) < 1.1 * min(gen_chain, train_chain):
            continue  # путь должен быть однозначным
        on_path = ({"generation": max(gens), "reward": r} if gen_chain > train_chain
                   else {"ref_logprob": f, "training": t, "weight_sync": s})  # fmt: skip
        top = max(on_path, key=on_path.get)
        rest = [v for k, v in on_path.items() if k != top]
        work = {
            "generation": sum(gens),
            "reward": r,
            "ref_logprob": f,
            "training": t,
            "weight_sync": s,
        }
        biggest = max(work, key=work.get)
        if top != target or on_path[top] < 1.2 * max(rest):
            continue
        if biggest == target or work[biggest] < 1.2 * on_path[top]:
            continue
        return _trace(gens, r, f, t, s)


def _memory(mem: dict) -> dict:
    """Память на GPU (байт) по рецепту задачи и по «16 Б на параметр» (bf16_mixed_adam)."""
    shape = memory.ModelShape.from_name(mem["model"])
    kv = memory.kv_cache_bytes(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                               mem["sequences"] * mem["tokens_per_sequence"], 2)  # fmt: skip
    args = (shape.num_params, mem["recipe"], mem["world_size"], mem["zero_stage"])
    state = memory.per_rank_state_bytes(*args)
    state16 = memory.per_rank_state_bytes(shape.num_params, "bf16_mixed_adam", *args[2:])
    reserve = mem["reserve_gib"] * memory.GIB
    return {"shape": shape, "kv": kv, "state": state, "cap": mem["gpu_gb"] * memory.GB,
            "need": state + kv + reserve, "need16": state16 + kv + reserve,
            "breakdown": memory.per_rank_breakdown(*args)}  # fmt: skip


def _draw_memory(rng: random.Random, recipe_name: str | None) -> dict:
    stages = (1, 2) if recipe_name == "fp32_adam" else (0, 1, 2, 3)
    while True:
        mem = {"model": rng.choice(_MODELS), "recipe": recipe_name or rng.choice(list(memory.RECIPES)[:5]),
               "world_size": rng.choice([2, 4, 8]), "zero_stage": rng.choice(stages),
               "sequences": rng.choice([16, 32, 64, 128]), "tokens_per_sequence": rng.choice([1024, 2048, 4096]),
               "reserve_gib": rng.randint(2, 8), "gpu_gb": rng.choice((24, 40, 48, 80, 94, 141))}  # fmt: skip
        m = _memory(mem)
        ratio, ratio16 = m["need"] / m["cap"], m["need16"] / m["cap"]
        if abs(ratio - 1) < 0.1 or m["kv"] > 0.6 * m["need"]:
            continue  # далеко от границы (ГБ против ГиБ не меняют вывод), KV не заслоняет рецепт
        if not ((ratio < 1) != (ratio16 < 1) and abs(ratio16 - 1) >= 0.1):
            continue
        return mem


def _draw_queue(rng: random.Random, mode: str) -> dict:
    """mode: lag — хвост задержки выше предела, ess — пакет с ESS/n < 0,5, both, ok; средние в норме."""
    bound = rng.choice([1, 2, 3])
    while True:
        counts = [rng.randint(40, 160)] + [rng.randint(10, 90) for _ in range(bound)]
        if mode in ("lag", "both"):
            counts.append(rng.randint(2, 9))
        lags = [{"lag": k, "rollouts": c} for k, c in enumerate(counts)]
        mean_lag = sum(k * c for k, c in enumerate(counts)) / sum(counts)
        n_batches, size = rng.randint(4, 6), rng.choice([64, 128, 256])
        shares = [rng.uniform(0.58, 0.95) for _ in range(n_batches)]
        if mode in ("ess", "both"):
            shares[rng.randrange(n_batches)] = rng.uniform(0.25, 0.45)
        batches = [{"batch": f"b{rng.randint(100, 999)}{i}", "n": size, "ess": round(share * size, 1)}
                   for i, share in enumerate(shares)]  # fmt: skip
        if (
            mean_lag <= bound - 0.2
            and sum(b["ess"] / b["n"] for b in batches) / n_batches >= _ESS_FLOOR + 0.05
        ):
            return {"max_lag": bound, "lag_counts": lags, "batches": batches}


def _draw_checkpoint(rng: random.Random) -> dict:
    run = {
        "curriculum": rng.random() < 0.5,
        "running_reward_norm": rng.random() < 0.5,
        "asynchronous": True,
    }
    applicable = [c for c in guarantees.CHECKPOINT_COMPONENTS if _applies(c, run)]
    missing = rng.sample(
        [c for c in applicable if c not in ("model", "optimizer")], rng.randint(1, 3)
    )
    # crash_tested всегда False: иначе «забыт crash_test» совпал бы с верным ответом
    return {**run, "components": [c for c in applicable if c not in missing], "crash_tested": False}  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_13_000 + 7919 * variant)
    # каждая ошибка меняет ответ: путь не там, где больше всего работы (генерация поэтому не бывает
    # узким местом), «16 Б» меняет вывод о памяти, хвост задержки или ESS выше средних, нет crash_test
    if variant < 4:
        target = ("training", "reward", "weight_sync", "ref_logprob")[variant]
        recipe_name = ("adam8bit_mixed", "fp32_adam", "bf16_pure_adam", "fp32_adam")[variant]
        mode = ("lag", "ess", "lag", "ess")[variant]
    else:
        target, recipe_name, mode = rng.choice(STAGES[1:]), None, rng.choice(["lag", "ess", "both"])
    trace, mem = _draw_trace(rng, target), _draw_memory(rng, recipe_name)
    queue = _draw_queue(rng, mode)
    data = {"stages": trace, "memory": mem, "queue": queue, "checkpoint": _draw_checkpoint(rng)}
    return {"statement": _statement(data), **data}


def _statement(d: dict) -> str:
    trace, mem, queue, ckpt = d["stages"], d["memory"], d["queue"], d["checkpoint"]
    m = _memory(mem)
    shape, recipe = m["shape"], memory.recipe(mem["recipe"])
    rows = "\n".join(f"| {r['row']} | `{r['worker']}` | `{r['stage']}` | {r['start_s']:.1f} | {r['end_s']:.1f} | "
                     f"{', '.join(map(str, r['depends_on'])) or '—'} |" for r in trace)  # fmt: skip
    lags = " · ".join(f"задержка {x['lag']}: {x['rollouts']}" for x in queue["lag_counts"])
    ess = "\n".join(f"| {b['batch']} | {b['n']} | {b['ess']:.1f} |" for b in queue["batches"])
    stage = "DDP (ZeRO-0)" if mem["zero_stage"] == 0 else f"ZeRO-{mem['zero_stage']}"
    extras = ["учебная программа (уровень сложности растёт)" if ckpt["curriculum"] else None,
              "скользящая нормировка наград по всему запуску" if ckpt["running_reward_norm"] else None]  # fmt: skip
    extras_text = ", ".join(x for x in extras if x) or "нет ни учебной программы, ни скользящей "
    if not any(extras):
        extras_text += "нормировки наград (нормировка только внутри группы)"
    comps = ", ".join(f"`{c}`" for c in ckpt["components"])
    crash = (
        "проверка аварией (шаг 12.5.3) проводилась, ветвь восстановления совпала с непрерывной"
        if ckpt["crash_tested"]
        else "проверку аварией ни разу не проводили: «каталог на месте, значит, всё хорошо»"
    )
    return (
        "**Итоговый диагноз системы.** Асинхронный запуск GRPO, конвейер «на шаг позади»: пока "
        "тренер учится на пакете k, сборщики генерируют пакет k + 1 (данные — `task_12_5_13['stages']`, "
        "`task_12_5_13['memory']`, `task_12_5_13['queue']`, `task_12_5_13['checkpoint']`).\n\n"
        "**1. Стадии одного шага** (время — секунды от начала шага). Интервал зависит от "
        "предыдущего интервала своего исполнителя и от строк в последнем столбце:\n\n"
        "| строка | исполнитель | этап | начало, с | конец, с | зависит от строк |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n"
        "**2. Память одной GPU** (обучение и генерация на одних GPU). Модель "
        f"{mem['model']}: параметров N = {fmt.num(shape.num_params)}, слоёв L = "
        f"{shape.num_layers}, KV-голов H_kv = {shape.num_kv_heads}, размер головы d_h = "
        f"{shape.head_dim}. Рецепт `{mem['recipe']}` (байт на параметр: веса + градиенты + m + "
        f"v + мастер-копия): {recipe.describe()}. Обучение на D = {mem['world_size']} GPU, "
        f"{stage}. Движок генерации держит на каждой GPU KV-кэш в bf16 (2 Б на число): "
        f"последовательностей — {mem['sequences']}, токенов в каждой — "
        f"{mem['tokens_per_sequence']}. Резерв на активации, буферы и фрагментацию — "
        f"{mem['reserve_gib']} ГиБ. Память GPU — {mem['gpu_gb']} ГБ ({mem['gpu_gb']}·10⁹ Б)."
        "\n\n"
        f"**3. Очередь и несвежесть данных.** Объявленный предел задержки политики — "
        f"{queue['max_lag']}. Измеренная задержка роллаутов последних пакетов (число роллаутов "
        f"с данной задержкой): {lags}. ESS по пакетам:\n\n| пакет | n | ESS |\n|---|---|---|\n"
        f"{ess}\n\n"
        f"**4. Восстановление.** У запуска: {extras_text}. Манифест последней контрольной точки "
        f"содержит компоненты {comps} (полный список — `guarantees.CHECKPOINT_COMPONENTS`, шаг "
        f"12.5.6); {crash}.\n\n"
        "Поставьте диагноз — словарь из четырёх ключей:\n"
        "1. `bottleneck` — этап с наибольшим вкладом в **критический путь** шага (самую "
        "длинную по сумме длительностей цепочку зависимых интервалов); вклад этапа — сумма "
        "длительностей её интервалов на этом пути. Одно из: "
        + ", ".join(f'`"{s}"`' for s in STAGES)
        + ";\n"
        "2. `memory_fits` — `True`, если модельное состояние на ранг по рецепту и стадии ZeRO "
        "(`memory.per_rank_state_bytes`) + KV-кэш (2·L·H_kv·d_h·токены·2 Б, "
        "`memory.kv_cache_bytes`) + резерв помещаются в память GPU, иначе `False`;\n"
        '3. `staleness_risk` — `"высокий"`, если наибольшая измеренная задержка больше '
        f"объявленного предела **или** ESS/n хотя бы одного пакета меньше {_ESS_FLOOR}; иначе "
        '`"низкий"`;\n'
        "4. `recovery_gaps` — список того, чего не хватает для честного возобновления: имена "
        'нужных этому запуску компонентов, которых нет в манифесте, и `"crash_test"`, если '
        "восстановление не проверено аварией (`[]`, если всё есть).\n\n"
        'Ответ: `{"bottleneck": …, "memory_fits": …, "staleness_risk": …, '
        '"recovery_gaps": [...]}`.'
    )


def _values(task: dict) -> dict:
    path = _path(task["stages"])
    bottleneck = max(path["on_path"], key=path["on_path"].get)
    m = _memory(task["memory"])
    q = task["queue"]
    max_lag = max(x["lag"] for x in q["lag_counts"] if x["rollouts"] > 0)
    total = sum(x["rollouts"] for x in q["lag_counts"])
    mean_lag = sum(x["lag"] * x["rollouts"] for x in q["lag_counts"]) / total
    shares = [b["ess"] / b["n"] for b in q["batches"]]
    risk = max_lag > q["max_lag"] or min(shares) < _ESS_FLOOR
    mean_risk = mean_lag > q["max_lag"] or sum(shares) / len(shares) < _ESS_FLOOR
    ck = task["checkpoint"]
    missing = [c for c in guarantees.CHECKPOINT_COMPONENTS
               if c not in ck["components"] and _applies(c, ck)]  # fmt: skip
    gaps = missing + ([] if ck["crash_tested"] else [_CRASH])
    return {"path": path, "bottleneck": bottleneck, "most_work": max(path["work"], key=path["work"].get),
            "mem": m, "fits": m["need"] <= m["cap"], "fits16": m["need16"] <= m["cap"], "max_lag": max_lag,
            "mean_lag": mean_lag, "shares": shares, "risk": "высокий" if risk else "низкий",
            "mean_risk": "высокий" if mean_risk else "низкий", "missing": missing, "gaps": gaps}  # fmt: skip


def solve(task: dict) -> dict:
    v = _values(task)
    return {"bottleneck": v["bottleneck"], "memory_fits": v["fits"],
            "staleness_risk": v["risk"], "recovery_gaps": v["gaps"]}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    v = _values(task)
    path, m, q, mem = v["path"], v["mem"], task["queue"], task["memory"]
    chain = " → ".join(
        f"{task['stages'][i]['stage']} ({task['stages'][i]['worker']})" for i in path["chain"]
    )
    contrib = "\n".join(f"| {s} | {path['on_path'].get(s, 0.0):.1f} | {path['work'][s]:.1f} |" for s in STAGES)  # fmt: skip
    b = m["breakdown"]
    gib = memory.GIB
    fits = "помещается" if v["fits"] else "**не** помещается"
    fits16 = "поместилось бы" if v["fits16"] else "не поместилось бы"
    shares = ", ".join(f"{x:.2f}" for x in v["shares"])
    lag_reason = f"наибольшая задержка {v['max_lag']} {'>' if v['max_lag'] > q['max_lag'] else '≤'} предела {q['max_lag']}"
    ess_reason = f"min ESS/n = {min(v['shares']):.2f} {'<' if min(v['shares']) < _ESS_FLOOR else '≥'} {_ESS_FLOOR}"
    ck = task["checkpoint"]
    na = [c for c in guarantees.CHECKPOINT_COMPONENTS if not _applies(c, ck)]
    gaps_text = ", ".join(f"`{c}`" for c in v["missing"]) or "все нужные компоненты на месте"
    answer = repr(ref)
    return (
        "**1. Узкое место.** Цепочка генерации — самый медленный сборщик, затем награды; "
        "цепочка тренера — ref_logprob → training → weight_sync. Длиннейшая цепочка "
        f"(`pipeline.critical_path`): {chain}, длина {path['length']:.1f} с.\n\n"
        "| этап | вклад в критический путь, с | вся работа этапа, с |\n|---|---|---|\n"
        f"{contrib}\n\n"
        f"Узкое место — **{ref['bottleneck']}** ({_NAMES[ref['bottleneck']]}). "
        f"Больше всего работы у `{v['most_work']}` ({path['work'][v['most_work']]:.1f} с), "
        "но она разложена по параллельным исполнителям или перекрыта другой цепочкой: ускорение "
        "этапа вне пути время шага не сокращает.\n\n"
        f"**2. Память.** Состояние на ранг (`{mem['recipe']}`, D = {mem['world_size']}, "
        f"ZeRO-{mem['zero_stage']}): веса {b['params'] / gib:.2f} + градиенты "
        f"{b['grads'] / gib:.2f} + оптимизатор {b['optimizer'] / gib:.2f} = "
        f"{m['state'] / gib:.2f} ГиБ. KV-кэш: 2·{m['shape'].num_layers}·"
        f"{m['shape'].num_kv_heads}·{m['shape'].head_dim}·({mem['sequences']}·"
        f"{mem['tokens_per_sequence']})·2 Б = {m['kv'] / gib:.2f} ГиБ. Резерв "
        f"{mem['reserve_gib']} ГиБ. Итого {m['need'] / gib:.2f} ГиБ против {mem['gpu_gb']} ГБ = "
        f"{m['cap'] / gib:.2f} ГиБ — {fits}. По «16 Б на параметр» (bf16_mixed_adam) было бы "
        f"{m['need16'] / gib:.2f} ГиБ — {fits16}: 16 байт — один рецепт, а не закон.\n\n"
        f"**3. Устаревание.** {lag_reason[:1].upper()}{lag_reason[1:]}; ESS/n по пакетам: {shares}, {ess_reason}. Риск — "
        f"**{ref['staleness_risk']}**. Средние (средняя задержка {v['mean_lag']:.2f}, среднее "
        f"ESS/n {sum(v['shares']) / len(v['shares']):.2f}) хвост прячут: один пакет с низким "
        "ESS/n или роллауты за пределом задержки уже портят обновление.\n\n"
        f"**4. Восстановление.** Не хватает: {gaps_text}"
        + (f" (не нужны этому запуску: {', '.join(f'`{c}`' for c in na)})" if na else "")
        + ". "
        + (
            "Проверка аварией проводилась."
            if ck["crash_tested"]
            else "Проверки аварией не было: наличие каталога не доказывает, что запуск можно "
            "продолжить, — нужен `crash_test`."
        )
        + " Веса и оптимизатор в манифесте — ещё не продолжение того же эксперимента.\n\n"
        f"**Ответ:** `{answer}`."
    )


def _trap(key: str, field_: str, message: str, value: Callable[[dict], Any]) -> Trap:
    """Ошибка в одном ключе диагноза: ``value(values)`` вместо верного значения."""
    return Trap(key, message, override={field_: lambda t: value(_values(t))})


STEP_FIELDS = {
    "bottleneck": Choice(STAGES), "memory_fits": Bool(),
    "staleness_risk": Choice(("высокий", "низкий"), {"high": "высокий", "low": "низкий"}),
    "recovery_gaps": IdSet(lambda t: (*guarantees.CHECKPOINT_COMPONENTS, _CRASH),
                           "имён компонентов (или crash_test)"),
}  # fmt: skip


STEP = Step(
    id="12.5.13", make_task=make_task, solve=solve, solution=solution,
    answer=Fields(STEP_FIELDS),
    hint=(
        "Узкое место: найдите длиннейшую цепочку зависимых интервалов (у генерации на ней "
        "только самый медленный сборщик) и этап с наибольшим вкладом в неё. Память: "
        "per_rank_state_bytes по рецепту задачи, а не 16 Б/параметр, + KV + резерв. Риск: "
        "максимум задержки и минимум ESS/n, не средние. Пробелы: нужные компоненты, которых "
        "нет в манифесте, и crash_test, если аварией не проверяли."
    ),
    traps=(
        _trap("off_critical_path", "bottleneck", "Вы назвали этап с наибольшей суммарной работой. Время шага задаёт критический "
             "путь: работа, разложенная по параллельным сборщикам или перекрытая другой "
             "цепочкой, на нём не лежит целиком. Ищите этап с наибольшим вкладом в самую "
             "длинную цепочку зависимых интервалов.", lambda v: v["most_work"]),
        _trap("sixteen_bytes", "memory_fits", "Вывод о памяти совпадает с расчётом по «16 байт на параметр». 16 Б — это "
             "смешанная точность с Adam во float32 (2 + 2 + 12), а не закон: считайте "
             "байты по рецепту задачи и делите статьи по стадии ZeRO.", lambda v: v["fits16"]),
        _trap("staleness_by_mean", "staleness_risk", "Вывод о риске совпадает с расчётом по средним: средняя задержка и среднее ESS/n "
             "в норме, но роллауты за пределом задержки или пакет с низким ESS/n уже портят "
             "обновление. Смотрите на максимум задержки и минимум ESS/n.", lambda v: v["mean_risk"]),
        _trap("weights_only_ok", "recovery_gaps", "Вы не нашли пробелов в восстановлении, раз веса и оптимизатор сохраняются. "
             "Продолжение того же эксперимента требует и остальных компонентов (шаг, "
             "генераторы, курсор данных, очередь, версии…) и проверки аварией.", lambda v: []),
        _trap("no_crash_test", "recovery_gaps", "Вы перечислили недостающие компоненты, но не отметили, что восстановление не "
             "проверено аварией. Наличие каталога контрольной точки не доказывает, что запуск "
             "можно продолжить: нужен crash_test.", lambda v: v["missing"]),
    ),
)  # fmt: skip
