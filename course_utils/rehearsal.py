"""Репетиция уровня B без сети: эталонный цикл на модели настоящей формы со случайными весами.

``python -m course_utils.policy rehearse --model random:Qwen2.5-0.5B --steps 1 --json`` строит
архитектуру из ``data/model_configs/``, проходит ``policy.sequential_loop`` (генерация, награда,
пересчёт, шаг GRPO, синхронизация весов) и печатает один JSON: время этапов, токены, скорость
декодирования, измеренный пик памяти и предсказание калькулятора ``memory`` для того же цикла.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from course_utils import args as check

# Форма цикла репетиции по умолчанию: мало запросов и коротких ответов — чтобы 0,5 млрд
# параметров на двух ядрах CPU укладывались в минуты, а вся память состояний уже была занята.
DEFAULTS = {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16, "micro_batch": 8}


def predicted_peak_bytes(
    shape,
    engine_bytes_per_param: float,
    sequences: int,
    tokens_per_sequence: int,
    micro_batch: int,
    logits_bytes: int = 4,
) -> dict[str, int]:
    """Предсказание пика памяти эталонного цикла по слагаемым, байт.

    Одновременно живут: веса движка N·b_engine; тренер во float32 с AdamW — рецепт
    ``fp32_adam`` (4 + 4 + 4 + 4 = 16 Б/параметр: веса, градиенты, m, v), ``memory.state_bytes``;
    логиты словаря одного микропакета при обучении: m·T·V·b_logits на каждую из трёх копий
    (логиты, log_softmax, их градиент); KV-кэш генерации 2·L·H_kv·d_h·S·T·b_engine. Остальное
    (активации слоёв, буферы библиотек) не входит — поэтому измеренный пик чуть больше.
    """
    from course_utils import memory

    n = shape.num_params
    m = min(check.integer("micro_batch", micro_batch, 1), check.integer("sequences", sequences, 1))
    t = check.integer("tokens_per_sequence", tokens_per_sequence, 1)
    layers, kv_heads, head_dim = shape.num_layers, shape.num_kv_heads, shape.head_dim
    terms = {
        "engine_weights": int(n * engine_bytes_per_param),  # N · b_engine
        "trainer_fp32_adam": memory.state_bytes(n, "fp32_adam"),  # 16 Б · N
        "train_logits": 3 * m * t * shape.vocab_size * logits_bytes,  # 3 · m · T · V · 4 Б
        # 2 · L · H_kv · d_h · S · T · b_engine
        "kv_cache": memory.kv_cache_bytes(
            layers, kv_heads, head_dim, sequences * t, engine_bytes_per_param
        ),
    }
    terms["total"] = sum(terms.values())
    return terms


def rehearse(
    model: str = "random:Qwen2.5-0.5B",
    steps: int = 1,
    device: str | None = None,
    dtype: str | None = None,
    **loop_kwargs: Any,
) -> dict[str, Any]:
    """Прогон ``sequential_loop`` на модели ``model`` и сводка в одном словаре (см. модуль).

    Измеренный пик: на GPU — ``torch.cuda.max_memory_allocated``; на CPU — рост RSS процесса
    от момента перед созданием модели до пикового RSS (ru_maxrss), байт. На GPU добавляется
    доля потолка декодирования: измеренные токены/с ÷ B·BW/(W + B·KV) (``throughput``).
    """
    import psutil

    from course_utils import memory, policy, throughput

    steps = check.integer("steps", steps, 1)
    kwargs = {**DEFAULTS, **loop_kwargs}
    micro_batch = kwargs.pop("micro_batch")
    dev = policy.pick_device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rss0 = int(psutil.Process().memory_info().rss)  # RSS процесса до модели, байт
    t0 = time.perf_counter()
    net, tokenizer, info = policy.load_policy(model, device=dev, dtype=dtype)
    load_s = time.perf_counter() - t0
    result = policy.sequential_loop(
        steps=steps, model=net, tokenizer=tokenizer, info=info, micro_batch=micro_batch, **kwargs
    )
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    measured, kind = policy.peak_memory(dev)
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
    longest = max(len(r.prompt_tokens) + len(r.response_tokens) for r in result.records)
    predicted = predicted_peak_bytes(shape, engine_b, sequences, longest, micro_batch)
    report: dict[str, Any] = {
        "model": info.model_id,
        "weights": "случайные веса, настоящая форма" if info.is_random else "обученные веса",
        "n_params": info.num_params,
        "device": info.device,
        "dtype": info.dtype,
        "steps": steps,
        "sequences_per_step": sequences,
        "load_s": load_s,
        "stage_s": stages,
        "step_s": float(table["wall_s"].sum()),
        "input_tokens": int(table["input_tokens"].sum()),
        "output_tokens": out_tokens,
        "decode_tokens_per_s": decode_tps,
        "grad_scaler": policy.grad_scaler_for(dev, policy.trainer_autocast_dtype(dev, engine_dt))
        is not None,
        "skipped_steps": int(table["skipped_steps"].sum()),
        "peak_bytes_measured": measured,
        "peak_kind": kind,
        "peak_bytes_predicted": predicted["total"],
        "predicted_terms": predicted,
        "predicted_over_measured": predicted["total"] / measured if measured > 0 else None,
    }
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
    """CLI ``rehearse``: печатает JSON (``--json``) или короткую сводку по-русски."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils.policy rehearse")
    parser.add_argument("--model", default="random:Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"])
    parser.add_argument("--json", action="store_true", help="один объект JSON на stdout")
    ns = parser.parse_args(argv)
    report = rehearse(ns.model, ns.steps, ns.device, ns.dtype, max_new_tokens=ns.max_new_tokens)
    if ns.json:
        print(json.dumps(report, ensure_ascii=False))
        return 0
    from course_utils.fmt import num

    print(
        f"{report['model']} ({report['weights']}): {num(report['n_params'])} параметров, "
        f"{report['device']}, {report['dtype']}; шаг {report['step_s']:.1f} с, декодирование "
        f"{report['decode_tokens_per_s']:.1f} токенов/с; пик памяти: измерено "
        f"{report['peak_bytes_measured'] / 2**30:.2f} ГиБ ({report['peak_kind']}), "
        f"предсказано {report['peak_bytes_predicted'] / 2**30:.2f} ГиБ (ГиБ = 2^30 Б)"
    )
    return 0
