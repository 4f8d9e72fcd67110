"""Тесты контракта роллаута: правила проверки, устойчивость к мусору, точные round-trip."""

import copy
import hashlib
import json
import math
import os
import random
import shutil
import struct
import subprocess

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from course_utils import contract
from course_utils.contract import (
    REQUIRED_FIELDS,
    RULES,
    RolloutRecord,
    example_multiturn_record,
    example_record,
    read_jsonl,
    read_parquet,
    records_to_frame,
    validate_rollout,
    violated_rules,
    write_jsonl,
    write_parquet,
)

NAN = float("nan")
RULE_KEYS = [
    "missing_field",
    "field_type",
    "mask_values",
    "mask_length",
    "mask_prompt",
    "logprob_count",
    "logprob_finite",
    "logprob_positive",
    "policy_version",
    "mixed_versions",
    "token_versions_length",
    "decoding",
    "reward",
    "stop_reason",
    "verifier_version",
]


def example_dict():
    return example_record().to_dict()


def with_changes(**changes):
    d = example_dict()
    d.update(changes)
    return d


def without(name):
    d = example_dict()
    del d[name]
    return d


# ---------- схема и примеры ----------


def test_rule_keys_are_the_public_api():
    assert list(RULES) == RULE_KEYS
    assert all(isinstance(v, str) and v for v in RULES.values())
    assert REQUIRED_FIELDS == (
        "sample_id",
        "policy_version",
        "prompt_tokens",
        "response_tokens",
        "policy_mask",
        "behavior_logprobs",
        "decoding",
        "reward",
        "stop_reason",
        "verifier_version",
    )


def test_field_order_and_lecture_example():
    names = [f.name for f in contract.dataclasses.fields(RolloutRecord)]
    assert names == list(REQUIRED_FIELDS) + [
        "trace_id",
        "prompt_id",
        "group_id",
        "token_policy_versions",
    ]
    d = example_dict()
    lecture = {
        "sample_id": "run42-p008-g03",
        "policy_version": 127,
        "prompt_tokens": [101, 42, 17],
        "response_tokens": [314, 159, 2],
        "policy_mask": [0, 0, 0, 1, 1, 1],
        "behavior_logprobs": [-0.31, -1.07, -0.22],
        "decoding": {"temperature": 0.8, "top_p": 1.0},
        "reward": {"correctness": 1.0, "format": 0.0},
        "stop_reason": "eos",
        "verifier_version": "arith-v4",
    }
    assert {k: d[k] for k in REQUIRED_FIELDS} == lecture
    assert d["token_policy_versions"] is None
    json.dumps(d)  # обычный JSON-совместимый словарь


@pytest.mark.parametrize("make", [example_record, example_multiturn_record])
def test_examples_are_valid(make):
    assert validate_rollout(make()) == []
    assert validate_rollout(make().to_dict()) == []


def test_multiturn_masks_environment_tokens():
    r = example_multiturn_record()
    resp = r.policy_mask[len(r.prompt_tokens) :]  # маска на позициях ответа
    assert len(resp) == len(r.response_tokens)
    # политика пишет в начале и в конце ответа, посередине — наблюдение инструмента
    assert resp[0] == 1 and resp[-1] == 1 and 0 in resp
    first_zero = resp.index(0)
    last_zero = len(resp) - 1 - resp[::-1].index(0)
    assert all(m == 0 for m in resp[first_zero : last_zero + 1])
    assert r.num_policy_tokens == len(r.behavior_logprobs) == sum(resp)
    # ошибка «токены среды не замаскированы» ловится проверкой
    bad = r.to_dict()
    bad["policy_mask"] = [0] * len(r.prompt_tokens) + [1] * len(r.response_tokens)
    assert "logprob_count" in violated_rules(bad)


def test_num_policy_tokens():
    r = example_record()
    assert r.num_policy_tokens == 3
    r.policy_mask = "junk"
    with pytest.raises(ValueError, match="policy_mask"):
        _ = r.num_policy_tokens


# ---------- по одному нарушению на каждое правило ----------

BROKEN = [
    ("missing_field", without("verifier_version")),
    ("missing_field", without("policy_mask")),
    ("field_type", with_changes(response_tokens=[314, 159, -2])),
    ("field_type", with_changes(prompt_tokens=[101, "42", 17])),
    ("field_type", with_changes(sample_id=5)),
    ("field_type", with_changes(behavior_logprobs=[-0.31, "-1.07", -0.22])),
    ("field_type", with_changes(trace_id=None)),
    ("mask_values", with_changes(policy_mask=[0, 0, 0, 1, 2, 1])),
    ("mask_values", with_changes(policy_mask=[0, 0, 0, 1, True, 1])),
    ("mask_length", with_changes(policy_mask=[0, 0, 0, 1, 1, 1, 0])),
    ("mask_prompt", with_changes(policy_mask=[0, 1, 0, 1, 1, 0])),
    ("logprob_count", with_changes(behavior_logprobs=[-0.31, -1.07])),
    ("logprob_finite", with_changes(behavior_logprobs=[-0.31, NAN, -0.22])),
    ("logprob_finite", with_changes(behavior_logprobs=[-0.31, -math.inf, -0.22])),
    ("logprob_positive", with_changes(behavior_logprobs=[-0.31, 0.5, -0.22])),
    ("policy_version", with_changes(policy_version=-1)),
    ("policy_version", with_changes(policy_version=True)),
    ("policy_version", with_changes(policy_version="127")),
    ("policy_version", with_changes(policy_version=None)),
    ("policy_version", with_changes(token_policy_versions=[126, 126, 126])),
    ("mixed_versions", with_changes(token_policy_versions=[127, 127, 128])),
    ("token_versions_length", with_changes(token_policy_versions=[127, 127])),
    ("token_versions_length", with_changes(policy_version=None, token_policy_versions=[1, -1, 2])),
    ("decoding", with_changes(decoding={"temperature": 0.0, "top_p": 1.0})),
    ("decoding", with_changes(decoding={"temperature": 0.8, "top_p": 1.5})),
    ("decoding", with_changes(decoding={"temperature": 0.8})),
    ("decoding", with_changes(decoding="greedy")),
    ("reward", with_changes(reward={})),
    ("reward", with_changes(reward={"correctness": NAN})),
    ("reward", with_changes(reward=1.0)),
    ("stop_reason", with_changes(stop_reason="")),
    ("stop_reason", with_changes(stop_reason=None)),
    ("verifier_version", with_changes(verifier_version="")),
    ("verifier_version", with_changes(verifier_version=4)),
]


def test_every_rule_has_a_breaking_case():
    assert {key for key, _ in BROKEN} == set(RULES)


@pytest.mark.parametrize(
    ("key", "record"), BROKEN, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BROKEN)]
)
def test_single_rule_violation(key, record):
    before = copy.deepcopy(record)
    messages = validate_rollout(record)
    assert violated_rules(record) == [key]
    assert messages and all(m.startswith(f"[{key}] ") for m in messages)
    assert repr(record) == repr(before)  # проверка не меняет запись
    assert validate_rollout(example_dict()) == []


def test_mask_prompt_message_names_position():
    (msg,) = validate_rollout(with_changes(policy_mask=[0, 0, 1, 1, 1, 0]))
    assert msg.startswith("[mask_prompt] маска политики равна 1 на позиции 2 запроса")


def test_missing_field_message_names_field():
    (msg,) = validate_rollout(without("reward"))
    assert "reward" in msg


# ---------- версии политики ----------


def test_mixed_versions_single_label_rejected():
    rec = with_changes(token_policy_versions=[127, 128, 128])
    msgs = validate_rollout(rec)
    assert violated_rules(rec) == ["mixed_versions"]
    assert "12.1.4" in msgs[0] and "127" in msgs[0] and "128" in msgs[0]


def test_mixed_versions_accepted_with_none_and_per_token_versions():
    assert (
        validate_rollout(with_changes(policy_version=None, token_policy_versions=[127, 128, 128]))
        == []
    )


@pytest.mark.parametrize("pv", [None, 127])
def test_equal_per_token_versions_agree_with_label(pv):
    assert validate_rollout(with_changes(policy_version=pv, token_policy_versions=[127] * 3)) == []


def test_per_token_versions_wrong_length_with_mixed_label():
    rec = with_changes(token_policy_versions=[127, 128])
    assert violated_rules(rec) == ["token_versions_length", "mixed_versions"]


def test_zero_policy_tokens_is_allowed():
    rec = with_changes(policy_mask=[0] * 6, behavior_logprobs=[])
    assert validate_rollout(rec) == []


# ---------- проверка никогда не падает ----------

JUNK_VALUES = [
    None,
    5,
    -1,
    1.5,
    NAN,
    True,
    "строка",
    b"bytes",
    [None],
    [["x"]],
    [NAN, "a", {}],
    {"k": [object()]},
    {1: None},
    object(),
    (1, 2),
]
FIELDS = list(REQUIRED_FIELDS) + ["trace_id", "prompt_id", "group_id", "token_policy_versions"]


class Weird:
    def __eq__(self, other):
        raise RuntimeError("сравнение запрещено")

    __hash__ = object.__hash__


@pytest.mark.parametrize(
    "record",
    [None, 5, NAN, "запись", b"x", [], [1, 2], (), {}, {"a": 1}, object(), example_record]
    + [{k: None for k in REQUIRED_FIELDS}, {k: "abc" for k in REQUIRED_FIELDS}]
    + [with_changes(policy_mask=[Weird()] * 6), with_changes(prompt_tokens=[Weird()] * 3)]
    + [with_changes(decoding={"temperature": NAN, "top_p": NAN}), with_changes(reward={1: 1.0})],
)
def test_validate_never_raises_on_garbage(record):
    msgs = validate_rollout(record)
    assert isinstance(msgs, list) and msgs
    for m in msgs:
        assert isinstance(m, str) and m[1 : m.index("]")] in RULES


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("junk", JUNK_VALUES, ids=range(len(JUNK_VALUES)))
def test_validate_never_raises_on_junk_field(field, junk):
    msgs = validate_rollout(with_changes(**{field: junk}))
    assert isinstance(msgs, list)
    assert all(m[1 : m.index("]")] in RULES for m in msgs)
    assert set(violated_rules(with_changes(**{field: junk}))) <= set(RULES)


def test_non_record_argument_gives_one_field_type_message():
    assert violated_rules(42) == ["field_type"]
    assert len(validate_rollout(42)) == 1


# ---------- from_dict ----------


def test_from_dict_roundtrip_and_errors():
    r = example_multiturn_record()
    assert RolloutRecord.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="нет обязательных полей: .*reward"):
        RolloutRecord.from_dict(without("reward"))
    with pytest.raises(ValueError, match="неизвестные поля: 'logprobs'"):
        RolloutRecord.from_dict(with_changes(logprobs=[]))
    with pytest.raises(ValueError, match="словарь"):
        RolloutRecord.from_dict([1, 2])
    minimal = {k: example_dict()[k] for k in REQUIRED_FIELDS}
    assert RolloutRecord.from_dict(minimal).trace_id == ""


# ---------- сериализация: точные round-trip ----------

EXTREME = [
    -1e-300,
    -123.456789012345678,
    -5e-324,
    -0.0,
    0.0,
    -1.7976931348623157e308,
    -2.2250738585072014e-308,
    -0.1 - 0.2,
]


def random_record(rng: random.Random, i: int) -> RolloutRecord:
    prompt = [rng.randrange(2**40) for _ in range(rng.randint(0, 8))]
    response = [rng.randrange(2**40) for _ in range(rng.randint(0, 12))]
    resp_mask = [rng.choice([0, 1, 1]) for _ in response]
    n = sum(resp_mask)
    logprobs = [rng.choice(EXTREME + [-rng.expovariate(0.5)] * 4) for _ in range(n)]
    kind = rng.randrange(3)
    pv, tpv = rng.randrange(1000), None
    if kind == 1 and n >= 2:
        tpv = [pv] * (n - 1) + [pv + 1]
        pv = None
    elif kind == 2:
        tpv = [pv] * n
    decoding = {"temperature": rng.uniform(0.05, 2.0), "top_p": rng.choice([1.0, rng.random()])}
    if rng.random() < 0.5:
        decoding.update(top_k=rng.randint(1, 100), stop=["</s>", "\n\n"], banned=[])
    return RolloutRecord(
        sample_id=f"запуск-{i:03d}",
        policy_version=pv,
        prompt_tokens=prompt,
        response_tokens=response,
        policy_mask=[0] * len(prompt) + resp_mask,
        behavior_logprobs=logprobs,
        decoding=decoding,
        reward={"correctness": rng.choice([0.0, 1.0]), "длина": -rng.random() * 1e-5, "n": 3},
        stop_reason=rng.choice(["eos", "length", "tool_call"]),
        verifier_version=f"arith-v{rng.randint(1, 9)}",
        trace_id=f"t{rng.getrandbits(64):016x}",
        prompt_id=f"p{i // 4}",
        group_id=f"g{i // 4}" if rng.random() < 0.9 else "",
        token_policy_versions=tpv,
    )


def assert_exact(a, b, where="record"):
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_exact(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_exact(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def with_token_versions():
    r = example_record()
    r.policy_version = None
    r.token_policy_versions = [127, 127, 128]
    return r


def roundtrip_sets():
    rng = random.Random(12)
    return {
        "example": [example_record()],
        "multiturn": [example_multiturn_record()],
        "token_versions": [with_token_versions()],
        "random50": [random_record(rng, i) for i in range(50)],
        "empty": [],
    }


FORMATS = {"jsonl": (write_jsonl, read_jsonl), "parquet": (write_parquet, read_parquet)}


def _pair(path):
    """Имена файла данных и его суммы SHA-256 (по алфавиту, как sorted(os.listdir))."""
    return [path.name, path.name + ".sha256"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(roundtrip_sets()))
def test_roundtrip_exact(tmp_path, fmt, name):
    records = roundtrip_sets()[name]
    if name == "random50":
        assert all(validate_rollout(r) == [] for r in records)
    write, read = FORMATS[fmt]
    path = tmp_path / f"rollouts.{fmt}"
    write(records, path)
    back = read(path)
    assert len(back) == len(records)
    for i, (a, b) in enumerate(zip(records, back)):
        assert isinstance(b, RolloutRecord)
        assert_exact(a.to_dict(), b.to_dict(), f"{name}[{i}]")
    assert sorted(os.listdir(tmp_path)) == _pair(path)


def test_random_records_cover_extremes_and_versions():
    records = roundtrip_sets()["random50"]
    values = {struct.pack("<d", x) for r in records for x in r.behavior_logprobs}
    assert struct.pack("<d", -1e-300) in values
    assert struct.pack("<d", -123.456789012345678) in values
    assert any(r.policy_version is None for r in records)
    assert any(r.token_policy_versions and r.policy_version is not None for r in records)


@pytest.mark.parametrize("fmt", FORMATS)
def test_writers_accept_dicts_and_keep_broken_records(tmp_path, fmt):
    write, read = FORMATS[fmt]
    broken = [
        with_changes(policy_mask=[0, 1, 0, 1, 1, 0]),
        with_changes(behavior_logprobs=[-0.31, NAN, 0.5], policy_version=None),
        with_changes(decoding=None, reward={}, stop_reason="", prompt_tokens=None),
    ]
    path = tmp_path / f"broken.{fmt}"
    write(broken, str(path))
    back = read(str(path))
    assert [violated_rules(b) for b in back] == [violated_rules(d) for d in broken]
    assert math.isnan(back[1].behavior_logprobs[1])


def test_parquet_schema_types(tmp_path):
    path = tmp_path / "r.parquet"
    write_parquet([example_record()], path)
    schema = pq.read_schema(path)
    assert schema.field("prompt_tokens").type == pa.list_(pa.int64())
    assert schema.field("behavior_logprobs").type == pa.list_(pa.float64())
    assert schema.field("policy_mask").type in (pa.list_(pa.int8()), pa.list_(pa.int64()))
    assert schema.field("policy_version").type == pa.int64()
    assert schema.field("policy_version").nullable


@pytest.mark.parametrize(
    "bad", [with_changes(prompt_tokens=[101, 1.5, 17]), with_changes(policy_version="127")]
)
def test_parquet_refuses_values_that_do_not_fit_schema(tmp_path, bad):
    with pytest.raises(ValueError, match="prompt_tokens|policy_version"):
        write_parquet([bad], tmp_path / "r.parquet")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("records", "path", "match"),
    [
        ([], "", "path"),
        ([], None, "path"),
        (example_record(), "x", "records"),
        ("abc", "x", "records"),
        ([example_record(), 5], "x", r"records\[1\]"),
        ([without("reward")], "x", r"records\[0\].*reward"),
    ],
)
def test_writers_check_arguments(tmp_path, fmt, records, path, match):
    write, _ = FORMATS[fmt]
    target = path if not path else str(tmp_path / path)
    with pytest.raises(ValueError, match=match):
        write(records, target)


# ---------- атомарность ----------


def _old_file(tmp_path, fmt):
    write, read = FORMATS[fmt]
    path = tmp_path / f"data.{fmt}"
    write([example_record()], path)
    return path, path.read_bytes()


def _boom(*args, **kwargs):
    raise OSError("сбой диска (имитация)")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("target", ["fsync", "replace"])
def test_crash_before_commit_keeps_old_file(tmp_path, monkeypatch, fmt, target):
    path, old = _old_file(tmp_path, fmt)
    write, read = FORMATS[fmt]
    monkeypatch.setattr(contract.os, target, _boom)
    with pytest.raises(OSError, match="имитация"):
        write([example_multiturn_record()] * 3, path)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == _pair(path)
    assert read(path) == [example_record()]


def test_jsonl_crash_mid_write_keeps_old_file(tmp_path, monkeypatch):
    path, old = _old_file(tmp_path, "jsonl")
    seen = {}
    real_dumps = json.dumps

    def dumps_then_crash(obj, *args, **kwargs):
        seen["n"] = seen.get("n", 0) + 1
        if seen["n"] == 3:  # две строки уже ушли во временный файл
            temps = [p for p in os.listdir(tmp_path) if p not in _pair(path)]
            seen["temp"] = temps
            raise KeyboardInterrupt
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(contract.json, "dumps", dumps_then_crash)
    with pytest.raises(KeyboardInterrupt):
        write_jsonl([example_multiturn_record()] * 5, path)
    monkeypatch.undo()
    assert len(seen["temp"]) == 1  # временный файл был в том же каталоге
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == _pair(path)


def test_jsonl_unserializable_record_keeps_old_file(tmp_path):
    path, old = _old_file(tmp_path, "jsonl")
    records = [example_record(), example_record(), with_changes(reward={"x": object()})]
    with pytest.raises(ValueError, match=r"records\[2\]"):
        write_jsonl(records, path)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == _pair(path)


def test_parquet_crash_mid_write_keeps_old_file(tmp_path, monkeypatch):
    path, old = _old_file(tmp_path, "parquet")

    def partial_write(table, where, **kwargs):
        where.write(b"PAR1" + b"\0" * 100)
        raise RuntimeError("процесс убит посреди записи")

    monkeypatch.setattr(contract.pq, "write_table", partial_write)
    with pytest.raises(RuntimeError, match="посреди"):
        write_parquet([example_multiturn_record()], path)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == _pair(path)
    assert read_parquet(path) == [example_record()]


# ---------- ошибки чтения ----------


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(example_dict())
    path.write_text(good + "\n" + good[:-10] + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl, строка 2"):
        read_jsonl(path)
    path.write_text(good + "\n\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"строка 3: ожидается объект"):
        read_jsonl(path)
    path.write_text(json.dumps(without("reward")) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"строка 1: .*reward"):
        read_jsonl(path)
    path.write_bytes(good.encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"строка 2"):
        read_jsonl(path)


def test_read_parquet_corrupt_file(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(ValueError, match=r"bad\.parquet"):
        read_parquet(path)
    write_parquet([example_record()] * 3, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"bad\.parquet"):
        read_parquet(path)
    with pytest.raises(ValueError, match=r"nope\.parquet: файл не найден"):
        read_parquet(tmp_path / "nope.parquet")


def test_read_parquet_bad_rows_and_columns(tmp_path):
    path = tmp_path / "rows.parquet"
    write_parquet([example_record()] * 2, path)
    table = pq.read_table(path)
    rewards = pa.array(['{"correctness": 1.0}', "{broken"], type=pa.string())
    (tmp_path / "rows.parquet.sha256").unlink()  # дальше файл пишет чужая программа, без суммы
    pq.write_table(
        table.set_column(table.schema.get_field_index("reward"), "reward", rewards), path
    )
    with pytest.raises(ValueError, match=r"rows\.parquet, строка 1 \(нумерация с 0\)"):
        read_parquet(path)
    pq.write_table(table.drop_columns(["policy_mask"]), path)
    with pytest.raises(ValueError, match=r"rows\.parquet: .*policy_mask"):
        read_parquet(path)


# ---------- таблица для ноутбуков ----------


def test_records_to_frame():
    broken = with_changes(prompt_tokens="junk", policy_mask=None)
    df = records_to_frame([example_record(), example_multiturn_record(), broken])
    assert list(df.columns) == FIELDS + ["n_prompt", "n_response", "n_policy_tokens"]
    assert len(df) == 3
    assert df.loc[0, "n_policy_tokens"] == 3 and df.loc[1, "n_policy_tokens"] == 6
    assert df.loc[1, "n_response"] == len(example_multiturn_record().response_tokens)
    assert df.loc[0, "policy_version"] == 127
    assert df.loc[0, "reward"] == {"correctness": 1.0, "format": 0.0}
    assert records_to_frame([]).shape == (0, len(FIELDS) + 3)


def test_records_to_frame_keeps_integers_with_gaps_integer():
    # Версия 164 и пропуск: pandas сделал бы столбец float (164.0); печатаем целые как целые.
    df = records_to_frame([with_changes(policy_version=164), with_changes(policy_version=None)])
    assert str(df["policy_version"].dtype) == "Int64"
    assert df["policy_version"].tolist()[0] == 164 and pd.isna(df["policy_version"].tolist()[1])
    assert "164.0" not in df.to_string() and "164" in df.to_string()
    # Мусор в столбце (строка) остаётся как есть: тип столбца не навязывается.
    mixed = records_to_frame([with_changes(policy_version="v1"), with_changes(policy_version=2)])
    assert mixed["policy_version"].tolist() == ["v1", 2]


# ---------- ошибки пути и вложенности ----------


@pytest.mark.parametrize("fmt", FORMATS)
def test_readers_refuse_bad_paths_in_russian(tmp_path, fmt):
    _, read = FORMATS[fmt]
    with pytest.raises(ValueError, match="path должно быть путём"):
        read(None)
    with pytest.raises(ValueError, match=rf"nope\.{fmt}: файл не найден"):
        read(tmp_path / f"nope.{fmt}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_writers_refuse_deeply_nested_values(tmp_path, fmt):
    write, _ = FORMATS[fmt]
    deep: dict = {}
    for _ in range(100_000):
        deep = {"x": deep}
    with pytest.raises(ValueError, match="reward|records\\[0\\]"):
        write([with_changes(reward=deep)], tmp_path / f"r.{fmt}")
    assert os.listdir(tmp_path) == []


# ---------- контрольная сумма SHA-256 рядом с файлом ----------


@pytest.mark.parametrize("fmt", FORMATS)
def test_writers_add_sha256sum_sidecar(tmp_path, fmt):
    write, _ = FORMATS[fmt]
    path = tmp_path / f"r.{fmt}"
    write([example_record(), example_multiturn_record()], path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    side = tmp_path / f"r.{fmt}.sha256"
    assert side.read_bytes() == f"{digest}  r.{fmt}\n".encode()
    if shutil.which("sha256sum"):  # независимая проверка: та же утилита, что у людей
        res = subprocess.run(
            ["sha256sum", "-c", side.name], cwd=tmp_path, capture_output=True, text=True
        )
        assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr


def _flip_positions(n_bytes, step):
    """Номера битов: каждый step-й (step нечётен — попадаем во все 8 разрядов) и все биты
    первых и последних 16 байт (магия PAR1, длина метаданных Parquet)."""
    edges = [b * 8 + k for b in [*range(16), *range(n_bytes - 16, n_bytes)] for k in range(8)]
    return sorted(set(range(0, n_bytes * 8, step)) | set(edges))


@pytest.mark.parametrize(("fmt", "step"), [("jsonl", 7), ("parquet", 37)])
def test_every_single_bit_flip_is_refused(tmp_path, fmt, step):
    write, read = FORMATS[fmt]
    path = tmp_path / f"r.{fmt}"
    records = [example_record(), example_multiturn_record()]
    write(records, path)
    original = path.read_bytes()
    positions = _flip_positions(len(original), step)
    assert len(positions) > 1000
    accepted = []
    for bit in positions:
        data = bytearray(original)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        try:
            read(path)
        except ValueError as exc:
            assert "SHA-256" in str(exc) and path.name in str(exc)
        else:
            accepted.append(bit)
    assert accepted == []
    path.write_bytes(original)
    assert read(path) == records


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_or_missing_sidecar(tmp_path, fmt):
    write, read = FORMATS[fmt]
    path = tmp_path / f"r.{fmt}"
    write([example_record()], path)
    side = tmp_path / f"r.{fmt}.sha256"
    line = side.read_bytes()
    for bit in [8 * i + k for i in range(64) for k in (0, 2, 6)]:  # по 3 бита каждой цифры
        damaged = bytearray(line)
        damaged[bit // 8] ^= 1 << (bit % 8)
        if bytes(damaged).lower() == line.lower():
            continue  # 'a' ↔ 'A': та же сумма, sha256sum -c тоже примет
        side.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=r"SHA-256|контрольной суммы повреждён"):
            read(path)
    side.write_bytes(b"")
    with pytest.raises(ValueError, match=r"r\..*\.sha256: файл контрольной суммы повреждён"):
        read(path)
    side.unlink()  # без суммы файл читается как раньше (например, записанный чужой программой)
    assert read(path) == [example_record()]


@pytest.mark.parametrize("fmt", FORMATS)
def test_failed_sidecar_replace_leaves_new_data_readable(tmp_path, monkeypatch, fmt):
    path, _ = _old_file(tmp_path, fmt)
    write, read = FORMATS[fmt]
    real_replace = os.replace
    calls = []

    def replace_data_then_fail(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("сбой диска (имитация)")
        return real_replace(src, dst)

    monkeypatch.setattr(contract.os, "replace", replace_data_then_fail)
    with pytest.raises(OSError, match="имитация"):
        write([example_multiturn_record()], path)
    monkeypatch.undo()
    assert [os.fspath(c) for c in calls] == [os.fspath(path), os.fspath(path) + ".sha256"]
    # старая сумма к новым данным не подходит и удалена; временных файлов не осталось
    assert os.listdir(tmp_path) == [path.name]
    assert read(path) == [example_multiturn_record()]
