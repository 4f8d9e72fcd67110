"""Пропускная способность в токенах и событиях, потолок декодирования."""

from __future__ import annotations

import pandas as pd
import pytest

from course_utils import throughput
from course_utils.contract import RolloutRecord


def _rec(version, group, correct, n_prompt=3, n_resp=2):
    return RolloutRecord(
        sample_id=f"v{version}-{group}-{correct}-{n_resp}",
        policy_version=version,
        prompt_tokens=[1] * n_prompt,
        response_tokens=[2] * n_resp,
        policy_mask=[0] * n_prompt + [1] * n_resp,
        behavior_logprobs=[-0.5] * n_resp,
        decoding={"temperature": 1.0, "top_p": 1.0},
        reward={"correctness": float(correct), "format": 1.0},
        stop_reason="eos",
        verifier_version="t",
        group_id=f"v{version}-{group}",
    )


def _steps():
    return pd.DataFrame(
        {
            "step": [0, 1, 2],
            "behavior_version": [0, 1, 2],
            "wall_s": [10.0, 2.0, 2.0],
            "input_tokens": [12, 12, 12],
            "output_tokens": [8, 8, 8],
            "policy_tokens": [8, 8, 8],
        }
    )


def _records():
    recs = []
    for v in (0, 1, 2):
        recs += [_rec(v, "a", 1), _rec(v, "a", 0), _rec(v, "b", 1), _rec(v, "b", 1)]
    return recs


def test_report_against_hand_computation():
    rep = throughput.throughput_report(_steps(), _records(), skip_warmup=1)
    val = dict(zip(rep["метрика"], rep["значение"]))
    T = 4.0  # шаги 1 и 2
    assert val["время шагов после прогрева"] == T
    assert val["входные токены/с"] == 24 / T
    assert val["выходные токены/с"] == 16 / T
    assert val["завершённые роллауты/с"] == 8 / T
    assert val["проверенные исходы/с"] == 8 / T
    assert val["обучающие токены политики/с"] == 16 / T
    assert val["все токены пакета (запрос + ответ)/с"] == 8 * 5 / T
    assert val["шаги оптимизатора/ч"] == pytest.approx(2 / T * 3600)
    assert val["группы/с"] == 4 / T
    assert val["доля вырожденных групп"] == 0.5  # группы «b» у обеих версий вырождены
    assert val["информативные группы/с"] == 4 / T * 0.5
    units = dict(zip(rep["метрика"], rep["единица"]))
    assert units["выходные токены/с"] == "токенов/с"  # родительный падеж, как «нат», «ГиБ»
    assert units["информативные группы/с"] == "групп/с"
    assert units["шаги оптимизатора/ч"] == "шагов/ч"
    assert units["доля вырожденных групп"] == "доля (0–1)"


def test_report_bad_input():
    with pytest.raises(ValueError, match="steps"):
        throughput.throughput_report(pd.DataFrame(), _records())
    with pytest.raises(ValueError, match="skip_warmup"):
        throughput.throughput_report(_steps(), _records(), skip_warmup=3)
    with pytest.raises(ValueError, match="records"):
        throughput.throughput_report(_steps(), [_rec(0, "a", 1)], skip_warmup=1)
    with pytest.raises(ValueError, match="steps"):
        throughput.throughput_report(_steps().drop(columns=["wall_s"]), _records())


def test_roofline_matches_research_numbers():
    # Qwen2.5-0.5B в fp16 на T4 (320 ГБ/с), пакет 1, KV не учитываем: ≈ 323.9 токен/с
    w = 494_032_768 * 2
    assert throughput.decode_roofline_tokens_per_s(w, 320e9) == pytest.approx(323.9, abs=0.05)
    # пакет B с KV: B·BW / (W + B·KV)
    assert throughput.decode_roofline_tokens_per_s(100.0, 1000.0, 4, 25.0) == 4 * 1000 / 200
    with pytest.raises(ValueError, match="batch"):
        throughput.decode_roofline_tokens_per_s(w, 320e9, batch=0)
    with pytest.raises(ValueError, match="weights_bytes"):
        throughput.decode_roofline_tokens_per_s(-1, 320e9)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: throughput.decode_roofline_tokens_per_s(0, 1e9), "weights_bytes должно быть конечным числом > 0, получено 0"),
        (lambda: throughput.decode_roofline_tokens_per_s(1e9, float("inf")), "bandwidth_bytes_per_s должно быть конечным числом > 0"),
        (lambda: throughput.decode_roofline_tokens_per_s(1e9, 1e9, batch=2.5), "batch должно быть целым ≥ 1, получено 2.5"),
        (lambda: throughput.decode_roofline_tokens_per_s(1e9, 1e9, 1, -1), "kv_bytes_per_sequence должно быть конечным числом ≥ 0"),
        (lambda: throughput.throughput_report(_steps(), _records(), skip_warmup=True), r"skip_warmup должно быть целым в \[0, 2\]"),
    ],
)  # fmt: skip
def test_bad_input_messages_name_argument_and_range(call, message):
    with pytest.raises(ValueError, match=message):
        call()
    # целый float (так пишут 7.5e9) принимается как целое
    assert throughput.decode_roofline_tokens_per_s(100.0, 1000.0, 4.0, 25.0) == 20.0


def test_gpu_bandwidth_lookup():
    assert throughput.gpu_bandwidth("Tesla T4") == 320e9
    assert throughput.gpu_bandwidth("NVIDIA A100-SXM4-80GB") == 2039e9
    assert throughput.gpu_bandwidth("NVIDIA H200") == 4.8e12
    assert throughput.gpu_bandwidth("Радиола") is None
    with pytest.raises(ValueError, match="device_name"):
        throughput.gpu_bandwidth("")


def test_degenerate_groups_use_the_scalar_reward_with_format():
    # Группа a: правильность у всех 0, но формат различается — скалярные награды 0 и 0.1
    # разные, преимущества GRPO ненулевые: группа информативна. Группа b: всё одинаково.
    recs = []
    for i, fmt in enumerate([1.0, 0.0, 1.0, 1.0]):
        r = _rec(0, "a", 0, n_resp=2 + i)
        r.reward = {"correctness": 0.0, "format": fmt}
        recs.append(r)
    recs += [_rec(0, "b", 1, n_resp=2 + i) for i in range(4)]
    assert throughput.degenerate_group_share(recs) == (2, 0.5)
    # Только правильность (веса без формата): вырождены обе.
    assert throughput.degenerate_group_share(recs, {"correctness": 1.0}) == (2, 1.0)
