"""Статическое и группированное по длине пакетирование на настоящей модели (шаг 12.3.3, уровень B).

В статическом пакете все последовательности декодируются, пока не закончится самая длинная:
слоты закончивших простаивают. Доля полезной работы (загрузка слотов)

    U = Σ_i L_i / (B · max_i L_i),

где L_i — нужная длина ответа i, B — размер пакета. Группировка по длине (length bucketing)
сортирует запросы по ожидаемой длине и декодирует несколько пакетов с близкими длинами.
Чтобы длины были заданы, а не случайны, декодирование здесь идёт ровно L_i шагов и игнорирует
конец последовательности (как ``ignore_eos`` в бенчмарках движков); вычисления — настоящие.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch

from course_utils.arith_task import ArithTask
from course_utils.policy import (
    _cache_kwarg,
    _forward,
    _prompt_ids,
    _sync_fn,
    sampling_logprobs,
)


def response_lengths(
    n: int, seed: int = 0, median: int = 12, sigma: float = 0.8, max_len: int = 96
):
    """``n`` длин ответов из логнормального распределения (медиана ``median``, токенов), в [1, max_len]."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n должно быть целым ≥ 1, получено {n!r}")
    if median < 1 or max_len < median or sigma < 0:
        raise ValueError(f"нужно 1 ≤ median ≤ max_len и sigma ≥ 0: {median=}, {max_len=}, {sigma=}")
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(math.log(median), sigma, size=n)
    return [int(x) for x in np.clip(np.rint(raw), 1, max_len)]


def _check_lengths_slots(lengths, slots: int, name: str) -> list[int]:
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError(f"{name} должно быть целым ≥ 1, получено {slots!r}")
    out = list(lengths)
    if not out or any(not isinstance(L, (int, np.integer)) or L < 1 for L in out):
        raise ValueError(f"lengths: нужен непустой список целых ≥ 1, получено {lengths!r}")
    return [int(L) for L in out]


def static_batching(lengths, batch_size: int) -> dict:
    """Статические пакеты по ``batch_size`` запросов в порядке поступления.

    Пакет декодируется max L шагов; время (в шагах декодирования) = Σ_пакетов max L,
    загрузка слотов U = Σ L / Σ_пакетов (размер пакета · max L).
    """
    L = _check_lengths_slots(lengths, batch_size, "batch_size")
    batches = [L[i : i + batch_size] for i in range(0, len(L), batch_size)]
    steps = sum(max(b) for b in batches)
    slot_steps = sum(len(b) * max(b) for b in batches)
    return {"шагов": steps, "загрузка слотов U": sum(L) / slot_steps, "пакетов": len(batches)}


def continuous_batching(lengths, slots: int) -> dict:
    """Непрерывное пакетирование: освободившийся слот сразу берёт следующий запрос.

    Жадное расписание по ``slots`` слотам в порядке поступления; время = момент окончания
    последнего запроса (в шагах декодирования), U = Σ L / (slots · время).
    """
    import heapq

    L = _check_lengths_slots(lengths, slots, "slots")
    free = [0] * min(slots, len(L))
    for length in L:
        heapq.heappush(free, heapq.heappop(free) + length)
    makespan = max(free)
    return {"шагов": makespan, "загрузка слотов U": sum(L) / (slots * makespan), "пакетов": 1}


@torch.no_grad()
def decode_fixed_lengths(
    model, tokenizer, tasks: list[ArithTask], lengths: list[int], seed: int = 0
):
    """Один статический пакет: prefill запросов и max(L) шагов декодирования для всех строк.

    Возвращает словарь: prefill_s, decode_s (с), steps = max L, useful_tokens = Σ L_i,
    slot_steps = B · max L, utilization = useful_tokens / slot_steps.
    """
    if not tasks or len(tasks) != len(lengths):
        raise ValueError("tasks и lengths должны быть непустыми и одной длины")
    if any(not isinstance(L, int) or L < 1 for L in lengths):
        raise ValueError(f"lengths: нужны целые ≥ 1, получено {lengths!r}")
    device = next(model.parameters()).device
    sync = _sync_fn(device) or (lambda: None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = [_prompt_ids(tokenizer, t) for t in tasks]
    width, n = max(map(len, prompts)), len(prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    gen = torch.Generator(device=device).manual_seed(seed)
    steps = max(lengths)
    sync()
    t0 = time.perf_counter()
    logits, cache = _forward(model, ids, mask, positions)
    sync()
    t1 = time.perf_counter()
    last = positions[:, -1]
    for step in range(steps):
        token = torch.multinomial(sampling_logprobs(logits).exp(), 1, generator=gen).squeeze(-1)
        if step == steps - 1:
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
        last = last + 1
        logits, cache = _forward(model, token[:, None], mask, last[:, None], cache)
    sync()
    t2 = time.perf_counter()
    useful = sum(lengths)
    return {
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
        "steps": steps,
        "useful_tokens": useful,
        "slot_steps": n * steps,
        "utilization": useful / (n * steps),
    }


def compare_batching(
    model, tokenizer, tasks, lengths, n_buckets: int = 4, seed: int = 0, repeats: int = 3
):
    """Статический пакет против ``n_buckets`` пакетов, сгруппированных по длине.

    Для каждой стратегии: число пакетов, шагов декодирования, загрузка слотов U, полезные токены,
    время декодирования (с, медиана из ``repeats`` прогонов) и полезные токены / это время.
    Возвращает pandas.DataFrame; в заголовке времени указано число повторов.
    """
    from course_utils.args import integer

    if not isinstance(n_buckets, int) or not 1 <= n_buckets <= len(tasks):
        raise ValueError(f"n_buckets должно быть целым в [1, {len(tasks)}], получено {n_buckets!r}")
    repeats = integer("repeats", repeats, 1)
    order = sorted(range(len(tasks)), key=lambda i: lengths[i])
    buckets = [list(b) for b in np.array_split(order, n_buckets) if len(b)]
    plans = {"статический пакет": [list(range(len(tasks)))], "по длине": buckets}
    time_col = f"декодирование, с (медиана из {repeats})"
    rows = []
    for name, plan in plans.items():
        runs = [
            [
                decode_fixed_lengths(
                    model, tokenizer, [tasks[i] for i in b], [lengths[i] for i in b], seed=seed
                )
                for b in plan
            ]
            for _ in range(repeats)
        ]
        parts = runs[0]  # шаги и токены во всех повторах одинаковы
        decode_s = float(np.median([sum(p["decode_s"] for p in run) for run in runs]))
        useful = sum(p["useful_tokens"] for p in parts)
        rows.append(
            {
                "стратегия": name,
                "пакетов": len(plan),
                "шагов декодирования": sum(p["steps"] for p in parts),
                "загрузка слотов U": useful / sum(p["slot_steps"] for p in parts),
                "полезных токенов": useful,
                time_col: decode_s,
                "полезных токенов/с": useful / decode_s,
            }
        )
    return pd.DataFrame(rows)


@torch.no_grad()
def stale_prefix_error(model, new_weights: dict, tokenizer, task: ArithTask, probe_tokens: int = 4):
    """Можно ли переиспользовать KV-кэш запроса после обновления весов? Мерой служит разница.

    1) prefill запроса весами версии v → кэш; 2) веса заменяются на ``new_weights`` (v+1);
    3) следующие ``probe_tokens`` токенов эталонного ответа прогоняются новыми весами поверх
    старого кэша и, для сравнения, поверх свежего prefill новыми весами. Возвращает
    max |Δ log p| по словарю на этих позициях (нат) и KL(свежий ‖ со старым кэшем).
    Веса модели на выходе — ``new_weights``.
    """
    from course_utils.arith_task import target_response

    if not isinstance(probe_tokens, int) or probe_tokens < 1:
        raise ValueError(f"probe_tokens должно быть целым ≥ 1, получено {probe_tokens!r}")
    device = next(model.parameters()).device
    prompt = _prompt_ids(tokenizer, task)
    cont = tokenizer(target_response(task), add_special_tokens=False)["input_ids"][:probe_tokens]
    ids = torch.tensor([prompt], device=device)
    mask = torch.ones_like(ids)
    pos = torch.arange(len(prompt), device=device)[None]
    _, old_cache = _forward(model, ids, mask, pos)  # кэш версии v
    model.load_state_dict(new_weights)
    _, fresh_cache = _forward(model, ids, mask, pos)  # кэш версии v+1
    full = torch.ones((1, len(prompt) + len(cont)), dtype=torch.long, device=device)
    tail = torch.tensor([cont], device=device)
    tail_pos = torch.arange(len(prompt), len(prompt) + len(cont), device=device)[None]

    def run(cache):
        out = model(
            input_ids=tail,
            attention_mask=full,
            position_ids=tail_pos,
            use_cache=True,
            **{_cache_kwarg(model): cache},
        )
        return torch.log_softmax(out.logits[0].float(), dim=-1)

    stale, fresh = run(old_cache), run(fresh_cache)
    kl = (fresh.exp() * (fresh - stale)).sum(-1)
    return {
        "max_abs_dlogp": float((fresh - stale).abs().max()),
        "mean_kl": float(kl.mean()),
        "probe_tokens": len(cont),
    }
