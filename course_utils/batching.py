"""Статическое, непрерывное и группированное по длине пакетирование (шаг 12.3.3, уровень B).

Статический пакет декодируется, пока не закончится самая длинная последовательность, поэтому
загрузка слотов U = Σ_i L_i / (B · max_i L_i) (L_i — длина ответа i, токенов; B — размер пакета).
Группировка по длине декодирует несколько пакетов с близкими L_i. Декодирование здесь идёт
ровно L_i шагов и игнорирует конец последовательности (как ``ignore_eos`` в бенчмарках).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd
import torch

from course_utils.args import integer, nonnegative
from course_utils.arith_task import ArithTask, target_response
from course_utils.policy import (
    _cache_kwarg,
    _decode_step,
    _forward,
    _padded,
    _prompt_ids,
    sampling_logprobs,
)
from course_utils.tracing import StageTimer, cuda_sync_or_none


def response_lengths(
    n: int, seed: int = 0, median: int = 12, sigma: float = 0.8, max_len: int = 96
):
    """``n`` длин ответов, токенов: round(median · exp(σ·ξ)), ξ ~ N(0, 1), в [1, max_len]."""
    n = integer("n", n, 1)
    median = integer("median", median, 1, max_len)
    sigma = nonnegative("sigma", sigma)
    raw = np.random.default_rng(seed).lognormal(math.log(median), sigma, size=n)
    return [int(x) for x in np.clip(np.rint(raw), 1, max_len)]


def _lengths(lengths) -> list[int]:
    out = [integer("lengths[i]", L, 1, strict=True) for L in lengths]
    integer("len(lengths)", len(out), 1)
    return out


def static_batching(lengths, batch_size: int) -> dict:
    """Статические пакеты по ``batch_size`` запросов в порядке поступления: время, шагов
    декодирования, = Σ_пакетов max L, U = Σ L / Σ_пакетов (размер · max L)."""
    batch_size = integer("batch_size", batch_size, 1)
    L = _lengths(lengths)
    batches = [L[i : i + batch_size] for i in range(0, len(L), batch_size)]
    slot_steps = sum(len(b) * max(b) for b in batches)
    steps = sum(max(b) for b in batches)
    return {"шагов": steps, "загрузка слотов U": sum(L) / slot_steps, "пакетов": len(batches)}


def continuous_batching(lengths, slots: int) -> dict:
    """Непрерывное пакетирование (слот сразу берёт следующий запрос): время, шагов
    декодирования, = окончание последнего запроса, U = Σ L / (slots · время)."""
    slots = integer("slots", slots, 1)
    L = _lengths(lengths)
    free = [0] * min(slots, len(L))  # момент освобождения каждого слота
    for length in L:
        heapq.heappush(free, heapq.heappop(free) + length)
    makespan = max(free)
    return {"шагов": makespan, "загрузка слотов U": sum(L) / (slots * makespan), "пакетов": 1}


@torch.no_grad()
def _decode_fixed_lengths(
    model, tokenizer, tasks: list[ArithTask], lengths: list[int], seed: int = 0
):
    """Один статический пакет, max(L) шагов декодирования: prefill_s, decode_s (с), steps = max L,
    useful_tokens = Σ L_i, slot_steps = B · max L, utilization = useful_tokens / slot_steps."""
    if not tasks or len(tasks) != len(lengths):
        raise ValueError("tasks и lengths должны быть непустыми и одной длины")
    lengths = _lengths(lengths)
    device = next(model.parameters()).device
    timer = StageTimer(sync=cuda_sync_or_none(device))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = [_prompt_ids(tokenizer, t) for t in tasks]
    n, steps = len(prompts), max(lengths)
    ids = _padded(prompts, pad_id, left=True).to(device)
    mask = _padded([[1] * len(p) for p in prompts], 0, left=True).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with timer.stage("prefill"):
        logits, cache = _forward(model, ids, mask)
    with timer.stage("decode"):
        for step in range(steps):
            token = torch.multinomial(sampling_logprobs(logits).exp(), 1, generator=gen)
            if step == steps - 1:
                break
            logits, cache, mask = _decode_step(model, token, mask, cache)
    useful = sum(lengths)
    return {
        "prefill_s": timer.totals()["prefill"],
        "decode_s": timer.totals()["decode"],
        "steps": steps,
        "useful_tokens": useful,
        "slot_steps": n * steps,
        "utilization": useful / (n * steps),
    }


def compare_batching(
    model, tokenizer, tasks, lengths, n_buckets: int = 4, seed: int = 0, repeats: int = 3
):
    """Статический пакет против ``n_buckets`` пакетов, сгруппированных по длине: пакеты, шаги,
    загрузка слотов U, полезные токены, время декодирования (с, медиана ``repeats``) и токены/с."""
    n_buckets = integer("n_buckets", n_buckets, 1, len(tasks))
    repeats = integer("repeats", repeats, 1)
    order = sorted(range(len(tasks)), key=lambda i: lengths[i])
    buckets = [list(b) for b in np.array_split(order, n_buckets) if len(b)]
    plans = {"статический пакет": [list(range(len(tasks)))], "по длине": buckets}

    def run(plan):  # один прогон стратегии: по пакету на группу индексов
        subsets = [([tasks[i] for i in b], [lengths[i] for i in b]) for b in plan]
        return [_decode_fixed_lengths(model, tokenizer, t, ls, seed=seed) for t, ls in subsets]

    time_col = f"декодирование, с (медиана из {repeats})"
    rows = []
    for name, plan in plans.items():
        runs = [run(plan) for _ in range(repeats)]
        parts = runs[0]  # шаги и токены во всех повторах одинаковы
        decode_s = float(np.median([sum(p["decode_s"] for p in r) for r in runs]))
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
    """Можно ли переиспользовать KV-кэш запроса после обновления весов v → v+1: probe_tokens
    токенов эталонного ответа новыми весами поверх кэша версии v и свежего кэша; max |Δ log p| и
    KL(свежий ‖ со старым кэшем) = Σ_v p·(log p − log q), нат. Веса модели на выходе — новые."""
    probe_tokens = integer("probe_tokens", probe_tokens, 1)
    device = next(model.parameters()).device
    prompt = _prompt_ids(tokenizer, task)
    cont = tokenizer(target_response(task), add_special_tokens=False)["input_ids"][:probe_tokens]
    ids = torch.tensor([prompt], device=device)
    _, old_cache = _forward(model, ids, torch.ones_like(ids))  # кэш версии v
    model.load_state_dict(new_weights)
    _, fresh_cache = _forward(model, ids, torch.ones_like(ids))  # кэш версии v+1
    tail = {
        "input_ids": torch.tensor([cont], device=device),
        "attention_mask": torch.ones((1, len(prompt) + len(cont)), dtype=torch.long, device=device),
        "position_ids": torch.arange(len(prompt), len(prompt) + len(cont), device=device)[None],
    }

    def logp(cache):
        out = model(**tail, use_cache=True, **{_cache_kwarg(model): cache})
        return torch.log_softmax(out.logits[0].float(), dim=-1)

    stale, fresh = logp(old_cache), logp(fresh_cache)
    kl = (fresh.exp() * (fresh - stale)).sum(-1)  # нат на позицию
    return {
        "max_abs_dlogp": float((fresh - stale).abs().max()),
        "mean_kl": float(kl.mean()),
        "probe_tokens": len(cont),
    }
