"""Пропускная способность RL-цикла в токенах и событиях (шаг 12.2.5), а не «примеров в секунду».

``throughput_report`` по шагам ``policy.sequential_loop``: токены/с на входе и выходе, роллауты и
исходы/с, обучающие токены, шаги оптимизатора/ч и информативные группы/с = группы/с × (1 − доля
вырожденных групп). ``decode_roofline_tokens_per_s`` — потолок декодирования по памяти (Kipply,
«Transformer Inference Arithmetic»): токенов/с ≤ B · BW / (W + B · KV(c)).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from course_utils.args import integer, nonnegative, positive, text
from course_utils.arith_task import grouped_rewards, is_informative_group

# Пиковая пропускная способность памяти GPU, байт/с (паспортные значения, 1 ГБ/с = 10^9 Б/с).
GPU_BANDWIDTH_BYTES_PER_S = {
    "T4": 320e9,
    "L4": 300e9,
    "A10": 600e9,
    "V100": 900e9,
    "A100-SXM4-40GB": 1555e9,
    "A100-SXM4-80GB": 2039e9,
    "H100": 3.35e12,
    "H200": 4.8e12,
}


def gpu_bandwidth(device_name: str) -> float | None:
    """Паспортная пропускная способность памяти, байт/с, по вхождению имени («Tesla T4» → T4;
    самое длинное совпадение побеждает), None — GPU неизвестен."""
    device_name = text("device_name", device_name)
    name = device_name.upper().replace(" ", "-")
    hits = [k for k in GPU_BANDWIDTH_BYTES_PER_S if k.upper() in name]
    return GPU_BANDWIDTH_BYTES_PER_S[max(hits, key=len)] if hits else None


def decode_roofline_tokens_per_s(
    weights_bytes: float,
    bandwidth_bytes_per_s: float,
    batch: int = 1,
    kv_bytes_per_sequence: float = 0.0,
) -> float:
    """Потолок декодирования, токенов/с: B · BW / (W + B · KV), где W — байты весов,
    KV — байты KV-кэша одной последовательности (читаются на каждом шаге), BW — байт/с."""
    weights_bytes = positive("weights_bytes", weights_bytes)
    bandwidth_bytes_per_s = positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    batch = integer("batch", batch, 1)
    kv_bytes_per_sequence = nonnegative("kv_bytes_per_sequence", kv_bytes_per_sequence)
    return batch * bandwidth_bytes_per_s / (weights_bytes + batch * kv_bytes_per_sequence)


def degenerate_group_share(records, reward_weights: Mapping[str, float] | None = None):
    """(число групп, доля вырожденных): вырождена группа, которая не ``is_informative_group`` по
    ``scalar_reward(reward, reward_weights)`` — она даёт A = 0 и не даёт градиента."""
    groups = grouped_rewards(records, reward_weights)
    if not groups:
        raise ValueError("records: нет ни одной записи")
    degenerate = sum(not is_informative_group(g.values()) for g in groups)
    return len(groups), degenerate / len(groups)


def throughput_report(steps: pd.DataFrame, records, skip_warmup: int = 1) -> pd.DataFrame:
    """Таблица «метрика, значение, единица»: объём работы шагов после прогрева / T, где
    T = Σ wall_s этих шагов, с; записи — по версии политики (``behavior_version``); проверенный
    исход — запись с конечной наградой от проверяющей системы."""
    if not isinstance(steps, pd.DataFrame) or steps.empty:
        raise ValueError("steps: нужна непустая таблица шагов (LoopResult.steps)")
    need = {"step", "behavior_version", "wall_s", "input_tokens", "output_tokens", "policy_tokens"}
    if missing := need - set(steps.columns):
        raise ValueError(f"steps: нет столбцов {sorted(missing)}")
    skip_warmup = integer("skip_warmup", skip_warmup, 0, len(steps) - 1)
    kept = steps.sort_values("step").iloc[skip_warmup:]
    versions = set(int(v) for v in kept["behavior_version"])
    recs = [r for r in records if r.policy_version in versions]
    if not recs:
        raise ValueError("records: нет записей для шагов после прогрева")
    T = float(kept["wall_s"].sum())
    n_groups, degenerate = degenerate_group_share(recs)
    rewards = [r.reward for r in recs if isinstance(r.reward, Mapping) and r.reward]
    verified = sum(all(math.isfinite(float(v)) for v in w.values()) for w in rewards)
    total_tokens = sum(r.num_tokens for r in recs)
    rows = [
        ("время шагов после прогрева", T, "с"),
        ("входные токены/с", kept["input_tokens"].sum() / T, "токенов/с"),
        ("выходные токены/с", kept["output_tokens"].sum() / T, "токенов/с"),
        ("завершённые роллауты/с", len(recs) / T, "роллаутов/с"),
        ("проверенные исходы/с", verified / T, "исходов/с"),
        ("обучающие токены политики/с", kept["policy_tokens"].sum() / T, "токенов/с"),
        ("все токены пакета (запрос + ответ)/с", total_tokens / T, "токенов/с"),
        ("шаги оптимизатора/ч", len(kept) / T * 3600, "шагов/ч"),
        ("группы/с", n_groups / T, "групп/с"),
        ("доля вырожденных групп", degenerate, "доля (0–1)"),
        ("информативные группы/с", n_groups / T * (1 - degenerate), "групп/с"),
    ]
    return pd.DataFrame(rows, columns=["метрика", "значение", "единица"])
