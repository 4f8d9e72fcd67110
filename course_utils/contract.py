"""Контракт роллаута (лекция, шаг 12.1.2): запись, её проверка и сериализация.

Запись — событие с явной схемой: версия политики, токены запроса и ответа, маска политики,
логарифмы вероятностей, декодирование, награда, причина остановки, версия верификатора.
``validate_rollout`` — список нарушений с ключом правила из ``RULES``; JSONL и Parquet хранят
поля без потерь, рядом с файлом — его SHA-256 (``<файл>.sha256``, формат sha256sum).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from course_utils import atomic, fmt
from course_utils.args import is_int, is_number, is_real, path as check_path

RULES = {
    "missing_field": "в записи нет обязательного поля",
    "field_type": "поле имеет неверный тип (токены — списки неотрицательных целых и т. п.)",
    "mask_values": "маска политики содержит значения, отличные от 0 и 1",
    "mask_length": "длина маски не равна len(prompt_tokens) + len(response_tokens)",
    "mask_prompt": "маска равна 1 на токене запроса: запрос политика не выбирала",
    "logprob_count": "число логарифмов вероятностей не равно числу токенов политики (маска = 1)",
    "logprob_finite": "логарифм вероятности не конечен (NaN или ±inf)",
    "logprob_positive": "логарифм вероятности больше 0, то есть вероятность больше 1",
    "policy_version": "версия политики не задана или не является неотрицательным целым",
    "mixed_versions": "одна метка версии на ответ, чьи токены выбраны разными версиями политики",
    "token_versions_length": "поточечные версии: не по одной неотрицательной целой на токен политики",
    "decoding": "декодирование: нужен словарь с temperature > 0 и top_p из (0, 1]",
    "reward": "награда: нужен непустой словарь конечных чисел",
    "stop_reason": "причина остановки должна быть непустой строкой",
    "verifier_version": "версия верификатора должна быть непустой строкой",
}


@dataclass
class RolloutRecord:
    """Запись одного роллаута: поля шага 12.1.2 плюс идентификаторы трассировки."""

    sample_id: str
    policy_version: int | None
    prompt_tokens: list[int]
    response_tokens: list[int]
    policy_mask: list[int]
    behavior_logprobs: list[float]
    decoding: dict
    reward: dict[str, float]
    stop_reason: str
    verifier_version: str
    trace_id: str = ""
    prompt_id: str = ""
    group_id: str = ""
    token_policy_versions: list[int] | None = None

    def to_dict(self) -> dict:
        """Обычный словарь (копия) со всеми полями в порядке схемы; пригоден для JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> RolloutRecord:
        """Запись из словаря (содержимое не проверяется); ValueError называет лишние и нехватку."""
        if not isinstance(d, Mapping):
            raise ValueError(f"from_dict ожидает словарь, получено {type(d).__name__}")
        problems = {
            "нет обязательных полей": _missing(d),
            "неизвестные поля": [repr(k) for k in d if k not in _FIELDS],
        }
        if any(problems.values()):
            parts = [f"{what}: " + ", ".join(keys) for what, keys in problems.items() if keys]
            raise ValueError("Запись роллаута: " + "; ".join(parts))
        return cls(**d)

    @property
    def num_tokens(self) -> int:
        """Токенов в записи: len(prompt_tokens) + len(response_tokens)."""
        return len(self.prompt_tokens) + len(self.response_tokens)

    @property
    def num_policy_tokens(self) -> int:
        """Число токенов, выбранных политикой: Σ policy_mask (позиций, равных 1)."""
        count = _count_ones(self.policy_mask)
        if count is None:
            raise ValueError("policy_mask должна быть списком, чтобы посчитать токены политики")
        return count


_FIELDS = [f.name for f in dataclasses.fields(RolloutRecord)]
REQUIRED_FIELDS = tuple(
    f.name for f in dataclasses.fields(RolloutRecord) if f.default is dataclasses.MISSING
)


def _missing(d: Mapping) -> list[str]:
    return [k for k in REQUIRED_FIELDS if k not in d]


def _is_nonneg_int(x) -> bool:
    return is_int(x) and x >= 0


def _count_ones(mask) -> int | None:
    if not isinstance(mask, list | tuple):
        return None
    return sum(1 for m in mask if is_int(m) and m == 1)


_LOGPROB_MESSAGES = {
    "field_type": "behavior_logprobs: не числа на позициях {}",
    "logprob_finite": "NaN или ±inf на позициях {}",
    "logprob_positive": "логарифм вероятности > 0 на позициях {}: вероятность не может превышать 1",
}


def validate_rollout(record) -> list[str]:
    """Нарушения контракта роллаута (по-русски, с ключом из ``RULES``); пустой список — пригодна.

    Не бросает исключений на плохом содержимом. Ответ без токенов политики допустим; если все
    поточечные версии равны v, а policy_version — другое целое, нарушено ``policy_version``.
    """
    try:
        return _validate(record)
    except Exception as exc:  # страховка: проверка не должна падать ни на каком мусоре
        return [f"[field_type] запись не удалось разобрать: {type(exc).__name__}: {exc}"]


def _list_field(rec, k: str, out: list[str], expected: str) -> list | None:
    """Поле-список k; None, если поля нет или это не список (тогда в out — [field_type])."""
    if k in rec and not isinstance(rec[k], list):
        out.append(f"[field_type] {k} {expected}, получено {fmt.short(rec[k])}")
    return rec[k] if k in rec and isinstance(rec[k], list) else None


def _validate(record) -> list[str]:
    if isinstance(record, RolloutRecord):
        rec = {k: getattr(record, k) for k in _FIELDS}
    elif isinstance(record, Mapping):
        rec = record
    else:
        return [f"[field_type] ожидается словарь или RolloutRecord, получено {fmt.short(record)}"]
    out = [f"[missing_field] в записи нет обязательного поля {k!r}" for k in _missing(rec)]
    for k in ("sample_id", "trace_id", "prompt_id", "group_id"):
        value, required = rec.get(k, ""), k == "sample_id" and k in rec
        if not isinstance(value, str) or (required and not value.strip()):
            what = "непустой строкой" if k == "sample_id" else "строкой"
            out.append(f"[field_type] {k} должен быть {what}, получено {fmt.short(value)}")

    lengths = {}
    for k in ("prompt_tokens", "response_tokens"):
        if (toks := _list_field(rec, k, out, "должен быть списком целых")) is not None:
            lengths[k] = len(toks)
            bad = [i for i, t in enumerate(toks) if not _is_nonneg_int(t)]
            if bad:
                out.append(
                    f"[field_type] {k}: не неотрицательные целые на позициях {fmt.listing(bad)}"
                )

    n_policy = None
    mask = _list_field(rec, "policy_mask", out, "должна быть списком из 0 и 1")
    if mask is not None:
        bad = [i for i, m in enumerate(mask) if not (is_int(m) and m in (0, 1))]
        if bad:
            out.append(f"[mask_values] маска политики не 0/1 на позициях {fmt.listing(bad)}")
        else:
            n_policy = _count_ones(mask)
        if len(lengths) == 2 and len(mask) != sum(lengths.values()):
            out.append(
                f"[mask_length] длина маски {len(mask)}, а запрос + ответ = "
                f"{lengths['prompt_tokens']} + {lengths['response_tokens']}"
            )
        ones = [i for i, m in enumerate(mask[: lengths.get("prompt_tokens", 0)]) if m == 1]
        if ones:
            out.append(
                f"[mask_prompt] маска политики равна 1 на позиции {fmt.listing(ones)} запроса: "
                "токены запроса не выбирались политикой"
            )

    lps = _list_field(rec, "behavior_logprobs", out, "должен быть списком чисел")
    if lps is not None:
        if n_policy is not None and n_policy != len(lps):
            out.append(
                f"[logprob_count] токенов политики (маска = 1): {n_policy}, "
                f"а логарифмов вероятностей: {len(lps)}"
            )
        bad_by_rule = {  # log π должен лежать в (−∞, 0]
            "field_type": [i for i, x in enumerate(lps) if not is_number(x)],
            "logprob_finite": [i for i, x in enumerate(lps) if is_number(x) and not is_real(x)],
            "logprob_positive": [i for i, x in enumerate(lps) if is_real(x) and x > 0],
        }
        for key, bad in bad_by_rule.items():
            if bad:
                out.append(f"[{key}] " + _LOGPROB_MESSAGES[key].format(fmt.listing(bad)))

    if "policy_version" in rec:
        out += _check_versions(
            rec.get("policy_version"), rec.get("token_policy_versions"), n_policy
        )
    out += _check_dicts(rec)
    for k in ("stop_reason", "verifier_version"):
        if k in rec and not (isinstance(rec[k], str) and rec[k].strip()):
            out.append(f"[{k}] {k} должен быть непустой строкой, получено {fmt.short(rec[k])}")
    return out


def _check_versions(pv, tpv, n_policy: int | None) -> list[str]:
    out = []
    distinct: list[int] = []
    if tpv is not None and not isinstance(tpv, list):
        out.append(
            f"[field_type] token_policy_versions должен быть списком или None: {fmt.short(tpv)}"
        )
    elif tpv is not None:
        bad = [i for i, v in enumerate(tpv) if not _is_nonneg_int(v)]
        if bad:
            out.append(
                "[token_versions_length] поточечные версии не неотрицательные целые на позициях "
                + fmt.listing(bad)
            )
        if n_policy is not None and len(tpv) != n_policy:
            out.append(
                f"[token_versions_length] поточечных версий {len(tpv)}, "
                f"а токенов политики {n_policy}: нужна одна версия на токен"
            )
        distinct = list(dict.fromkeys(v for v in tpv if _is_nonneg_int(v)))
    if len(distinct) > 1 and pv is not None:
        out.append(
            f"[mixed_versions] версии политики внутри ответа различаются "
            f"({fmt.listing(distinct)}), одна метка policy_version неверна — лекция, шаг "
            "12.1.4; укажите policy_version=None и поточечные версии"
        )
    elif pv is None:
        if not distinct:
            out.append("[policy_version] policy_version = None, а поточечных версий нет")
    elif not _is_nonneg_int(pv):
        out.append(f"[policy_version] ожидается неотрицательное целое, получено {fmt.short(pv)}")
    elif distinct and pv != distinct[0]:
        out.append(
            f"[policy_version] policy_version = {pv}, а все поточечные версии = {distinct[0]}"
        )
    return out


def _check_dicts(rec) -> list[str]:
    out = []
    dec = rec.get("decoding")
    if "decoding" in rec and not isinstance(dec, Mapping):
        out.append(f"[decoding] decoding должен быть словарём, получено {fmt.short(dec)}")
    elif "decoding" in rec:
        t, p = dec.get("temperature"), dec.get("top_p")
        if not (is_real(t) and t > 0):
            out.append(f"[decoding] temperature должна быть конечным числом > 0: {fmt.short(t)}")
        if not (is_number(p) and 0 < p <= 1):
            out.append(f"[decoding] top_p должен лежать в (0, 1]: {fmt.short(p)}")
    rew = rec.get("reward")
    if "reward" in rec and not (isinstance(rew, Mapping) and rew):
        out.append(f"[reward] reward должен быть непустым словарём, получено {fmt.short(rew)}")
    elif "reward" in rec:
        bad = [fmt.short(k) for k, v in rew.items() if not (isinstance(k, str) and is_real(v))]
        if bad:
            out.append(f"[reward] компоненты награды не конечные числа: {', '.join(bad)}")
    return out


def violated_rules(record) -> list[str]:
    """Ключи нарушенных правил (без повторов, в порядке сообщений validate_rollout)."""
    keys = [m[1 : m.index("]")] for m in validate_rollout(record)]
    return list(dict.fromkeys(keys))


# ---------- сериализация ----------


def _as_records(records, path) -> tuple[str, list[RolloutRecord]]:
    check_path("path", path)
    if not isinstance(records, list | tuple):
        raise ValueError(f"records: ожидается список записей, получено {type(records).__name__}")
    out = []
    for i, r in enumerate(records):
        if not isinstance(r, RolloutRecord | Mapping):
            raise ValueError(f"records[{i}]: ожидается RolloutRecord или словарь: {fmt.short(r)}")
        try:
            out.append(r if isinstance(r, RolloutRecord) else RolloutRecord.from_dict(r))
        except ValueError as exc:
            raise ValueError(f"records[{i}]: {exc}") from None
    return os.fspath(path), out


_SUFFIX = ".sha256"
# строка sha256sum: 64 шестнадцатеричные цифры, пробел, пробел или * (двоичный режим), имя файла
_CHECKSUM_LINE = re.compile(rb"([0-9a-fA-F]{64}) [ *][^\r\n]+\r?\n?")


def _atomic_write(path: str, write) -> None:
    """Данные, затем их SHA-256 (``path + ".sha256"``): временные файлы рядом, потом os.replace.
    При сбое временные файлы убираются; если данные уже заменены, старая сумма удаляется."""
    directory, base = os.path.split(os.path.abspath(path))
    data_tmp = sum_tmp = None
    replaced = False
    try:
        data_tmp = atomic.temp_file(directory, base, write)
        with open(data_tmp, "rb") as f:  # сумма того, что уже на диске
            line = f"{hashlib.file_digest(f, 'sha256').hexdigest()}  {base}\n".encode()
        sum_tmp = atomic.temp_file(directory, base + _SUFFIX, lambda f: f.write(line))
        os.replace(data_tmp, path)
        data_tmp, replaced = None, True
        os.replace(sum_tmp, path + _SUFFIX)
    except BaseException:
        for name in (data_tmp, sum_tmp, path + _SUFFIX if replaced else None):
            if name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(name)
        raise
    atomic.fsync_dir(directory)


def _json_default(obj):
    if hasattr(obj, "item"):  # скаляры numpy
        return obj.item()
    raise TypeError(f"значение {fmt.short(obj)} не сериализуется в JSON")


def write_jsonl(records, path) -> None:
    """Атомарно пишет записи в JSONL, по строке JSON на запись (NaN — как NaN), и сумму SHA-256.

    Некорректные по содержимому записи сохраняются как есть, чтобы их можно было изучить.
    """
    path, recs = _as_records(records, path)

    def write(f):
        for i, r in enumerate(recs):
            try:
                line = json.dumps(r.to_dict(), ensure_ascii=False, default=_json_default)
            except (TypeError, ValueError, RecursionError) as exc:
                raise ValueError(f"records[{i}]: запись не сериализуется в JSON: {exc}") from None
            f.write(line.encode("utf-8") + b"\n")

    _atomic_write(path, write)


def _read_checked(path) -> tuple[str, bytes]:
    """Байты файла, сверенные с SHA-256 из ``<файл>.sha256``, если он есть; иначе ValueError."""
    file = check_path("path", path)
    name, side = os.fspath(file), Path(f"{file}{_SUFFIX}")
    if not file.is_file():
        raise ValueError(f"{name}: файл не найден")
    data = file.read_bytes()
    if not os.path.lexists(side):
        return name, data
    match = _CHECKSUM_LINE.fullmatch(side.read_bytes())
    if match is None:
        raise ValueError(
            f"{side}: файл контрольной суммы повреждён — нужна одна строка sha256sum "
            "«<64 шестнадцатеричные цифры>  <имя файла>»"
        )
    expected, actual = match.group(1).decode().lower(), hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ValueError(
            f"{name}: сумма SHA-256 файла {actual[:16]}… не совпадает с суммой из "
            f"{side.name} ({expected[:16]}…) — файл повреждён или изменён после "
            "записи (или запись прервалась между файлом и суммой); записи не прочитаны"
        )
    return name, data


def read_jsonl(path) -> list[RolloutRecord]:
    """Записи из JSONL (сверив SHA-256, если есть сумма); ValueError называет файл и строку."""
    name, data = _read_checked(path)
    out = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8").strip()
            if not text:
                continue
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ValueError(f"ожидается объект JSON, получено {type(d).__name__}")
            out.append(RolloutRecord.from_dict(d))
        except ValueError as exc:  # сюда входят JSONDecodeError и UnicodeDecodeError
            raise ValueError(f"{name}, строка {lineno}: {exc}") from None
    return out


_INTS = pa.list_(pa.int64())
_TYPES = {  # decoding и reward — строки JSON: произвольные ключи и значения переживают запись
    "policy_version": pa.int64(),
    "prompt_tokens": _INTS,
    "response_tokens": _INTS,
    "policy_mask": pa.list_(pa.int8()),
    "behavior_logprobs": pa.list_(pa.float64()),
    "token_policy_versions": _INTS,
}
_INT_LISTS = ("prompt_tokens", "response_tokens", "policy_mask", "token_policy_versions")
_SCHEMA = pa.schema(
    [(k, _TYPES.get(k, pa.string())) for k in _FIELDS],
    metadata={b"course_utils.contract": b"RolloutRecord/1"},
)


def _parquet_cell(name: str, value, i: int):
    if name in ("decoding", "reward"):
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    # pyarrow молча усекает 1.5 до 1 в целочисленном столбце: проверяем сами
    bad = (name == "policy_version" and value is not None and not is_int(value)) or (
        name in _INT_LISTS and isinstance(value, list | tuple) and not all(map(is_int, value))
    )
    if bad:
        raise ValueError(
            f"records[{i}].{name}: нужны целые для Parquet, получено {fmt.short(value)}"
        )
    return value


def write_parquet(records, path) -> None:
    """Атомарно пишет записи в Parquet с явной схемой и сумму SHA-256.

    decoding и reward хранятся строками JSON; логарифмы вероятностей — float64 (целое 0 станет 0.0).
    Поля неверного типа (строка вместо списка токенов) в схему не помещаются: ValueError.
    """
    path, recs = _as_records(records, path)
    columns = []
    for fld in _SCHEMA:
        try:
            values = [_parquet_cell(fld.name, getattr(r, fld.name), i) for i, r in enumerate(recs)]
            columns.append(pa.array(values, type=fld.type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise ValueError(f"write_parquet, поле {fld.name!r}: {exc}") from None
    table = pa.Table.from_arrays(columns, schema=_SCHEMA)
    _atomic_write(path, lambda f: pq.write_table(table, f))


def read_parquet(path) -> list[RolloutRecord]:
    """Записи из Parquet (сверив SHA-256, если есть сумма); ValueError называет файл и строку."""
    name, data = _read_checked(path)
    try:
        table = pq.read_table(pa.BufferReader(data))
        missing = [f for f in REQUIRED_FIELDS if f not in table.column_names]
        rows = [] if missing else table.to_pylist()
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: и битый UTF-8
        raise ValueError(f"{name}: файл не читается как Parquet: {exc}") from None
    if missing:
        raise ValueError(f"{name}: в таблице нет столбцов: {', '.join(missing)}")
    out = []
    for row, d in enumerate(rows):
        try:
            for k in ("decoding", "reward"):
                if not isinstance(d[k], str):
                    raise ValueError(
                        f"поле {k} должно быть строкой JSON, получено {fmt.short(d[k])}"
                    )
                d[k] = json.loads(d[k])
            out.append(RolloutRecord.from_dict(d))
        except ValueError as exc:
            raise ValueError(f"{name}, строка {row} (нумерация с 0): {exc}") from None
    return out


def records_to_frame(records):
    """Таблица pandas: строка на запись, поля плюс n_prompt, n_response, n_policy_tokens."""
    import pandas as pd

    rows = []
    for r in records:
        d = r.to_dict() if isinstance(r, RolloutRecord) else dict(r)
        row = {k: d.get(k) for k in _FIELDS}
        for col, k in (("n_prompt", "prompt_tokens"), ("n_response", "response_tokens")):
            row[col] = len(d[k]) if isinstance(d.get(k), list | tuple) else None
        row["n_policy_tokens"] = _count_ones(d.get("policy_mask"))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=_FIELDS + ["n_prompt", "n_response", "n_policy_tokens"])
    for col in ("policy_version", "n_prompt", "n_response", "n_policy_tokens"):
        if all(is_int(row[col]) for row in rows if row[col] is not None):
            frame[col] = frame[col].astype("Int64")  # целые с пропусками: 164, а не 164.0
    return frame


def example_record() -> RolloutRecord:
    """Пример записи из лекции (шаг 12.1.2): один ход, три токена политики, версия 127."""
    return RolloutRecord(
        sample_id="run42-p008-g03",
        policy_version=127,
        prompt_tokens=[101, 42, 17],
        response_tokens=[314, 159, 2],
        policy_mask=[0, 0, 0, 1, 1, 1],
        behavior_logprobs=[-0.31, -1.07, -0.22],
        decoding={"temperature": 0.8, "top_p": 1.0},
        reward={"correctness": 1.0, "format": 0.0},
        stop_reason="eos",
        verifier_version="arith-v4",
        trace_id="run42-p008-g03-v127",
        prompt_id="p008",
        group_id="run42-p008",
    )


def example_multiturn_record() -> RolloutRecord:
    """Два хода с инструментом: вызов (3 токена политики), наблюдение среды (4 токена, маска 0),
    ответ (3 токена политики, последний — EOS); логарифмов вероятностей 6."""
    prompt = [101, 7, 42, 17]
    call, observation, answer = [501, 502, 503], [900, 901, 902, 903], [314, 159, 2]
    return RolloutRecord(
        sample_id="run42-p011-g00",
        policy_version=128,
        prompt_tokens=prompt,
        response_tokens=call + observation + answer,
        policy_mask=[0] * len(prompt) + [1, 1, 1] + [0, 0, 0, 0] + [1, 1, 1],
        behavior_logprobs=[-0.05, -0.41, -0.12, -0.73, -0.02, -0.19],
        decoding={"temperature": 0.8, "top_p": 0.95},
        reward={"correctness": 1.0, "format": 1.0},
        stop_reason="eos",
        verifier_version="arith-v4",
        trace_id="run42-p011-g00-v128",
        prompt_id="p011",
        group_id="run42-p011",
    )
