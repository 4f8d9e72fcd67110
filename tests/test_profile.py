"""Тесты course_utils.profile: T_seq, узкое место, закон Амдала, синтетический профиль, рисунок."""

import math
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_utils import profile  # noqa: E402
from course_utils.profile import (  # noqa: E402
    STAGE_LABELS_RU,
    STAGES,
    dominant_stage,
    plot_stage_bar,
    profile_table,
    sequential_time,
    speedup_bound,
    stage_medians,
    synthetic_profile,
)

REPO = Path(__file__).resolve().parents[1]

# Профиль, посчитанный вручную: T_seq = 0.1 + 0.4 + 5.5 + 1.0 + 0.5 + 1.5 + 0.25 + 0.75 = 10 с.
HAND = {
    "prepare": 0.1,
    "prefill": 0.4,
    "decode": 5.5,
    "reward": 1.0,
    "logprob_recompute": 0.5,
    "forward_backward": 1.5,
    "optimizer_step": 0.25,
    "weight_sync": 0.75,
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ---------------------------------------------------------------- этапы
def test_stages_match_policy_loop_stages():
    pytest.importorskip("torch")
    from course_utils.policy import LOOP_STAGES

    assert STAGES == LOOP_STAGES
    assert list(STAGE_LABELS_RU) == list(STAGES)
    assert profile.stage_columns() == [f"{s}_s" for s in LOOP_STAGES]
    assert set(profile.DEFAULT_MEDIANS_S) == set(profile.NOISE_SIGMA) == set(STAGES)
    assert set(profile.WARMUP_FACTOR) == set(STAGES)


def test_stage_labels_are_russian():
    for label in STAGE_LABELS_RU.values():
        assert any("а" <= ch <= "я" or ch == "ё" for ch in label.lower()), label
    assert STAGE_LABELS_RU["decode"] == "декодирование"


def test_import_does_not_pull_torch_or_pyplot():
    code = (
        "import sys, course_utils.profile; "
        "assert 'torch' not in sys.modules, 'torch'; "
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- арифметика
def test_sequential_time_and_dominant_by_hand():
    assert sequential_time(HAND) == pytest.approx(10.0, abs=1e-12)
    assert sequential_time(pd.Series(HAND)) == pytest.approx(10.0, abs=1e-12)
    assert sequential_time({"rollout": 3.0}) == 3.0
    assert sequential_time({"a": 0.0, "b": 0.0}) == 0.0
    assert dominant_stage(HAND) == "decode"
    assert dominant_stage(pd.Series(HAND)) == "decode"
    assert dominant_stage({"a": 2.0, "b": 2.0, "c": 1.0}) == "a"  # при равенстве — первый
    assert dominant_stage({**HAND, "reward": 8.0}) == "reward"


def test_speedup_bound_by_hand():
    # decode бесплатен: остаётся 10 − 5.5 = 4.5 с, S_max = 10 / 4.5
    assert speedup_bound(HAND, "decode") == pytest.approx(10 / 4.5, rel=1e-12)
    assert speedup_bound(HAND, "weight_sync") == pytest.approx(10 / 9.25, rel=1e-12)
    assert speedup_bound({"rollout": 6.0, "train": 2.0, "sync": 2.0}, "rollout") == 2.5


def test_amdahl_limits():
    assert speedup_bound({**HAND, "reward": 0.0}, "reward") == 1.0
    assert speedup_bound({"decode": 4.0, "reward": 0.0}, "decode") == math.inf
    for stage in HAND:  # S_max = T_seq / (T_seq − T_stage) ≥ 1, больше у более долгого этапа
        rest = sum(t for s, t in HAND.items() if s != stage)
        bound = speedup_bound(HAND, stage)
        assert bound == pytest.approx(10 / rest, rel=1e-12) and bound >= 1


@pytest.mark.parametrize(
    "bad",
    [{}, {"decode": -1.0}, {"decode": float("nan")}, {"decode": float("inf")}, {"decode": "2"},
     {"decode": True}, {"": 1.0}, {3: 1.0}, [1.0, 2.0], 5.0, None,
     pd.DataFrame({"decode": [1.0]})],
)  # fmt: skip
def test_bad_stage_times(bad):
    with pytest.raises(ValueError, match="stage_times"):
        sequential_time(bad)
    with pytest.raises(ValueError, match="stage_times"):
        profile_table(bad)


def test_bad_stage_and_factor():
    with pytest.raises(ValueError, match="stage"):
        speedup_bound(HAND, "generate")
    with pytest.raises(ValueError, match="stage"):
        speedup_bound(HAND, None)
    zeros = dict.fromkeys(HAND, 0.0)
    for call in (lambda: dominant_stage(zeros), lambda: speedup_bound(zeros, "decode"),
                 lambda: profile_table(zeros)):  # fmt: skip
        with pytest.raises(ValueError, match="> 0"):
            call()


# ---------------------------------------------------------------- синтетический профиль
def test_synthetic_profile_shape_and_determinism():
    a = synthetic_profile(steps=7, seed=3)
    assert list(a.columns) == ["step", *profile.stage_columns()]
    assert list(a["step"]) == list(range(7))
    pd.testing.assert_frame_equal(a, synthetic_profile(steps=7, seed=3))
    assert not a.equals(synthetic_profile(steps=7, seed=4))
    assert (a[profile.stage_columns()].to_numpy() > 0).all()
    assert len(synthetic_profile()) == 10


def test_synthetic_profile_proportions_and_warmup():
    frame = synthetic_profile(steps=801, seed=0)
    medians = stage_medians(frame)
    for stage, expected in profile.DEFAULT_MEDIANS_S.items():
        assert medians[stage] == pytest.approx(expected, rel=0.05), stage
    assert dominant_stage(medians) == "decode"
    share = medians["decode"] / sequential_time(medians)
    assert 0.45 < share < 0.7  # декодирование доминирует, но не всё
    # шаг 0 медленнее (прогрев) во всех этапах, кроме тех, где шум перекрывает множитель
    first = frame.iloc[0]
    assert first["optimizer_step_s"] > 2 * medians["optimizer_step"]
    assert sequential_time({s: first[f"{s}_s"] for s in STAGES}) > sequential_time(medians)


def test_synthetic_profile_scale_changes_dominant():
    medians = stage_medians(synthetic_profile(seed=1, scale={"reward": 25}))
    assert dominant_stage(medians) == "reward"
    base = stage_medians(synthetic_profile(seed=1))
    assert medians["reward"] == pytest.approx(25 * base["reward"], rel=1e-12)
    assert medians["decode"] == pytest.approx(base["decode"], rel=1e-12)


@pytest.mark.parametrize(
    "kwargs, name",
    [({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"), ({"steps": True}, "steps"),
     ({"seed": -1}, "seed"), ({"seed": "0"}, "seed"), ({"scale": {"generate": 2}}, "scale"),
     ({"scale": {"decode": 0}}, "scale"), ({"scale": {"decode": float("nan")}}, "scale")],
)  # fmt: skip
def test_synthetic_profile_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        synthetic_profile(**kwargs)


# ---------------------------------------------------------------- медианы
def _hand_frame(decode):
    n = len(decode)
    data = {"step": list(range(n))}
    data.update({f"{s}_s": [1.0] * n for s in STAGES})
    data["decode_s"] = decode
    return pd.DataFrame(data)


def test_stage_medians_skip_warmup():
    frame = _hand_frame([100.0, 1.0, 2.0, 3.0])
    assert stage_medians(frame)["decode"] == 2.0  # медиана [1, 2, 3]
    assert stage_medians(frame, skip_warmup=0)["decode"] == 2.5  # медиана [100, 1, 2, 3]
    assert stage_medians(frame, skip_warmup=2)["decode"] == 2.5  # медиана [2, 3]
    assert stage_medians(frame, skip_warmup=3)["decode"] == 3.0
    medians = stage_medians(frame)
    assert list(medians.index) == list(STAGES) and medians["prepare"] == 1.0
    # порядок строк не важен: прогрев — это наименьший номер шага
    shuffled = frame.iloc[[2, 0, 3, 1]]
    assert stage_medians(shuffled)["decode"] == 2.0


def test_stage_medians_on_sequential_loop_table():
    """Таблица шагов policy.sequential_loop: лишние столбцы (*_s тоже) не мешают."""
    frame = _hand_frame([9.0, 4.0, 6.0])
    frame["stages_sum_s"] = 99.0
    frame["wall_s"] = 99.0
    frame["input_tokens"] = 500
    frame["behavior_version"] = [0, 1, 2]
    medians = stage_medians(frame)
    assert list(medians.index) == list(STAGES) and medians["decode"] == 5.0
    assert sequential_time(medians) == pytest.approx(12.0)


def test_stage_medians_bad_input():
    frame = _hand_frame([1.0, 2.0])
    with pytest.raises(ValueError, match="skip_warmup"):
        stage_medians(frame, skip_warmup=2)
    with pytest.raises(ValueError, match="skip_warmup"):
        stage_medians(frame, skip_warmup=-1)
    with pytest.raises(ValueError, match="decode_s"):
        stage_medians(frame.drop(columns="decode_s"))
    with pytest.raises(ValueError, match="skip_warmup"):
        stage_medians(frame.iloc[:0])
    negative = _hand_frame([1.0, -2.0, 3.0])
    with pytest.raises(ValueError, match="≥ 0"):
        stage_medians(negative)


# ---------------------------------------------------------------- таблица
def test_profile_table_shares_and_tokens():
    table = profile_table(HAND)
    assert list(table.columns) == ["этап", "время, с", "доля, %"]
    assert table.index.name == "код этапа"  # заголовок, который видит студент, — по-русски
    assert list(table.index) == list(HAND)  # а ключи этапов — как в коде
    assert list(table.index) == list(STAGES)
    assert table["доля, %"].sum() == pytest.approx(100.0, abs=1e-9)
    assert table.loc["decode", "доля, %"] == pytest.approx(55.0)
    assert table.loc["decode", "этап"] == "декодирование"

    table = profile_table(pd.Series(HAND), tokens={"input_tokens": 2000, "output_tokens": 11000})
    assert table.loc["prefill", "токенов/с"] == pytest.approx(2000 / 0.4)
    assert table.loc["decode", "токенов/с"] == pytest.approx(11000 / 5.5)
    others = table.drop(index=["prefill", "decode"])["токенов/с"]
    assert others.isna().all()
    only_out = profile_table(HAND, tokens={"output_tokens": 550})
    assert np.isnan(only_out.loc["prefill", "токенов/с"])
    assert only_out.loc["decode", "токенов/с"] == pytest.approx(100.0)


def test_profile_table_bad_tokens():
    for tokens in ({"tokens": 5}, {"input_tokens": -1}, {"output_tokens": "x"}):
        with pytest.raises(ValueError, match="tokens"):
            profile_table(HAND, tokens=tokens)


# ---------------------------------------------------------------- рисунок
def test_plot_single_profile(tmp_path):
    ax = plot_stage_bar(HAND)
    assert isinstance(ax, matplotlib.axes.Axes)
    assert len(ax.patches) == len(STAGES)
    assert ax.get_xlabel() == "время шага, с"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [STAGE_LABELS_RU[s] for s in STAGES]
    texts = [t.get_text() for t in ax.texts]
    assert "55 %" in texts and "10.00 с" in texts
    assert "1 %" not in texts  # узкий сегмент prepare не подписан
    widths = sorted(p.get_width() for p in ax.patches)
    assert widths == pytest.approx(sorted(HAND.values()))
    ax.figure.savefig(tmp_path / "bar.png")
    assert (tmp_path / "bar.png").stat().st_size > 0


def test_plot_on_existing_axes():
    fig, ax = plt.subplots()
    out = plot_stage_bar(stage_medians(synthetic_profile(seed=2)), ax=ax, title="уровень A")
    assert out is ax and ax.get_title() == "уровень A" and len(ax.patches) == len(STAGES)


def test_plot_bad_input():
    with pytest.raises(ValueError, match="stage_times"):
        plot_stage_bar({"decode": -1.0})
    with pytest.raises(ValueError, match="stage_times"):
        plot_stage_bar(pd.DataFrame())
    with pytest.raises(ValueError, match="> 0"):
        plot_stage_bar(dict.fromkeys(STAGES, 0.0))


def test_one_stage_one_colour_on_every_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from course_utils import tracing

    # Цвет этапа не зависит от набора соседей и совпадает на диаграмме Ганта и полосе профиля.
    alone = profile.stage_colors(["decode"])["decode"]
    assert profile.stage_colors(["queue_wait", "prefill", "decode"])["decode"] == alone
    assert len(set(profile.stage_colors(list(profile.STAGES)).values())) == len(profile.STAGES)
    events = pd.DataFrame({"worker": ["collector-0", "trainer-0"], "stage": ["queue_wait", "decode"],
                           "start_s": [0.0, 0.0], "end_s": [1.0, 2.0]})  # fmt: skip
    ax = tracing.gantt(events)
    gantt = {h.get_label(): h.get_facecolor() for h in ax.get_legend().legend_handles}
    assert gantt[tracing.stage_label("decode")] == alone
    plt.close("all")
