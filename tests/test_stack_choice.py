"""Тесты выбора стеков по требованиям (choose_stacks) и таблицы опубликованных ускорений.

Ожидаемые ответы — факты из кода и документации стеков на коммитах, перечисленных в
data/SOURCES.md (по ним собраны data/stack_map.csv и data/stack_speedups.csv).
"""

import datetime as dt

import pandas as pd
import pytest
from csv_rows import read_rows, write_rows
from stack_map_rules import AUTHORS_CLAIM, SPEEDUP_KINDS, SpeedupsError, check_speedups

from course_utils import stack_map as sm

TODAY = dt.date(2026, 9, 1)
ALL = ["TRL", "verl", "OpenRLHF", "NeMo RL", "PRIME-RL", "SkyRL", "AReaL"]


@pytest.fixture(scope="module")
def frame():
    return sm.load_stack_map()


def _choose(frame, **kwargs):
    return sm.choose_stacks(frame, today=TODAY, **kwargs)


def _matching(result):
    return list(result.loc[result["matches"], "stack"])


def _row(result, stack):
    return result.set_index("stack").loc[stack]


# --- форма результата -----------------------------------------------------------


def test_one_row_per_stack_with_dates_and_age(frame):
    result = _choose(frame)
    assert tuple(result.columns) == sm.CHOICE_COLUMNS
    assert list(result["stack"]) == ALL
    assert result["matches"].all()  # без требований подходят все
    ages = dict(zip(result["stack"], result["age_days"]))
    # Возраст считается от переданной даты, а не от сегодняшней.
    assert ages["verl"] == (TODAY - dt.date(2026, 1, 29)).days == 215
    assert ages["NeMo RL"] == 10
    assert ages["AReaL"] == 103
    assert all(isinstance(d, dt.date) for d in result["snapshot_date"])
    assert result.attrs["today"] == TODAY


def test_default_loads_shipped_map_and_uses_today():
    result = sm.choose_stacks(lora=True)
    assert list(result["stack"]) == ALL
    assert result.attrs["today"] == dt.date.today()
    assert (result["age_days"] >= 0).all()


def test_age_for_another_date(frame):
    later = sm.choose_stacks(frame.iloc[:1], today=dt.date(2027, 7, 24))
    assert later.loc[0, "age_days"] == 365
    as_datetime = sm.choose_stacks(frame.iloc[:1], today=dt.datetime(2026, 7, 25, 12, 0))
    assert as_datetime.loc[0, "age_days"] == 1


# --- требования против фактов исследования ---------------------------------------


def test_lora_async_lag_bound(frame):
    # LoRA + асинхронность + ключ ограничения устаревания.
    # TRL: LoRA есть только у синхронного GRPOTrainer (у AsyncGRPO путь не найден);
    # OpenRLHF: путь LoRA в vLLM во время RL не подтверждён.
    strict = _choose(frame, lora=True, asynchronous=True, lag_bound=True)
    assert _matching(strict) == ["verl", "NeMo RL", "PRIME-RL", "SkyRL", "AReaL"]
    trl = _row(strict, "TRL")
    assert any(f.startswith("lora+asynchronous:") for f in trl["failed"])
    assert any("AsyncGRPOTrainer" in u for u in trl["unconfirmed"])
    # У verl и SkyRL ключ есть, но его значение по умолчанию не подтверждено: это оговорка.
    for stack in ("verl", "SkyRL"):
        row = _row(strict, stack)
        assert row["matches"] and row["failed"] == []
        assert any("значение ключа по умолчанию" in u for u in row["unconfirmed"]), stack
    assert _row(strict, "AReaL")["unconfirmed"] == []


def test_unconfirmed_reported_when_included(frame):
    loose = _choose(frame, lora=True, asynchronous=True, lag_bound=True, include_unconfirmed=True)
    assert _matching(loose) == ALL
    openrlhf = _row(loose, "OpenRLHF")
    assert openrlhf["failed"] == []
    assert len(openrlhf["unconfirmed"]) == 1 and openrlhf["unconfirmed"][0].startswith("lora:")
    assert loose.attrs["include_unconfirmed"] is True
    strict = _row(_choose(frame, lora=True), "OpenRLHF")
    assert not strict["matches"]
    assert "include_unconfirmed=True" in strict["failed"][0]
    assert strict["unconfirmed"][0].startswith("lora:")
    assert "include_unconfirmed" not in strict["unconfirmed"][0]


def test_many_nodes(frame):
    # Опубликованные многоузловые запуски: verl (128 H20), NeMo RL (512 H100).
    strict = _choose(frame, nodes="many")
    assert _matching(strict) == ["verl", "NeMo RL"]
    loose = _choose(frame, nodes="many", include_unconfirmed=True)
    assert _matching(loose) == ALL
    prime = _row(loose, "PRIME-RL")["unconfirmed"]
    assert any("28 узлах" in u for u in prime)
    assert any("вывод курса" in u for u in _row(loose, "SkyRL")["unconfirmed"])
    assert _matching(_choose(frame, nodes="one")) == ALL


def test_synchrony_requirement(frame):
    sync = _choose(frame, asynchronous=False)
    assert _matching(sync) == [s for s in ALL if s != "PRIME-RL"]  # PRIME-RL всегда внахлёст
    assert "нет режима «синхронно»; есть: «асинхронно»" in _row(sync, "PRIME-RL")["failed"][0]
    assert _matching(_choose(frame, asynchronous=True)) == ALL


def test_backend_and_engine_substrings(frame):
    assert _matching(_choose(frame, training_backend="megatron")) == [
        "verl",
        "NeMo RL",
        "SkyRL",
        "AReaL",
    ]
    assert _matching(_choose(frame, training_backend="DeepSpeed")) == ["TRL", "OpenRLHF"]
    sglang = _choose(frame, generation_engine="SGLang")
    assert _matching(sglang) == ["verl", "AReaL"]  # SkyRL убрал SGLang 2026-02-26
    nemo = _row(sglang, "NeMo RL")
    assert any("SGLang (только совместно)?" in u for u in nemo["unconfirmed"])
    loose = _choose(frame, generation_engine="SGLang", include_unconfirmed=True)
    assert _matching(loose) == ["verl", "NeMo RL", "AReaL"]
    assert "нет движка генерации «SGLang»" in _row(sglang, "SkyRL")["failed"][0]


def test_combination_limits(frame):
    # Асинхронный тренер TRL — только FSDP2, значит асинхронность + DeepSpeed — только OpenRLHF.
    result = _choose(frame, asynchronous=True, training_backend="DeepSpeed")
    assert _matching(result) == ["OpenRLHF"]
    assert any("только FSDP2" in f for f in _row(result, "TRL")["failed"])
    assert "TRL" in _matching(_choose(frame, asynchronous=True, training_backend="FSDP2"))
    # Полностью асинхронный рецепт verl требует vLLM или SGLang.
    trt = _choose(frame, asynchronous=True, generation_engine="TensorRT")
    assert _matching(trt) == []
    assert any("AgentLoop" in f for f in _row(trt, "verl")["failed"])
    assert _matching(_choose(frame, generation_engine="TensorRT")) == ["verl"]
    # AReaL: LoRA на Megatron — только с vLLM; для Archon LoRA нет.
    megatron_sglang = _choose(
        frame,
        lora=True,
        training_backend="Megatron",
        generation_engine="SGLang",
        include_unconfirmed=True,
    )
    assert any("только с vLLM" in f for f in _row(megatron_sglang, "AReaL")["failed"])
    assert _matching(megatron_sglang) == ["verl", "NeMo RL"]
    assert any("sglang support" in u for u in _row(megatron_sglang, "verl")["unconfirmed"])
    archon = _choose(frame, lora=True, training_backend="Archon")
    assert _matching(archon) == []
    assert "AReaL" in _matching(_choose(frame, lora=True, training_backend="FSDP2"))
    for limit in sm.STACK_LIMITS:
        assert limit.kind in ("fails", "unconfirmed")
        assert limit.stack in ALL


def test_limit_not_repeated_when_base_requirement_fails(frame):
    result = _row(_choose(frame, asynchronous=True, training_backend="Megatron"), "TRL")
    assert len(result["failed"]) == 1 and result["failed"][0].startswith("training_backend:")


def test_multi_turn_and_max_age(frame):
    assert _matching(_choose(frame, multi_turn=True)) == ALL
    fresh = _choose(frame, max_age_days=30)
    assert _matching(fresh) == ["OpenRLHF", "NeMo RL", "PRIME-RL", "SkyRL"]
    assert "215 дн." in _row(fresh, "verl")["failed"][0]


def test_custom_frame_marks(frame):
    # Стек без ключа устаревания и с неподтверждённой многоходовостью.
    custom = frame.iloc[[0]].copy()
    custom.at[custom.index[0], "staleness_control_key"] = "n/a"
    custom.at[custom.index[0], "unconfirmed"] = ["multi_turn"]
    result = _choose(custom, lag_bound=True, multi_turn=True)
    failed = result.loc[0, "failed"]
    assert any(f.startswith("lag_bound:") and "n/a" in f for f in failed)
    assert any(f.startswith("multi_turn:") for f in failed)


# --- плохие аргументы ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"nodes": "two"}, r"nodes"),
        ({"nodes": 2}, r"nodes"),
        ({"lora": "yes"}, r"lora: ожидается True, False или None"),
        ({"multi_turn": 1}, r"multi_turn"),
        ({"asynchronous": "async"}, r"asynchronous"),
        ({"lag_bound": 0}, r"lag_bound"),
        ({"training_backend": ""}, r"training_backend"),
        ({"generation_engine": 3}, r"generation_engine"),
        ({"include_unconfirmed": None}, r"include_unconfirmed"),
        ({"max_age_days": -1}, r"max_age_days"),
        ({"max_age_days": True}, r"max_age_days"),
        ({"today": "2026-09-01"}, r"today"),
        ({"today": dt.date(2026, 1, 1)}, r"today.*раньше даты снимка"),
    ],
)
def test_bad_arguments(frame, kwargs, pattern):
    kwargs.setdefault("today", TODAY)
    with pytest.raises(ValueError, match=pattern):
        sm.choose_stacks(frame, **kwargs)


def test_bad_frame():
    with pytest.raises(ValueError, match="load_stack_map"):
        sm.choose_stacks(pd.DataFrame({"stack": ["x"]}), today=TODAY)
    with pytest.raises(ValueError, match="frame"):
        sm.choose_stacks([1, 2], today=TODAY)


# --- опубликованные ускорения ----------------------------------------------------


@pytest.fixture(scope="module")
def speedups():
    return sm.load_speedups()


def test_speedups_load_and_are_authors_claims(speedups, frame):
    assert tuple(speedups.columns) == sm.SPEEDUP_COLUMNS
    check_speedups()  # файл из data/ соблюдает соглашения data/SOURCES.md
    assert (speedups["speedup_low"] <= speedups["speedup_high"]).all()
    assert (speedups["speedup_low"] > 0).all()
    assert AUTHORS_CLAIM == "заявление авторов"
    assert (speedups["evidence_class"] == AUTHORS_CLAIM).all()
    assert set(speedups["stack"]) <= set(frame["stack"])
    assert set(speedups["kind"]) <= set(SPEEDUP_KINDS)
    for column in ("claim", "baseline", "setup", "source", "date"):
        assert speedups[column].str.len().gt(0).all(), column
    assert speedups["source"].str.contains("https://").all()


def test_speedups_match_research(speedups):
    def pairs(stack):
        rows = speedups[speedups["stack"] == stack]
        return set(zip(rows["speedup_low"], rows["speedup_high"]))

    areal = speedups[(speedups["stack"] == "AReaL") & (speedups["speedup_high"] == 2.57)].iloc[0]
    assert "arxiv.org/abs/2505.24298v1" in areal["source"] and areal["date"] == "2025-05-30"
    assert not speedups["source"].str.contains("aitopics|chatpaper|catalyzex").any()
    assert (2.35, 2.67) in pairs("verl")  # fully_async, 128 H20
    assert (1.53, 20.57) in pairs("verl")  # HybridFlow
    assert {(2.57, 2.57), (2.77, 2.77)} <= pairs("AReaL")
    assert (1.22, 1.68) in pairs("OpenRLHF")
    assert (0.73, 0.73) in pairs("NeMo RL")  # GB200: асинхронность медленнее
    verl = speedups[(speedups["stack"] == "verl") & (speedups["speedup_high"] == 2.67)].iloc[0]
    assert "128" in verl["setup"] and "colocated" in verl["baseline"]
    assert verl["date"] == "2025-12-25"
    up_to = speedups[speedups["kind"] == "up_to"]
    assert (up_to["speedup_low"] == up_to["speedup_high"]).all()


def _write_speedups(path, rows, columns=sm.SPEEDUP_COLUMNS):
    return write_rows(path, rows, columns)


@pytest.fixture
def speedup_rows():
    return read_rows(sm.SPEEDUPS_PATH)


def test_speedups_roundtrip(tmp_path, speedup_rows):
    loaded = sm.load_speedups(_write_speedups(tmp_path / "ok.csv", speedup_rows))
    assert len(loaded) == len(speedup_rows)


@pytest.mark.parametrize(
    ("column", "value", "pattern"),
    [
        ("speedup_low", "abc", r"«speedup_low».*число"),
        ("speedup_low", "3.0", r"«speedup_low».*больше верхней"),
        ("speedup_high", "-1", r"«speedup_high».*положительным"),
        ("speedup_high", "inf", r"«speedup_high».*положительным"),
        ("evidence_class", "факт", r"«evidence_class».*заявление авторов"),
        ("kind", "about", r"«kind».*about"),
        ("date", "25.12.2025", r"«date».*ГГГГ"),
        ("date", "2025-13", r"«date».*несуществующая"),
        ("source", "", r"«source».*пустая"),
        ("baseline", " ", r"«baseline».*пустая"),
    ],
)
def test_speedups_bad_cells(tmp_path, speedup_rows, column, value, pattern):
    speedup_rows[0][column] = value
    path = _write_speedups(tmp_path / "bad.csv", speedup_rows)
    with pytest.raises(ValueError, match=pattern) as err:
        check_speedups(path)
    assert str(path) in str(err.value) and "строка 2" in str(err.value)
    assert isinstance(err.value, SpeedupsError)


def test_speedups_kind_needs_equal_bounds(tmp_path, speedup_rows):
    row = next(r for r in speedup_rows if r["kind"] == "range")
    row["kind"] = "up_to"
    with pytest.raises(ValueError, match=r"«kind».*совпадать"):
        check_speedups(_write_speedups(tmp_path / "k.csv", speedup_rows))


def test_speedups_columns_and_file(tmp_path, speedup_rows):
    columns = [c for c in sm.SPEEDUP_COLUMNS if c != "baseline"]
    with pytest.raises(ValueError, match=r"не хватает столбцов: baseline"):
        sm.load_speedups(_write_speedups(tmp_path / "m.csv", speedup_rows, columns))
    columns = list(sm.SPEEDUP_COLUMNS)
    columns[0], columns[1] = columns[1], columns[0]
    with pytest.raises(ValueError, match=r"порядок столбцов"):
        sm.load_speedups(_write_speedups(tmp_path / "o.csv", speedup_rows, columns))
    with pytest.raises(ValueError, match=r"нет ни одной строки"):
        sm.load_speedups(_write_speedups(tmp_path / "e.csv", []))
    with pytest.raises(FileNotFoundError, match="не найден"):
        sm.load_speedups(tmp_path / "nope.csv")
