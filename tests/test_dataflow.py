"""Описание потока данных шага 12.1.1 и его схема."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from course_utils import dataflow, policy  # noqa: E402


def test_eight_stages_six_roles_and_loop_mapping():
    assert [s.number for s in dataflow.STAGES] == list(range(1, 9))
    assert len(dataflow.ROLES) == 6
    roles = {key for key, _ in dataflow.ROLES}
    assert all(s.role in roles for s in dataflow.STAGES)
    mapped = [ls for s in dataflow.STAGES for ls in s.loop_stages]
    # каждый этап эталонного цикла встречается ровно один раз и в том же порядке
    assert tuple(mapped) == policy.LOOP_STAGES


def test_plot_has_box_per_stage_and_lane_per_role():
    ax = dataflow.plot_dataflow()
    texts = [t.get_text() for t in ax.texts]
    for st in dataflow.STAGES:
        assert any(t.startswith(f"{st.number}. ") for t in texts)
    assert len(ax.get_yticklabels()) == len(dataflow.ROLES)
    assert [t.get_text() for t in ax.get_yticklabels()][3] == "тренер"
    plt.close(ax.figure)
