"""Тесты проверки симулятора на настоящем цикле (course_utils.pipeline_validate).

Величины считаются одной функцией по таблицам одного вида: симуляция, пересказанная в журнал
настоящего тренера, даёт те же числа. Один короткий настоящий прогон через командную строку
(2 запуска по 3 с, ~40–90 с на 2 ядрах) проверяет форму JSON; точность не проверяется (шум).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from course_utils import pipeline_validate as pv
from course_utils.multiproc.transport import ROLE_GENERATOR, ROLE_TRAINER
from course_utils.pipeline import SimConfig, simulate

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ((140, 0.3), (152, 0.25), (148, 0.45), (156, 0.9))


def _fitted(**kw) -> SimConfig:
    base = dict(duration_s=6.0, num_collectors=2, batch_tokens=512, max_queue_tokens=1024)
    base.update(batch_when_ready=True, measured_rollouts=PAIRS, prefill_s=0.0)
    return SimConfig(**{**base, "train_tokens_per_s": 600.0, "train_fixed_s": 0.4, **kw})


def _as_launch_result(res, t0: float = 17.0) -> list[dict]:
    """Симуляция, пересказанная журналами рангов, как их пишет настоящий тренер очереди."""
    q = res.queue
    timeline = [{"time_s": t + t0, "depth_tokens": d} for t, d in zip(q["time"], q["depth_tokens"])]
    taken = res.rollouts.dropna(subset=["consumed_version"])
    ends = dict(zip(res.steps["step"], res.steps["end"]))
    batches = []
    for step, g in taken.groupby("consumed_version"):
        assert g["dequeue_time"].nunique() == 1  # пакет снят разом (batch_when_ready)
        end = ends.get(int(step), res.config.duration_s + 1.0)  # шаг не кончился к горизонту
        lags = (g["consumed_version"] - g["behavior_version"]).astype(int).tolist()
        batches.append({"pop_s": g["dequeue_time"].iloc[0] + t0, "end_s": end + t0, "lags": lags})
    head = {"experiment": "queue_generators_trainer"}
    trainer = {**head, "rank": 0, "role": ROLE_TRAINER, "start_s": t0}
    trainer.update(timeline=timeline, batches=batches)
    gens = [{**head, "rank": k, "role": ROLE_GENERATOR, "events": []} for k in (1, 2)]
    return [trainer, *gens]


@pytest.mark.parametrize("threshold", [512, 1024, 2048])
def test_measured_path_gives_simulator_metrics(threshold):
    res = simulate(_fitted(max_queue_tokens=threshold))
    sim = pv.trace_metrics(pv.simulated_trace(res))
    real = pv.trace_metrics(pv.measured_trace(_as_launch_result(res), res.config.duration_s))
    assert sim.keys() == real.keys() == pv.METRICS.keys()
    for name in sim:
        assert math.isclose(sim[name], real[name], rel_tol=1e-9, abs_tol=1e-9), name
    # независимо: задержка — по таблице роллаутов, поток — по пакетам после первого
    taken = res.rollouts.dropna(subset=["consumed_version"])
    lag = (taken["consumed_version"] - taken["behavior_version"]).mean()
    assert math.isclose(sim["policy_lag_mean"], lag)
    pops = taken.groupby("consumed_version")["dequeue_time"].agg(["first", "size"])
    rate = pops["size"].iloc[1:].sum() / (pops["first"].iloc[-1] - pops["first"].iloc[0])
    assert len(pops) >= 3 and math.isclose(sim["throughput_rollouts_per_s"], rate)


def test_trace_metrics_by_hand():
    # глубина: 0 на [0, 1), 100 на [1, 2), 300 на [2, 3), 0 на [3, 4]; H = 4 с
    queue = pd.DataFrame({"time_s": [1.0, 2.0, 3.0, 5.0], "depth_tokens": [100, 300, 0, 999]})
    steps = pd.DataFrame({"start_s": [0.5, 3.5], "end_s": [1.5, 5.0]})
    groups = pd.DataFrame({"dequeue_s": [0.5, 3.5, 3.5, 4.5], "lag": [0, 1, 2, 5]})
    m = pv.trace_metrics(pv.Trace(queue, steps, groups, 4.0))
    assert m["queue_tokens_mean"] == pytest.approx((100 + 300) / 4)  # по времени, не по событиям
    assert m["queue_tokens_p95"] == 300  # 0 — половина времени, ≤ 100 — три четверти
    assert m["trainer_busy_fraction"] == pytest.approx((1.0 + 0.5) / 4)  # второй шаг обрезан
    assert m["throughput_rollouts_per_s"] == pytest.approx(2 / 3)  # 2 группы за 3 с; 4,5 > H
    assert m["policy_lag_mean"] == pytest.approx(1.0)


def test_bad_arguments_fail_before_launch():
    with pytest.raises(ValueError, match="threshold"):
        pv.validate(threshold=256, batch_tokens=512)
    with pytest.raises(ValueError, match="threshold × 0.25"):
        pv.validate(threshold=1024, batch_tokens=512, factors=(0.25,))
    with pytest.raises(ValueError, match="sim_seeds"):
        pv.validate(sim_seeds=0)


def test_failed_or_empty_run_is_rejected():
    res = simulate(_fitted(duration_s=0.2))  # ни одного пакета за 0,2 с
    fake = _as_launch_result(res)
    fake[0].update(permissions=[], arrivals=[], batch_tokens=512, threshold_tokens=1024)
    with pytest.raises(ValueError, match="нет ни одного шага"):
        pv.fit_config(fake, 0.2)
    with pytest.raises(ValueError, match="тренер"):
        pv.measured_trace(fake[1:], 0.2)


def test_validate_command_short_run(tmp_path):
    out = tmp_path / "validation.json"
    cmd = [sys.executable, "-m", "course_utils.pipeline", "validate", "--json", "--out", str(out)]
    cmd += ["--duration", "3", "--what-if", "2", "--sim-seeds", "3"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == result  # файл = напечатанное
    assert {"config", "fit", "sim_config", "metrics", "series", "what_if"} <= result.keys()
    assert result["config"]["max_queue_tokens"] == 1024 and result["config"]["generators"] == 2
    (what_if,) = result["what_if"]
    assert what_if["threshold_tokens"] == 2048
    for case in (result, what_if):
        rows = {m["name"]: m for m in case["metrics"]}
        assert list(rows) == list(pv.METRICS)
        for m in rows.values():
            assert math.isfinite(m["predicted"]) and math.isfinite(m["measured"]), m
        for side in ("predicted", "measured"):
            assert 0 < rows["trainer_busy_fraction"][side] <= 1
            assert rows["policy_lag_mean"][side] >= 0
            assert rows["throughput_rollouts_per_s"][side] > 0
        s = case["series"]
        assert len(s["time_s"]) == len(s["predicted_tokens"]) == len(s["measured_tokens"])
    frame = pv.comparison_frame(result)
    assert len(frame) == 2 * len(pv.METRICS) and "в пределах цели" in frame.columns


def test_command_reports_bad_argument_in_russian():
    cmd = [sys.executable, "-m", "course_utils.pipeline", "validate", "--threshold", "100"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "threshold" in proc.stderr and "должно" in proc.stderr
