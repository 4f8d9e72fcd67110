"""Тесты реестра источников модуля 12 (data/module_12_sources.csv), его соглашений и загрузчика."""

import datetime as dt
import re

import pytest
from csv_rows import read_rows, write_rows

from course_utils import sources as src
from course_utils.csv_tables import read_exact_csv

EVIDENCE_CLASSES = tuple(src.EVIDENCE_LABELS)


class SourcesError(ValueError):
    """Нарушено соглашение реестра: сообщение называет файл, строку и столбец."""


def check_sources(path=src.DEFAULT_PATH):
    """Соглашения реестра: непустые ячейки, уникальный claim_id из [a-z0-9._-], шаг 12.x.y,
    класс из EVIDENCE_CLASSES, дата ISO ГГГГ-ММ-ДД; нарушение — SourcesError."""
    seen = {}
    for line, cells in read_exact_csv(path, src.SOURCES_COLUMNS, "реестр", SourcesError):
        where = f"{path}: строка {line} (утверждение «{cells['claim_id']}»)"

        def fail(column, message, where=where):
            return SourcesError(f"{where}, столбец «{column}»: {message}")

        for column in src.SOURCES_COLUMNS:
            if not cells[column]:
                raise fail(column, "пустая ячейка")
        claim_id, step, date = cells["claim_id"], cells["lesson_step"], cells["date_checked"]
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", claim_id):
            raise fail(
                "claim_id", f"ожидаются строчные латинские буквы, цифры, «-_.»: {claim_id!r}"
            )
        if claim_id in seen:
            raise fail("claim_id", f"«{claim_id}» повторяется (уже был в строке {seen[claim_id]})")
        seen[claim_id] = line
        if not re.fullmatch(r"12\.[1-5]\.([1-9]|1[0-3])", step):
            raise fail("lesson_step", f"ожидается шаг вида 12.<1–5>.<1–13>, получено {step!r}")
        if cells["evidence_class"] not in EVIDENCE_CLASSES:
            raise fail("evidence_class", f"недопустимое значение {cells['evidence_class']!r}")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            raise fail("date_checked", f"ожидается дата ISO ГГГГ-ММ-ДД, получено {date!r}")
        try:
            dt.date.fromisoformat(date)
        except ValueError:
            raise fail("date_checked", f"несуществующая дата {date!r}") from None


@pytest.fixture(scope="module")
def frame():
    return src.load_sources()


def test_shipped_registry_loads(frame):
    assert tuple(frame.columns) == src.SOURCES_COLUMNS
    check_sources()  # файл из data/ соблюдает соглашения реестра
    assert src.DEFAULT_PATH.name == "module_12_sources.csv"
    assert frame["claim_id"].is_unique
    assert len(frame) >= 40


def test_every_row_has_date_source_and_boundary(frame):
    for _, row in frame.iterrows():
        cid = row["claim_id"]
        assert isinstance(row["date_checked"], dt.date), cid
        # Даты — от самого старого снимка (verl) до сегодняшнего дня: сверка не бывает в будущем.
        assert dt.date(2026, 1, 29) <= row["date_checked"] <= dt.date.today(), cid
        # адрес есть или это вывод курса; ни одна строка не ссылается на непубличные заметки
        assert "http" in row["source"] or row["evidence_class"] == "derived", cid
        assert "заметк" not in row["source"] + row["boundary"], cid
        assert len(row["boundary"]) > 20, cid
        assert len(row["claim"]) > 20, cid
        assert row["evidence_class"] in EVIDENCE_CLASSES, cid


def test_every_lesson_has_sources(frame):
    for lesson in ("12.1", "12.2", "12.3", "12.4", "12.5"):
        assert len(src.sources_for_step(frame, lesson)) >= 1, lesson


def test_lecture_sources_are_present(frame):
    # Список «Источники и дальнейшее чтение» лекции.
    text = " ".join(frame["source"])
    for needle in (
        "ZeRO: Memory Optimizations",
        "PagedAttention",
        "SGLang: Efficient Execution",
        "HybridFlow",
        "AReaL: A Large-Scale Asynchronous",
        "Training–Inference Mismatch",
        "A First Order Approximation to the Optimum Checkpoint Interval",
        "Daly",
        "docs/source/async_grpo_trainer.md",  # TRL: Asynchronous GRPO
        "docs/algo/rollout_corr.md",  # verl: rollout correction
        "docs/guides/async-grpo.md",  # NeMo RL: Async GRPO
        "OpenRLHF",
        "weight_transfer.py",  # передача весов vLLM по NCCL
    ):
        assert needle in text, needle


def test_steps_from_lecture(frame):
    by_id = frame.set_index("claim_id")
    assert by_id.loc["zero-stages", "lesson_step"] == "12.2.2"
    assert by_id.loc["young-interval", "lesson_step"] == "12.5.1"
    assert by_id.loc["verl-fully-async-speedup", "evidence_class"] == "authors_claim"
    assert "2,35–2,67" in by_id.loc["verl-fully-async-speedup", "claim"]
    assert "2,57" in by_id.loc["areal-speedup", "claim"]


def test_tim_paper_and_areal_cite_arxiv(frame):
    by_id = frame.set_index("claim_id")
    tim = by_id.loc["tim-paper", "source"]
    assert "Zhong T." in tim and "Yu X." in tim  # первый и последний из восьми авторов
    assert "https://arxiv.org/abs/2605.14220" in tim
    areal = by_id.loc["areal-speedup", "source"]
    assert "https://arxiv.org/abs/2505.24298v1" in areal and "aitopics" not in areal
    for cid in ("tim-paper", "areal-speedup"):
        assert by_id.loc[cid, "date_checked"] == dt.date(2026, 12, 1), cid


def test_authors_claims_carry_speedups_boundary(frame):
    claims = frame[frame["evidence_class"] == "authors_claim"]
    assert len(claims) >= 5
    for _, row in claims.iterrows():
        assert (
            "авторов" in row["boundary"]
            or "сопровождающ" in row["boundary"]
            or ("Отчёт" in row["boundary"])
        ), row["claim_id"]


def test_sources_for_step(frame):
    step = src.sources_for_step(frame, "12.2.2")
    assert list(step["claim_id"]) == ["zero-stages"]
    lesson = src.sources_for_step(frame, "12.2")
    assert set(lesson["lesson_step"]) <= {f"12.2.{k}" for k in range(1, 6)}
    assert "zero-stages" in set(lesson["claim_id"])
    assert src.sources_for_step(frame, "12.1.2").empty  # у шага нет внешних источников
    assert list(lesson.index) == list(range(len(lesson)))


@pytest.mark.parametrize("step", ["12", "12.6", "12.2.0", "13.1.1", "12.2.", 12.2, None])
def test_sources_for_step_rejects_bad_step(frame, step):
    with pytest.raises(ValueError, match="step"):
        src.sources_for_step(frame, step)


def test_sources_for_step_rejects_bad_frame():
    import pandas as pd

    with pytest.raises(ValueError, match="load_sources"):
        src.sources_for_step(pd.DataFrame({"claim_id": ["a"]}), "12.1")


# --- соглашения файла (проверка тестов) и ошибки загрузчика ----------------------------------------------------------


def _write(path, rows, columns=src.SOURCES_COLUMNS):
    return write_rows(path, rows, columns)


@pytest.fixture
def good_rows():
    return read_rows(src.DEFAULT_PATH)


def test_roundtrip(tmp_path, good_rows):
    assert len(src.load_sources(_write(tmp_path / "ok.csv", good_rows))) == len(good_rows)


@pytest.mark.parametrize(
    ("column", "value", "pattern"),
    [
        ("evidence_class", "blog", r"«evidence_class».*blog"),
        ("evidence_class", "Paper", r"«evidence_class»"),
        ("date_checked", "2026-02-30", r"«date_checked».*несуществующая"),
        ("date_checked", "22.08.2026", r"«date_checked».*ГГГГ-ММ-ДД"),
        ("date_checked", "", r"«date_checked».*пустая"),
        ("source", "", r"«source».*пустая"),
        ("boundary", "  ", r"«boundary».*пустая"),
        ("claim", "", r"«claim».*пустая"),
        ("lesson_step", "12.6.1", r"«lesson_step».*12\.6\.1"),
        ("lesson_step", "2.2", r"«lesson_step»"),
        ("claim_id", "Zero Stages", r"«claim_id».*Zero Stages"),
    ],
)
def test_bad_cells(tmp_path, good_rows, column, value, pattern):
    good_rows[0][column] = value
    path = _write(tmp_path / "bad.csv", good_rows)
    with pytest.raises(ValueError, match=pattern) as err:
        check_sources(path)
    assert str(path) in str(err.value) and "строка 2" in str(err.value)
    assert isinstance(err.value, SourcesError)


def test_duplicate_claim_id(tmp_path, good_rows):
    good_rows[5]["claim_id"] = good_rows[1]["claim_id"]
    with pytest.raises(ValueError, match=r"строка 7.*«claim_id».*повторяется.*строке 3"):
        check_sources(_write(tmp_path / "d.csv", good_rows))


def test_columns_checked(tmp_path, good_rows):
    columns = [c for c in src.SOURCES_COLUMNS if c != "boundary"]
    with pytest.raises(ValueError, match=r"не хватает столбцов: boundary"):
        src.load_sources(_write(tmp_path / "m.csv", good_rows, columns))
    extra = (*src.SOURCES_COLUMNS, "note")
    with pytest.raises(ValueError, match=r"лишние столбцы: note"):
        src.load_sources(_write(tmp_path / "x.csv", good_rows, extra))
    order = list(src.SOURCES_COLUMNS)
    order[0], order[1] = order[1], order[0]
    with pytest.raises(ValueError, match=r"порядок столбцов"):
        src.load_sources(_write(tmp_path / "o.csv", good_rows, order))
    with pytest.raises(ValueError, match=r"нет ни одной строки"):
        src.load_sources(_write(tmp_path / "e.csv", []))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="не найден"):
        src.load_sources(tmp_path / "nope.csv")


def test_evidence_labels_cover_classes():
    assert set(src.EVIDENCE_LABELS) == set(EVIDENCE_CLASSES)
    assert src.EVIDENCE_LABELS["authors_claim"] == "заявление авторов"
