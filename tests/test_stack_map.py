"""Тесты карты стеков: файл из data/, проверки загрузчика, фильтр и рисунок."""

import datetime as dt
import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from csv_rows import read_rows, write_rows  # noqa: E402
from stack_map_rules import ASYNC_VARIANTS, StackMapError, check_stack_map  # noqa: E402

from course_utils import stack_map as sm  # noqa: E402

EXPECTED_STACKS = ["TRL", "verl", "OpenRLHF", "NeMo RL", "PRIME-RL", "SkyRL", "AReaL"]


@pytest.fixture(scope="module")
def frame():
    return sm.load_stack_map()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _names(df):
    return list(df["stack"])  # не df.stack: это метод DataFrame


# --- файл из data/ ------------------------------------------------------------


def test_shipped_file_loads_with_exact_columns(frame):
    assert tuple(frame.columns) == sm.STACK_MAP_COLUMNS
    assert sm.DEFAULT_PATH.name == "stack_map.csv"
    assert sm.DEFAULT_PATH.parent.name == "data"
    assert sm.PLACEMENTS == ("colocated", "disaggregated")
    assert sm.SYNCHRONY == ("sync", "async")  # два режима шага 12.1.3 лекции
    assert ASYNC_VARIANTS == ("one_step_off", "queue")
    check_stack_map()  # файл из data/ соблюдает все соглашения data/SOURCES.md


def test_seven_expected_stacks(frame):
    assert _names(frame) == EXPECTED_STACKS


def test_every_row_has_date_and_evidence(frame):
    for _, row in frame.iterrows():
        assert isinstance(row["snapshot_date"], dt.date), row["stack"]
        assert dt.date(2026, 1, 1) <= row["snapshot_date"] <= dt.date(2026, 12, 31)
        assert row["evidence"], row["stack"]
        assert all(e.startswith("https://github.com/") for e in row["evidence"]), row["stack"]


def test_snapshot_dates_match_research(frame):
    dates = dict(zip(frame["stack"], (d.isoformat() for d in frame["snapshot_date"])))
    assert dates == {
        "TRL": "2026-07-24",
        "verl": "2026-01-29",
        "OpenRLHF": "2026-08-13",
        "NeMo RL": "2026-08-22",
        "PRIME-RL": "2026-08-21",
        "SkyRL": "2026-08-21",
        "AReaL": "2026-05-21",
    }


def test_list_cells_are_lists(frame):
    for column in sm.LIST_COLUMNS:
        assert all(isinstance(v, list) for v in frame[column]), column
    row = frame.set_index("stack").loc["verl"]
    assert row["synchrony"] == ["sync", "async"]
    assert row["async_variants"] == ["one_step_off", "queue"]
    assert "Megatron" in row["training_backends"]


def test_staleness_keys(frame):
    keys = frame.set_index("stack")[["staleness_control_key", "staleness_default"]]
    assert tuple(keys.loc["AReaL"]) == ("rollout.max_head_offpolicyness", "0")
    assert tuple(keys.loc["PRIME-RL"]) == ("orchestrator.max_off_policy_steps", "8")
    assert tuple(keys.loc["TRL"]) == ("max_staleness", "4")
    assert tuple(keys.loc["verl"]) == ("async_training.staleness_threshold", "unconfirmed")
    assert "staleness_default" in frame.set_index("stack").loc["verl", "unconfirmed"]


def test_unconfirmed_marks_are_declared(frame):
    by_stack = frame.set_index("stack")["unconfirmed"]
    assert by_stack["TRL"] == []
    assert "lora" in by_stack["OpenRLHF"]


def test_prime_rl_has_one_placement(frame):
    # Одно подтверждённое размещение: отдельные наборы GPU для тренера, оркестратора и vLLM
    # (docs/scaling.md, configs/rl.py в снимке 559b447); совместного размещения не найдено.
    row = frame.set_index("stack").loc["PRIME-RL"]
    assert row["placement"] == ["disaggregated"]
    assert row["placement_synchrony"] == ["disaggregated:async"]
    assert row["unconfirmed"] == []
    cells = sm._stack_cells(frame)
    assert set(cells.loc[cells["stack"] == "PRIME-RL", "placement"]) == {"disaggregated"}


def test_async_variants_keep_one_step_off_inside_async(frame):
    by_stack = frame.set_index("stack")
    for stack, row in by_stack.iterrows():
        if "async" in row["synchrony"]:
            assert row["async_variants"] and set(row["async_variants"]) <= set(ASYNC_VARIANTS)
        else:
            assert row["async_variants"] == ["n/a"], stack
    assert _names(sm.supports(frame, async_variants="one_step_off")) == ["verl", "NeMo RL", "SkyRL"]
    # «На шаг позади» — асинхронный режим: все три стека есть в столбце «асинхронно».
    assert {"verl", "NeMo RL", "SkyRL"} <= set(_names(sm.supports(frame, synchrony="async")))


def test_vocabulary_shared_with_exercise_12_1_7():
    from course_utils.exercises.lesson_12_1 import loop_profile as ex

    assert ex.SETUP_CLASSES == tuple(f"{p}/{s}" for p in sm.PLACEMENTS for s in sm.SYNCHRONY)
    assert set(ex.SETUPS.values()) == set(ex.SETUP_CLASSES)
    one_step = [cls for text, cls in ex.SETUPS.items() if "k + 1" in text]
    assert one_step == ["disaggregated/async"]  # «на шаг позади» — асинхронно
    task = ex.STEP.make_task(0)
    answer = {**ex.STEP.solve(task)}
    answer["setups"] = {**answer["setups"], "A": "disaggregated/one_step_off"}
    message = ex.STEP.answer.problem(answer, task)
    assert "на шаг позади" in message and "async" in message


def test_snapshot_relation_against_day_counts():
    lecture = dt.date(2026, 8, 6)
    assert sm.LECTURE_SNAPSHOT == lecture and sm.STALE_AFTER_DAYS == 180
    verl = sm._snapshot_relation(dt.date(2026, 1, 29))
    assert (lecture - dt.date(2026, 1, 29)).days == 189
    assert verl.startswith("за 189\u00a0дней до снимка лекции 2026-08-06") and "старше 180" in verl
    nemo = sm._snapshot_relation(dt.date(2026, 8, 22))
    assert nemo == "на 16\u00a0дней позже снимка лекции 2026-08-06"
    assert (
        sm._snapshot_relation(dt.date(2026, 8, 5)) == "за 1\u00a0день до снимка лекции 2026-08-06"
    )
    assert "3\u00a0дня позже" in sm._snapshot_relation(dt.date(2026, 8, 9))
    assert sm._snapshot_relation(lecture) == "в день снимка лекции 2026-08-06"
    edge = lecture - dt.timedelta(days=180)
    assert "старше" not in sm._snapshot_relation(edge)
    assert "старше" in sm._snapshot_relation(edge - dt.timedelta(days=1))


def test_later_snapshots_are_explained(frame):
    later = frame[frame["snapshot_date"] > sm.LECTURE_SNAPSHOT]
    assert _names(later) == ["OpenRLHF", "NeMo RL", "PRIME-RL", "SkyRL"]
    for _, row in later.iterrows():
        assert "после даты лекции" in row["snapshot_note"], row["stack"]
    shown = sm.display_table(frame, ["stack", "snapshot_date", "snapshot_note"])
    relation = dict(zip(shown["стек"], shown["относительно снимка лекции 2026-08-06"]))
    assert "старше 180" in relation["verl"]
    assert [s for s, text in relation.items() if "старше" in text] == ["verl"]
    assert relation["NeMo RL"].startswith("на 16")


def test_display_table_is_russian(frame):
    shown = sm.display_table(frame)
    assert list(shown.columns[:5]) == [
        "стек",
        "размещение",
        "синхронность",
        "варианты асинхронности",
        "сочетания размещения и синхронности",
    ]
    assert all(
        c in sm.COLUMN_LABELS.values() or c.startswith("относительно") for c in shown.columns
    )
    row = shown.set_index("стек").loc["NeMo RL"]
    assert row["синхронность"] == "синхронно; асинхронно"
    assert (
        row["варианты асинхронности"]
        == "на шаг позади (задержка ровно 1); очередь (задержка до K версий)"
    )
    assert "раздельное × синхронно (не подтверждено)" in row["сочетания размещения и синхронности"]
    assert row["не подтверждено"] == "сочетания размещения и синхронности; движки генерации"
    assert "SGLang (только совместно) (не подтверждено)" in row["движки генерации"]
    codes = {"colocated", "disaggregated", "sync", "async", "one_step_off", "queue"}
    for column in ("размещение", "синхронность", "варианты асинхронности"):
        words = {w for cell in shown[column] for w in cell.replace(";", " ").split()}
        assert not words & codes, column
    assert sm._cell_text("staleness_default", "n/a") == "нет"
    assert sm._cell_text("staleness_default", "unconfirmed") == "не подтверждено"
    assert sm._cell_text("matches", True) == "да"
    for lora in frame["lora"]:
        assert not lora.startswith("yes"), lora  # текст ячеек — по-русски
    with pytest.raises(ValueError, match="load_stack_map"):
        sm.display_table(frame, ["stack", "speedup"])
    with pytest.raises(ValueError, match="frame"):
        sm.display_table([1, 2])


def test_display_table_for_choice_and_speedups(frame):
    choice = sm.display_table(sm.choose_stacks(frame, lora=True, today=dt.date(2026, 9, 1)))
    assert list(choice.columns[:4]) == ["стек", "подходит", "не выполнено", "не подтверждено"]
    assert set(choice["подходит"]) == {"да", "нет"}
    assert choice["возраст снимка, дн."].dtype.kind == "i"
    speed = sm.display_table(sm.load_speedups())
    assert "ускорение до, раз" in speed.columns and speed["ускорение до, раз"].dtype.kind == "f"
    assert set(speed["вид числа"]) <= set(sm.VALUE_LABELS.values())


# --- соглашения файла (проверка тестов) и ошибки загрузчика ----------------------------------------------------------


def _write(path, rows, columns=sm.STACK_MAP_COLUMNS):
    return write_rows(path, rows, columns)


@pytest.fixture
def good_rows():
    return read_rows(sm.DEFAULT_PATH)


def test_roundtrip_of_copied_file(tmp_path, good_rows):
    copy = sm.load_stack_map(_write(tmp_path / "ok.csv", good_rows))
    assert _names(copy) == EXPECTED_STACKS


def test_missing_column_named(tmp_path, good_rows):
    columns = [c for c in sm.STACK_MAP_COLUMNS if c != "lora"]
    path = _write(tmp_path / "m.csv", good_rows, columns)
    with pytest.raises(ValueError, match=r"не хватает столбцов: lora") as err:
        sm.load_stack_map(path)
    assert str(path) in str(err.value)


def test_extra_column_named(tmp_path, good_rows):
    columns = (*sm.STACK_MAP_COLUMNS, "speedup")
    path = _write(tmp_path / "e.csv", good_rows, columns)
    with pytest.raises(ValueError, match=r"лишние столбцы: speedup"):
        sm.load_stack_map(path)


def test_wrong_column_order(tmp_path, good_rows):
    columns = list(sm.STACK_MAP_COLUMNS)
    columns[1], columns[2] = columns[2], columns[1]
    with pytest.raises(ValueError, match=r"порядок столбцов"):
        sm.load_stack_map(_write(tmp_path / "o.csv", good_rows, columns))


@pytest.mark.parametrize(
    ("column", "value", "pattern"),
    [
        ("placement", "colocated|remote", r"«placement».*remote"),
        ("synchrony", "sync|semi_async", r"«synchrony».*semi_async"),
        ("synchrony", "sync|one_step_off|async", r"«synchrony».*one_step_off.*async_variants"),
        ("async_variants", "fully", r"«async_variants».*fully"),
        ("async_variants", "", r"«async_variants».*пустая"),
        ("async_variants", "queue?", r"«async_variants».*«\?»"),
        ("snapshot_note", "", r"«snapshot_note».*пустая"),
        ("lora", "yes (PEFT)", r"«lora».*«да» или «нет»"),
        ("multi_turn", "partial", r"«multi_turn».*«да» или «нет»"),
        ("placement_synchrony", "colocated:sync|disaggregated:later", r"«placement_synchrony»"),
        ("snapshot_date", "2026-02-30", r"«snapshot_date».*2026-02-30"),
        ("snapshot_date", "24.07.2026", r"«snapshot_date».*ГГГГ-ММ-ДД"),
        ("snapshot_date", "", r"«snapshot_date»"),
        ("evidence", "", r"«evidence».*пустая"),
        ("evidence", "https://a||https://b", r"«evidence».*пустой элемент"),
        ("unconfirmed", "lora|speedup", r"«unconfirmed».*speedup"),
        ("staleness_default", "unconfirmed", r"«unconfirmed».*«staleness_default»"),
        ("generation_engines", "vLLM|SGLang?", r"«unconfirmed».*«generation_engines»"),
        ("placement", "colocated?", r"«placement».*«\?»"),
        ("weight_sync", "", r"«weight_sync».*пустая"),
    ],
)
def test_bad_cell_names_file_stack_and_column(tmp_path, good_rows, column, value, pattern):
    good_rows[0][column] = value
    path = _write(tmp_path / "bad.csv", good_rows)
    with pytest.raises(ValueError, match=pattern) as err:
        check_stack_map(path)
    message = str(err.value)
    assert str(path) in message
    assert "«TRL»" in message
    assert isinstance(err.value, StackMapError)


def test_pairs_must_cover_declared_axes(tmp_path, good_rows):
    good_rows[0]["placement_synchrony"] = "colocated:sync|disaggregated:sync"  # нет async
    with pytest.raises(ValueError, match=r"«placement_synchrony».*async"):
        check_stack_map(_write(tmp_path / "p.csv", good_rows))


def test_confirmed_pair_needs_declared_axis(tmp_path, good_rows):
    good_rows[0]["synchrony"] = "sync"  # но disaggregated:async подтверждено
    with pytest.raises(ValueError, match=r"«synchrony».*async"):
        check_stack_map(_write(tmp_path / "q.csv", good_rows))


def test_duplicate_stack(tmp_path, good_rows):
    good_rows[3]["stack"] = "TRL"
    with pytest.raises(ValueError, match=r"«stack».*«TRL» повторяется"):
        check_stack_map(_write(tmp_path / "d.csv", good_rows))


def test_empty_stack(tmp_path, good_rows):
    good_rows[2]["stack"] = " "
    with pytest.raises(ValueError, match=r"строка 4, столбец «stack»"):
        check_stack_map(_write(tmp_path / "s.csv", good_rows))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="не найден"):
        sm.load_stack_map(tmp_path / "nope.csv")


def test_na_is_kept_as_text(tmp_path, good_rows):
    good_rows[0]["staleness_control_key"] = "n/a"
    good_rows[0]["staleness_default"] = "n/a"
    loaded = sm.load_stack_map(_write(tmp_path / "na.csv", good_rows))
    assert loaded.loc[0, "staleness_default"] == "n/a"


# --- supports -------------------------------------------------------------------


def test_disaggregated_does_not_imply_async(frame):
    # Шаг 12.1.3: отдельный сервер генерации не делает цикл асинхронным.
    # По исследованию: TRL (vllm_mode=server + GRPOTrainer), OpenRLHF (без colocate_all),
    # AReaL (separation + max_head_offpolicyness=0 по умолчанию), verl (staleness_threshold=0).
    found = _names(sm.supports(frame, placement="disaggregated", synchrony="sync"))
    assert {"TRL", "OpenRLHF", "AReaL"} <= set(found)
    assert "PRIME-RL" not in found  # всегда хотя бы на шаг внахлёст


def test_pairs_not_cartesian_product(frame):
    # У TRL есть и colocated, и async, но асинхронный тренер требует отдельных GPU.
    trl = frame[frame["stack"] == "TRL"]
    assert "colocated" in trl.iloc[0]["placement"] and "async" in trl.iloc[0]["synchrony"]
    assert _names(sm.supports(trl, "colocated", "async")) == []
    assert _names(sm.supports(frame, "colocated", "async")) == ["NeMo RL"]


def test_unconfirmed_not_counted(frame):
    strict = set(_names(sm.supports(frame, "disaggregated", "sync")))
    assert not strict & {"NeMo RL", "SkyRL"}  # у них это сочетание с «?»
    assert "NeMo RL" not in _names(sm.supports(frame, generation_engines="sglang"))
    assert "NeMo RL" in _names(sm.supports(frame, generation_engines="vllm"))
    assert "OpenRLHF" not in _names(sm.supports(frame, lora="флаги"))  # ячейка не подтверждена


def test_single_axis_and_column_filters(frame):
    assert _names(sm.supports(frame)) == EXPECTED_STACKS
    with pytest.raises(ValueError, match=r"one_step_off.*async_variants"):
        sm.supports(frame, synchrony="one_step_off")
    assert _names(sm.supports(frame, placement=["colocated", "disaggregated"])) == [
        "TRL",
        "verl",
        "OpenRLHF",
        "NeMo RL",
        "SkyRL",
        "AReaL",
    ]
    megatron_lora = sm.supports(frame, training_backends="megatron", lora="да")
    assert _names(megatron_lora) == ["verl", "NeMo RL", "SkyRL", "AReaL"]
    assert _names(sm.supports(frame, training_backends=["megatron", "fsdp2"])) == [
        "verl",
        "NeMo RL",
        "SkyRL",
        "AReaL",
    ]
    assert _names(sm.supports(frame, generation_engines="vllm", multi_turn="да")) == (
        EXPECTED_STACKS
    )


def test_supports_rejects_bad_arguments(frame):
    with pytest.raises(ValueError, match="placement.*remote"):
        sm.supports(frame, placement="remote")
    with pytest.raises(ValueError, match="synchrony"):
        sm.supports(frame, synchrony="semi")
    with pytest.raises(ValueError, match="speedup"):
        sm.supports(frame, speedup="2x")
    with pytest.raises(ValueError, match="lora"):
        sm.supports(frame, lora="")
    with pytest.raises(ValueError, match="load_stack_map"):
        sm.supports(pd.DataFrame({"stack": ["x"]}), placement="colocated")


def test_stack_cells(frame):
    cells = sm._stack_cells(frame)
    assert set(cells.columns) == {"stack", "placement", "synchrony", "confirmed"}
    areal = cells[cells["stack"] == "AReaL"]
    assert set(zip(areal["placement"], areal["synchrony"], areal["confirmed"])) == {
        ("disaggregated", "sync", True),
        ("disaggregated", "async", True),
        ("colocated", "sync", False),
    }


# --- рисунок --------------------------------------------------------------------


def _overlaps(texts):
    fig = texts[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    return [
        (a.get_text(), b.get_text())
        for (a, ba), (b, bb) in itertools.combinations(zip(texts, boxes), 2)
        if ba.overlaps(bb)
    ]


def test_plot_returns_axes_with_all_names(frame):
    ax = sm.plot_stack_map(frame)
    assert isinstance(ax, matplotlib.axes.Axes)
    texts = {t.get_text().rstrip("?") for t in ax.texts}
    assert set(EXPECTED_STACKS) <= texts
    assert "AReaL?" in {t.get_text() for t in ax.texts}  # неподтверждённая клетка
    assert "PRIME-RL?" not in {t.get_text() for t in ax.texts}
    title = ax.get_title()
    assert "2026-01-29" in title and "2026-08-22" in title and "лекции 2026-08-06" in title
    assert ax.get_xlabel().startswith("синхронность")
    assert ax.get_ylabel().startswith("размещение")
    ticks = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
    assert ticks == ["синхронно", "асинхронно"]  # два режима, а не три
    labels = " ".join(t.get_text() for t in ax.get_yticklabels())
    assert "совместное" in labels and "раздельное" in labels
    footnote = next(t.get_text() for t in ax.texts if t.get_text().startswith("Даты снимков"))
    assert "verl 2026-01-29 (старше 180 дн.)" in footnote
    assert "NeMo RL 2026-08-22 (позже лекции)" in footnote
    assert "TRL 2026-07-24   " in footnote
    assert _overlaps([t for t in ax.texts if t.get_text().rstrip("?") in EXPECTED_STACKS]) == []


def test_plot_full_cells_do_not_overlap(frame):
    # Худший случай: все семь стеков в каждой из четырёх клеток.
    full = frame.copy()
    every = [f"{p}:{s}" for p in sm.PLACEMENTS for s in sm.SYNCHRONY]
    full["placement_synchrony"] = [every] * len(full)
    fig, ax = plt.subplots(figsize=(8, 5))
    assert sm.plot_stack_map(full, ax=ax) is ax
    names = [t for t in ax.texts if t.get_text() in EXPECTED_STACKS]
    assert len(names) == 7 * len(sm.PLACEMENTS) * len(sm.SYNCHRONY) == 7 * 4
    assert _overlaps(names) == []
    renderer = fig.canvas.get_renderer()
    frame_box = ax.get_window_extent(renderer)
    fig_box = fig.bbox
    for text in names:
        box = text.get_window_extent(renderer)
        assert frame_box.x0 <= box.x0 and box.x1 <= frame_box.x1, text.get_text()
        assert frame_box.y0 <= box.y0 and box.y1 <= frame_box.y1, text.get_text()
    title = ax.title.get_window_extent(renderer)
    assert fig_box.x0 <= title.x0 and title.x1 <= fig_box.x1


def test_plot_saves_png(frame, tmp_path):
    ax = sm.plot_stack_map(frame)
    out = tmp_path / "stack_map.png"
    ax.figure.savefig(out, dpi=80)
    assert out.stat().st_size > 10_000


def test_single_axis_uses_axis_columns(frame):
    # Совместное размещение AReaL подтверждено, а его синхронность — нет.
    assert "AReaL" in _names(sm.supports(frame, placement="colocated"))
    assert "AReaL" not in _names(sm.supports(frame, "colocated", "sync"))
    assert "PRIME-RL" not in _names(sm.supports(frame, placement="colocated"))
