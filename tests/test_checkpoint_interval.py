"""Интервал контрольных точек: Янг, Дейли, доля потерь H(I) — против независимых расчётов."""

import math
import warnings

import matplotlib
import numpy as np
import pytest

from course_utils import checkpoint_interval as ci

matplotlib.use("Agg")


def test_young_interval_matches_independent_values():
    # Young (1974), значения из research/anchors_calc_sim.md §5.3: C = 5 мин.
    assert ci.young_interval(300, 24 * 3600) == pytest.approx(120 * 60, rel=1e-12)
    assert ci.young_interval(300, 6 * 3600) == pytest.approx(60 * 60, rel=1e-12)
    with pytest.warns(UserWarning, match="C/M"):  # C/M = 1/3: Янг уже груб
        assert ci.young_interval(300, 15 * 60) / 60 == pytest.approx(12.247, abs=5e-4)
    assert ci.young_interval(50, 10_000) == pytest.approx(1000.0)  # √(2·50·10⁴) вручную


def test_daly_interval_matches_daly_figures():
    # Daly (2006), рис. 3–5: τ_opt ≈ 117, 57 и 9,1 мин при δ = 5 мин.
    for mtbf_min, printed, exact in ((1440, 117, 116.6898), (360, 57, 56.7130), (15, 9.1, 9.1409)):
        minutes = ci.daly_interval(300, mtbf_min * 60) / 60
        assert minutes == pytest.approx(exact, abs=1e-4)
        assert minutes == pytest.approx(printed, rel=0.01)


@pytest.mark.parametrize("fn", [ci.young_interval, ci.daly_interval])
@pytest.mark.parametrize("write_s, mtbf_s", [(100, 100), (300, 40)])
def test_intervals_refuse_write_not_shorter_than_mtbf(fn, write_s, mtbf_s):
    """C ≥ M: запись не укладывается между отказами — интервала, который помог бы, нет."""
    with pytest.raises(ValueError, match=rf"C = {write_s} с .*M = {mtbf_s} с") as info:
        fn(write_s, mtbf_s)
    assert fn.__name__ in str(info.value) and "единицы" in str(info.value)


def test_young_interval_warns_unless_write_is_small():
    with pytest.warns(UserWarning, match=r"C/M = 0.33 > 0.1 \(C = 300 с, M = 900 с\)") as rec:
        assert ci.young_interval(300, 900) == pytest.approx(math.sqrt(2 * 300 * 900))
    assert "daly_interval" in str(rec[0].message) and rec[0].filename == __file__
    with pytest.raises(ValueError, match="C/M = 12.5"):  # M в часах рядом с C в секундах
        ci.young_interval(300, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ci.young_interval(300, 3000)  # C/M = 0.1 — ещё без предупреждения
        ci.young_interval(300, 24 * 3600)
        ci.daly_interval(300, 900)  # поправка Дейли верна и при C/M = 1/3
        ci.plot_overhead(120, 24 * 3600)  # как в ноутбуке 12.5


def _exact_optimum(write_s: float, mtbf_s: float) -> float:
    """Точный оптимум модели Дейли без перезапуска: минимум (e^((τ+C)/M) − 1)/τ на сетке."""
    grid = np.geomspace(1e-3 * mtbf_s, 5 * mtbf_s, 400_001)
    return float(grid[np.argmin(np.expm1((grid + write_s) / mtbf_s) / grid)])


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.99])
def test_daly_close_to_exact_optimum_where_young_is_not(ratio):
    """Почему предупреждает только Янг: при C/M ≥ 0.1 он завышает I* на ≥ 16 %, Дейли — < 2 %."""
    mtbf_s = 3600.0
    exact = _exact_optimum(ratio * mtbf_s, mtbf_s)
    assert abs(ci.daly_interval(ratio * mtbf_s, mtbf_s) / exact - 1) < 0.02
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ci.young_interval(ratio * mtbf_s, mtbf_s) / exact - 1 > 0.16


def test_overhead_minimum_at_young_interval():
    c, m = 50.0, 10_000.0
    i_star = ci.young_interval(c, m)
    h_star = ci.checkpoint_overhead(i_star, c, m)
    assert h_star == pytest.approx(0.1) and h_star == pytest.approx(math.sqrt(2 * c / m))
    assert ci.checkpoint_overhead(100, c, m) == pytest.approx(0.5 + 0.005)  # C/I + I/(2M)
    grid = [i_star * 10 ** (k / 200) for k in range(-400, 401)]
    values = [ci.checkpoint_overhead(i, c, m) for i in grid]
    assert grid[values.index(min(values))] == pytest.approx(i_star)
    assert ci.checkpoint_overhead(i_star * 1.01, c, m) > h_star
    assert ci.checkpoint_overhead(i_star / 1.01, c, m) > h_star


def _simulated_wall_per_work(interval_s, write_s, mtbf_s, segments=200_000, seed=0):
    """Монте-Карло модели Дейли без перезапуска: отрезок I + C повторяют, пока между отказами
    (экспоненциальные интервалы со средним M) не уложится целиком; возвращает стену / работу."""
    rng = np.random.default_rng(seed)
    need = interval_s + write_s
    wall = np.zeros(segments)
    todo = np.ones(segments, dtype=bool)
    while todo.any():
        failure = rng.exponential(mtbf_s, size=int(todo.sum()))
        done = failure >= need
        wall[todo] += np.where(done, need, failure)  # до отказа — потерянное время, иначе отрезок
        idx = np.flatnonzero(todo)
        todo[idx[done]] = False
    return wall.mean() / interval_s


@pytest.mark.parametrize("interval_s, write_s, mtbf_s", [(3600, 300, 6 * 3600), (600, 60, 1800)])
def test_daly_overhead_matches_simulation_of_exponential_failures(interval_s, write_s, mtbf_s):
    simulated = _simulated_wall_per_work(interval_s, write_s, mtbf_s) - 1
    assert ci.daly_overhead(interval_s, write_s, mtbf_s) == pytest.approx(simulated, rel=0.01)


def test_daly_overhead_first_order_and_minimum():
    c, m = 50.0, 1e6  # C ≪ I ≪ M: совпадает с C/I + I/(2M)
    for i in (1e3, 1e4):
        assert ci.daly_overhead(i, c, m) == pytest.approx(ci.checkpoint_overhead(i, c, m), rel=0.02)
    c, m = 600.0, 6 * 3600.0  # C/M ≈ 0.03: минимум точной модели — у daly_interval, не у Янга
    grid = np.geomspace(0.2, 5, 20_001) * ci.young_interval(c, m)
    best = grid[np.argmin([ci.daly_overhead(i, c, m) for i in grid])]
    assert ci.daly_interval(c, m) == pytest.approx(best, rel=0.005)
    assert abs(ci.young_interval(c, m) / best - 1) > 0.04
    with pytest.raises(ValueError, match="interval_s"):
        ci.daly_overhead(0, c, m)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_interval_functions_reject_bad_input(bad):
    with pytest.raises(ValueError, match="write_s"):
        ci.young_interval(bad, 100.0)
    with pytest.raises(ValueError, match="mtbf_s"):
        ci.young_interval(10.0, bad)
    with pytest.raises(ValueError, match="interval_s"):
        ci.checkpoint_overhead(bad, 10.0, 100.0)
    with pytest.raises(ValueError, match="write_s"):
        ci.daly_interval(bad, 100.0)


def test_plot_overhead(tmp_path):
    ax = ci.plot_overhead(300, 24 * 3600, current_interval_s=4 * 3600)
    assert ax.get_xscale() == "log" and "интервал" in ax.get_xlabel()
    labels = [line.get_label() for line in ax.get_lines()]
    assert any("I* = √(2CM) = 2 ч" in lab for lab in labels)
    assert any("ваш интервал 4 ч" in lab for lab in labels)
    # Поправка Дейли рядом с Янгом: 116.69 мин = 1.94 ч (Daly 2006, рис. 3), на кривой его модели
    daly = next(line for line in ax.get_lines() if line.get_label().startswith("Дейли: I = 1.94 ч"))
    assert daly.get_xdata()[0] == pytest.approx(ci.daly_interval(300, 24 * 3600) / 3600)
    assert daly.get_ydata()[0] == pytest.approx(100 * ci.daly_overhead(116.6898 * 60, 300, 86400))
    assert any(lab.startswith("модель Дейли") for lab in labels)
    ax.figure.canvas.draw()  # легенда справа от осей, но внутри фигуры
    box = ax.get_legend().get_window_extent().transformed(ax.figure.transFigure.inverted())
    assert box.x0 >= ax.get_position().x1 and 0 <= box.x0 and box.x1 <= 1 and box.y0 >= 0
    ax.figure.savefig(tmp_path / "overhead.png")
    assert (tmp_path / "overhead.png").stat().st_size > 0
    with pytest.raises(ValueError, match="current_interval_s"):
        ci.plot_overhead(300, 3600, current_interval_s=-1)
