"""Репетиция уровня B: эталонный цикл и его память — измерение рядом с калькулятором ``memory``.

``python -m course_utils.policy rehearse --model random:Qwen2.5-0.5B --steps 1 --json`` печатает
JSON прогона ``policy.sequential_loop``: этапы, токены, пик памяти и предсказание калькулятора.
``memory_timeline`` — тот же шаг по фазам ``PHASES``: байты по статьям, измерено и предсказано.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import time
from typing import Any

import pandas as pd
import torch

from course_utils import args as check

# Форма цикла репетиции по умолчанию: мало запросов и коротких ответов — чтобы 0,5 млрд
# параметров на двух ядрах CPU укладывались в минуты, а вся память состояний уже была занята.
_DEFAULTS = {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16, "micro_batch": 8}
# Фазы совмещённого шага и статьи памяти — одни имена у калькулятора и у измерения.
PHASES = ("генерация", "пересчёт log π", "прямой и обратный проход", "шаг оптимизатора")
PHASES += ("синхронизация весов",)
ENGINE, TRAINER, GRADS, ADAM = "веса движка", "веса тренера", "градиенты", "Adam m и v"
KV, TEMP = "KV-кэш", "активации и временные буферы"
_COLUMNS = ("фаза", "статья", "предсказано, Б", "измерено, Б", "разница, Б")


def _predicted_timeline(
    shape, engine_bytes_per_param: float, kv_tokens: int, logits_tokens: int
) -> list[tuple[str, dict[str, int]]]:
    """Калькулятор по фазам ``PHASES``, байт: ``[(фаза, {статья: байты})]``. Всегда: веса движка
    N·b_engine, тренера 4N, Adam 8N; генерация — KV 2·L·H_kv·d_h·N_kv·b_engine; пересчёт — логиты
    P·V·4 (P = m·T позиций); обучение — 3 копии логитов и градиенты 4N; шаг — градиенты."""
    from course_utils import memory

    fp32 = memory.per_rank_breakdown(shape.num_params, "fp32_adam", 1, 0)  # 4N, 4N, 8N байт
    kv_tokens = check.integer("kv_tokens", kv_tokens, 1)
    kv = memory.kv_cache_bytes(
        shape.num_layers, shape.num_kv_heads, shape.head_dim, kv_tokens, engine_bytes_per_param
    )  # 2 · L · H_kv · d_h · N_kv · b_engine
    logits = check.integer("logits_tokens", logits_tokens, 1) * shape.vocab_size * 4  # P·V·4 Б
    base = {ENGINE: shape.weights_bytes(engine_bytes_per_param), TRAINER: fp32["params"]}
    base |= {GRADS: 0, ADAM: fp32["optimizer"], KV: 0, TEMP: 0}
    grads = {GRADS: fp32["grads"]}
    changes = ({KV: kv}, {TEMP: logits}, grads | {TEMP: 3 * logits}, grads, {})  # P·V·4 Б
    return [(phase, base | change) for phase, change in zip(PHASES, changes)]


def _predicted_peak_bytes(
    shape, engine_b: float, sequences: int, tokens_per_sequence: int, micro_batch: int
) -> dict[str, int]:
    """Верхняя оценка пика, байт: сумма максимумов статей ``_predicted_timeline`` — N·b_engine +
    16 Б · N + 3·m·T·V·4 Б + 2·L·H_kv·d_h·S·T·b_engine (без активаций слоёв)."""
    m = min(check.integer("micro_batch", micro_batch, 1), check.integer("sequences", sequences, 1))
    t = check.integer("tokens_per_sequence", tokens_per_sequence, 1)
    phases = _predicted_timeline(shape, engine_b, sequences * t, m * t)
    top = {k: max(comps[k] for _, comps in phases) for k in phases[0][1]}  # max_t по статье
    terms = {
        "engine_weights": top[ENGINE],  # N · b_engine
        "trainer_fp32_adam": top[TRAINER] + top[GRADS] + top[ADAM],  # 16 Б · N
        "train_logits": top[TEMP],  # 3 · m · T · V · 4 Б
        "kv_cache": top[KV],  # 2 · L · H_kv · d_h · S · T · b_engine
    }
    terms["total"] = sum(terms.values())
    return terms


class _PhasePeak:
    """Пик байт за фазу: на GPU — ``max_memory_allocated``; на CPU — байты состояния в начале фазы
    + наибольший прирост аллокатора CPU (события памяти ``torch.profiler``)."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.kind = (
            "torch.cuda.max_memory_allocated"
            if self.cuda
            else "тензоры состояния + пик прироста аллокатора CPU (torch.profiler)"
        )

    def start(self, base: int) -> None:
        self.base = base
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:  # без этого kineto печатает в stderr служебные строки USDT/STAGE на каждый старт
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            activities = [torch.profiler.ProfilerActivity.CPU]
            self.prof = torch.profiler.profile(activities=activities, profile_memory=True)
            self.prof.start()

    def stop(self) -> int:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        self.prof.stop()
        raw = self.prof.profiler.kineto_results.events()  # сырые события, до сводки по операциям
        events = [e for e in raw if e.name() == "[memory]"]
        events.sort(key=lambda e: e.start_ns())  # выделения (+) и освобождения (−) по времени
        return self.base + max(itertools.accumulate((e.nbytes() for e in events), initial=0))


def memory_timeline(
    model,
    tokenizer,
    tasks,
    group_size: int = 4,
    max_new_tokens: int = 16,
    micro_batch: int = 8,
    lr: float = 1e-5,
    seed: int = 0,
):
    """Шаг цикла по фазам ``PHASES`` рядом с ``_predicted_timeline``: таблица ``_COLUMNS``, байт
    (разница = измерено − предсказано). Движок — сама model, тренер — fp32-копия с AdamW (после
    шага прогрева); статьи — Σ numel · element_size, «активации» = пик фазы − статьи."""
    from course_utils import memory, policy

    check.positive("lr", lr)
    train = {"micro_batch": check.integer("micro_batch", micro_batch, 1)}
    sampling = {"group_size": group_size, "max_new_tokens": max_new_tokens}
    engine = model.eval()
    device, engine_dtype = next(engine.parameters()).device, next(engine.parameters()).dtype
    learner = policy.fp32_trainer(copy.deepcopy(engine), device, lr)
    trainer = learner.net
    warm = policy.generate_rollouts(engine, tokenizer, tasks, seed=seed, **sampling).records
    learner.update(warm, **train)  # прогрев: создаёт m и v

    def state(kv: int = 0) -> dict[str, int]:  # Σ numel · element_size по живым тензорам, байт
        grads = memory.tensor_bytes(p.grad for p in trainer.parameters())
        weights = {ENGINE: memory.tensor_bytes(engine.parameters())}
        weights[TRAINER] = memory.tensor_bytes(trainer.parameters())
        return weights | {GRADS: grads, ADAM: memory.optimizer_state_bytes(learner.opt), KV: kv}

    meter, measured, peaks, after_stage = _PhasePeak(device), [], {}, {}

    def close(comps: dict[str, int]) -> None:  # конец фазы PHASES[len(measured)], начало следующей
        phase = PHASES[len(measured)]
        peaks[phase] = meter.stop()
        measured.append((phase, comps | {TEMP: peaks[phase] - sum(comps.values())}))
        if len(measured) < len(PHASES):
            meter.start(sum(state().values()))

    def after(stage: str) -> None:  # grpo_step: после forward_backward и после optimizer_step
        after_stage[stage] = state()
        if stage == "forward_backward":
            close(after_stage[stage])

    meter.start(sum(state().values()))
    batch = policy.generate_rollouts(engine, tokenizer, tasks, seed=seed + 1, **sampling)
    close(state(batch.kv_cache_bytes))
    old = learner.logprobs(batch.records, **train)
    close(state())
    learner.update(batch.records, old, after_stage=after, **train)
    close(after_stage["optimizer_step"])  # градиенты живы до уборки в конце grpo_step
    policy.sync_weights(trainer, engine)
    close(state())
    seqs = len(batch.records)
    longest = max(r.num_tokens for r in batch.records)
    logits_tokens = min(train["micro_batch"], seqs) * longest  # P = m · T позиций микропакета
    engine_b = torch.finfo(engine_dtype).bits // 8
    shape = memory.ModelShape.from_config(engine.config)
    predicted = _predicted_timeline(shape, engine_b, batch.kv_cache_tokens, logits_tokens)
    rows = [
        (phase, k, want[k], got[k], got[k] - want[k])
        for (phase, want), (_, got) in zip(predicted, measured)
        for k in want
        if want[k] or got[k] or k == TEMP  # нулевые статьи фазы не показываем, кроме TEMP
    ]
    frame = pd.DataFrame(rows, columns=list(_COLUMNS))
    frame.attrs |= {"device": str(device), "dtype": str(engine_dtype).replace("torch.", "")}
    frame.attrs |= {"peak_kind": meter.kind, "peaks": peaks, "kv_tokens": batch.kv_cache_tokens}
    return frame


def rehearse(
    model: str = "random:Qwen2.5-0.5B",
    steps: int = 1,
    device: str | None = None,
    dtype: str | None = None,
    **loop_kwargs: Any,
) -> dict[str, Any]:
    """Прогон ``sequential_loop`` на модели model и сводка. Пик, байт: на GPU —
    ``max_memory_allocated``, на CPU — пиковый RSS − RSS до модели; на GPU ещё доля потолка
    декодирования: токены/с ÷ B·BW/(W + B·KV) (``throughput``)."""
    import psutil

    from course_utils import memory, policy, throughput

    steps = check.integer("steps", steps, 1)
    kwargs = {**_DEFAULTS, **loop_kwargs}
    micro_batch = kwargs.pop("micro_batch")
    dev = policy.pick_device(device)
    rss0 = int(psutil.Process().memory_info().rss)  # RSS процесса до модели, байт
    t0 = time.perf_counter()
    net, tokenizer, info = policy.load_policy(model, device=dev, dtype=dtype)
    load_s = time.perf_counter() - t0
    result = policy.sequential_loop(
        steps=steps, model=net, tokenizer=tokenizer, info=info, micro_batch=micro_batch, **kwargs
    )
    measured, kind = policy.peak_memory(dev)  # на GPU — пик последнего шага (сброс в цикле)
    if dev.type != "cuda":
        measured, kind = measured - rss0, "рост RSS процесса"  # пиковый RSS − RSS до модели
    table = result.steps
    stages = {s: float(table[f"{s}_s"].sum()) for s in policy.LOOP_STAGES}
    out_tokens = int(table["output_tokens"].sum())
    decode_tps = out_tokens / stages["decode"] if stages["decode"] > 0 else float("nan")
    engine_dt = next(net.parameters()).dtype
    engine_b = torch.finfo(engine_dt).bits // 8
    shape = memory.ModelShape.from_config(net.config)
    sequences = kwargs["prompts_per_step"] * kwargs["group_size"]
    longest = max(r.num_tokens for r in result.records)
    predicted = _predicted_peak_bytes(shape, engine_b, sequences, longest, micro_batch)
    weights = "случайные веса, настоящая форма" if info.is_random else "обученные веса"
    report: dict[str, Any] = {"model": info.model_id, "weights": weights}
    report |= {"n_params": info.num_params, "device": info.device, "dtype": info.dtype}
    report |= {"steps": steps, "sequences_per_step": sequences, "load_s": load_s}
    report |= {"stage_s": stages, "step_s": float(table["wall_s"].sum())}
    report |= {"input_tokens": int(table["input_tokens"].sum()), "output_tokens": out_tokens}
    report["decode_tokens_per_s"] = decode_tps
    scaler = policy.grad_scaler_for(dev, policy.trainer_autocast_dtype(dev, engine_dt))
    report |= {"grad_scaler": scaler is not None}
    report |= {"skipped_steps": int(table["skipped_steps"].sum())}
    report |= {"peak_bytes_measured": measured, "peak_kind": kind}
    report |= {"peak_bytes_predicted": predicted["total"], "predicted_terms": predicted}
    report["predicted_over_measured"] = predicted["total"] / measured if measured > 0 else None
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        bandwidth = throughput.gpu_bandwidth(name)
        report["gpu"] = name
        if bandwidth:
            kv_seq = shape.kv_bytes_per_token(engine_b) * longest
            roof = throughput.decode_roofline_tokens_per_s(
                shape.weights_bytes(engine_b), bandwidth, sequences, kv_seq
            )
            report["decode_roofline_tokens_per_s"] = roof
            report["decode_fraction_of_roofline"] = decode_tps / roof
    return report


def main(argv: list[str]) -> int:
    """CLI ``rehearse``: печатает сводку ``rehearse`` одним объектом JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils.policy rehearse")
    parser.add_argument("--model", default="random:Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--max-new-tokens", type=int, default=_DEFAULTS["max_new_tokens"])
    parser.add_argument("--json", action="store_true", help="один объект JSON (так и без флага)")
    ns = parser.parse_args(argv)
    report = rehearse(ns.model, ns.steps, ns.device, ns.dtype, max_new_tokens=ns.max_new_tokens)
    print(json.dumps(report, ensure_ascii=False))
    return 0
