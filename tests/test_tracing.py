"""Тесты course_utils.tracing: таймер стадий, перцентили, таблица событий и диаграмма Ганта."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_utils import tracing  # noqa: E402
from course_utils.tracing import (  # noqa: E402
    StageTimer,
    cuda_sync_or_none,
    gantt,
    percentiles,
)


class FakeClock:
    """Детерминированные часы: каждое чтение возвращает следующее значение из списка."""

    def __init__(self, values):
        self.values = list(values)
        self.calls = 0

    def __call__(self):
        value = self.values[self.calls]
        self.calls += 1
        return value


class SyncCounter:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


# ----------------------------------------------------------------------------- percentiles


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentiles_match_numpy(n):
    rng = np.random.default_rng(n)
    values = rng.lognormal(mean=0.0, sigma=1.0, size=n)
    qs = (0, 1, 25, 50, 90, 95, 99, 99.9, 100)
    got = percentiles(values.tolist(), qs)
    assert list(got) == ["p0", "p1", "p25", "p50", "p90", "p95", "p99", "p99.9", "p100"]
    for q in qs:
        assert got[f"p{q:g}"] == pytest.approx(np.percentile(values, q), rel=1e-12, abs=1e-15)


def test_percentiles_default_keys_and_known_values():
    got = percentiles([4, 4, 5, 5, 5, 6, 6, 20])
    assert list(got) == ["p50", "p95", "p99"]
    assert got["p50"] == 5.0
    # h = 7 * 0.95 = 6.65 → 6 + 0.65 * (20 - 6)
    assert got["p95"] == pytest.approx(6 + 0.65 * 14)
    assert percentiles(np.array([1.0, 2.0]), 50) == {"p50": 1.5}
    assert percentiles(pd.Series([3.0]), (50,)) == {"p50": 3.0}


@pytest.mark.parametrize(
    "values, qs, fragment",
    [
        ([], (50,), "values"),
        ([1.0, math.nan], (50,), "values"),
        ([1.0, math.inf], (50,), "values"),
        ([1.0, "2"], (50,), "values"),
        ("123", (50,), "values"),
        ([1.0, 2.0], (101,), "[0, 100]"),
        ([1.0, 2.0], (-1,), "[0, 100]"),
        ([1.0, 2.0], (), "qs"),
    ],
)
def test_percentiles_bad_input(values, qs, fragment):
    with pytest.raises(ValueError) as err:
        percentiles(values, qs)
    assert fragment in str(err.value)


# ----------------------------------------------------------------------------- StageTimer


def test_stage_timer_exact_times_with_fake_clock():
    clock = FakeClock([100.0, 101.0, 103.5, 104.0, 104.25])
    sync = SyncCounter()
    timer = StageTimer(worker="gen", sync=sync, clock=clock)
    with timer.stage("generate"):
        pass
    with timer.stage("score"):
        pass
    assert sync.calls == 4  # по два вызова на стадию
    assert timer.events == [
        {"worker": "gen", "stage": "generate", "start_s": 1.0, "end_s": 3.5},
        {"worker": "gen", "stage": "score", "start_s": 4.0, "end_s": 4.25},
    ]
    assert timer.totals() == {"generate": 2.5, "score": 0.25}


def test_stage_timer_sync_before_clock_read():
    order = []
    timer = StageTimer(sync=lambda: order.append("sync"), clock=lambda: order.append("clock") or 0)
    order.clear()
    with timer.stage("x"):
        order.append("body")
    assert order == ["sync", "clock", "body", "sync", "clock"]


def test_nested_stages_ordered_by_start_and_counted_in_totals():
    clock = FakeClock([0.0, 1.0, 2.0, 5.0, 6.0, 7.0, 9.0, 9.5, 10.0])
    timer = StageTimer(clock=clock)
    with timer.stage("step"):  # 1 .. 10
        with timer.stage("forward"):  # 2 .. 5
            pass
        with timer.stage("backward"):  # 6 .. 7
            pass
        with timer.stage("forward"):  # 9 .. 9.5
            pass
    # Внешняя стадия закрывается последней, но стоит первой (порядок начала).
    assert [e["stage"] for e in timer.events] == ["step", "forward", "backward", "forward"]
    assert timer.events[0]["start_s"] == 1.0
    assert timer.totals() == {"step": 9.0, "forward": 3.5, "backward": 1.0}
    assert clock.calls == 9  # t0 и по два чтения на каждую из четырёх стадий


def test_stage_recorded_even_if_block_raises():
    timer = StageTimer(clock=FakeClock([0.0, 1.0, 3.0]))
    with pytest.raises(KeyError), timer.stage("load"):
        raise KeyError("нет файла")
    assert timer.totals() == {"load": 2.0}


def test_to_frame_columns():
    timer = StageTimer(worker="trainer", clock=FakeClock([0.0, 0.0, 2.0, 2.5, 3.5]))
    with timer.stage("generate"):
        pass
    with timer.stage("train"):
        pass
    frame = timer.to_frame()
    assert list(frame.columns) == list(tracing.BASE_COLUMNS)
    assert frame["duration_s"].tolist() == [2.0, 1.0]
    assert frame["trace_id"].isna().all() and len(timer.events) == 2
    empty = StageTimer().to_frame()
    assert list(empty.columns) == list(tracing.BASE_COLUMNS) and len(empty) == 0


def test_stage_timer_bad_constructor_and_stage_name():
    with pytest.raises(ValueError, match="worker"):
        StageTimer(worker="")
    timer = StageTimer()
    with pytest.raises(ValueError, match="name"), timer.stage(""):
        pass


def test_cuda_sync_or_none_on_cpu():
    assert cuda_sync_or_none(None) is None
    assert cuda_sync_or_none("cpu") is None
    import torch

    assert cuda_sync_or_none(torch.device("cpu")) is None
    sync = cuda_sync_or_none("cuda:0")  # только связывает функцию, CUDA не трогает
    assert callable(sync) and sync.args[0] == torch.device("cuda", 0)
    with pytest.raises(RuntimeError):
        cuda_sync_or_none("not-a-device")


# ----------------------------------------------------------------------------- summary, Gantt


def _sample_events(n_workers=4, per_worker=25, seed=0):
    rng = np.random.default_rng(seed)
    events = []
    for w in range(n_workers):
        t = 0.0
        for i in range(per_worker):
            stage = ["generate", "score", "train"][i % 3]
            d = float(rng.uniform(0.1, 1.0))
            events.append(
                {
                    "trace_id": f"t{i}",
                    "worker": f"rank{w}",
                    "stage": stage,
                    "start_s": t,
                    "end_s": t + d,
                }
            )
            t += d + 0.05
    return events


def test_event_frame_checks():
    timer = StageTimer(clock=FakeClock([0.0, 1.0, 2.0, 2.0, 5.0]))
    with timer.stage("a"):
        pass
    with timer.stage("b"):
        pass
    assert tracing._to_frame(timer, "frame")["duration_s"].tolist() == [1.0, 3.0]
    with pytest.raises(ValueError, match="нет ни одного события"):
        tracing._to_frame(pd.DataFrame(columns=list(tracing.BASE_COLUMNS)), "frame")
    with pytest.raises(ValueError, match="нет столбцов"):
        tracing._to_frame(pd.DataFrame({"stage": ["a"]}), "frame")
    with pytest.raises(ValueError, match="end_s < start_s"):
        tracing._to_frame([{"worker": "w", "stage": "a", "start_s": 2.0, "end_s": 1.0}], "frame")
    with pytest.raises(ValueError, match="frame"):
        tracing._to_frame(42, "frame")


@pytest.mark.parametrize("n_workers, per_worker", [(2, 3), (8, 40)])
def test_gantt_bars_rows_and_labels(n_workers, per_worker):
    events = _sample_events(n_workers, per_worker)
    ax = gantt(pd.DataFrame(events), title="профиль")
    try:
        assert len(ax.patches) == len(events)
        assert [t.get_text() for t in ax.get_yticklabels()] == [
            f"rank{w}" for w in range(n_workers)
        ]
        assert ax.get_xlabel() == "время, с"
        assert ax.get_title() == "профиль"
        legend = ax.get_legend()
        assert legend is not None
        assert [t.get_text() for t in legend.get_texts()] == ["generate", "score", "train"]
        colors = {}
        for patch, ev in zip(_patches_by_stage(ax, events), events):
            colors.setdefault(ev["stage"], set()).add(patch.get_facecolor())
        assert all(len(c) == 1 for c in colors.values())  # один цвет на стадию
        assert len({next(iter(c)) for c in colors.values()}) == len(colors)  # разные стадии
    finally:
        plt.close(ax.figure)


def _patches_by_stage(ax, events):
    stages = list(dict.fromkeys(e["stage"] for e in events))
    by_stage = {s: list(c.patches) for s, c in zip(stages, ax.containers)}
    out = []
    for e in events:
        out.append(by_stage[e["stage"]].pop(0))
    return out


def test_gantt_nested_events_drawn_thinner_on_top():
    clock = FakeClock([0.0, 0.0, 1.0, 2.0, 3.0])
    timer = StageTimer(worker="trainer", clock=clock)
    with timer.stage("step"), timer.stage("forward"):
        pass
    fig, ax = plt.subplots()
    try:
        out = gantt(timer, ax=ax)
        assert out is ax
        step_bar, forward_bar = ax.patches
        assert forward_bar.get_height() < step_bar.get_height()
        assert forward_bar.get_zorder() > step_bar.get_zorder()
        assert step_bar.get_width() == pytest.approx(3.0)  # 3 с
        assert ax.get_xlabel() == "время, с"
        with pytest.raises(ValueError, match="нет ни одного события"):
            gantt([], ax=ax)
    finally:
        plt.close(fig)


def test_worker_and_stage_labels_are_russian_for_display():
    assert tracing.worker_label("collector-12") == "сборщик 12"
    assert tracing.worker_label("trainer-0") == "тренер 0"
    assert tracing.worker_label("main") == "главный поток"
    assert tracing.worker_label("gen-1") == "генератор 1"
    assert tracing.worker_label("генератор 2") == "генератор 2"  # уже по-русски — как есть
    assert tracing.worker_label("rank3") == "rank3"  # незнакомое имя не придумываем
    assert tracing.stage_label("queue_wait") == "ожидание пакета"
    assert tracing.stage_label("decode") == "декодирование"
    assert tracing.stage_label("generate") == "generate"


def test_gantt_shows_russian_names_keeps_keys_in_data():
    from course_utils.pipeline import SimConfig, simulate

    res = simulate(SimConfig(duration_s=20.0, num_collectors=2, max_policy_lag=1))
    ax = gantt(res.events)
    try:
        ticks = [t.get_text() for t in ax.get_yticklabels()]
        assert ticks == ["сборщик 0", "сборщик 1", "тренер 0"]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "ожидание пакета" in legend and "прямой и обратный проход" in legend
        assert not any(x in legend for x in ("queue_wait", "decode", "forward_backward"))
        assert set(res.events["worker"]) == {"collector-0", "collector-1", "trainer-0"}
        ax.figure.canvas.draw()  # легенда справа от осей, но внутри рисунка
        fig_box = ax.figure.bbox
        box = ax.get_legend().get_window_extent()
        assert fig_box.x0 <= box.x0 and box.x1 <= fig_box.x1
    finally:
        plt.close(ax.figure)
