"""Урок 12.4, шаг 12.4.9: независимый аудит журнала публикации весов по правилам ``AUDIT_RULES``.

Журнал — события схемы ``weight_sync.EVENT_FIELDS``/``EVENT_TYPES`` (``EventLog``, таблица pandas
или список словарей) любого движка, не только учебного; ``audit_log`` возвращает нарушения
протокола «[код] текст» по-русски, по одному на (правило, реплика, версия).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from course_utils.args import choice, integer, real, text
from course_utils.weight_sync import EVENT_TYPES, EventLog, short_checksum, sync_labels

_REPLICA_EVENTS = ("stage_start", "stage_done", "verify_ok", "verify_fail", "ready", "commit")

AUDIT_RULES = sync_labels("rule")  # код правила → текст (data/weight_sync_labels.csv)


def _normalise(events: Any) -> list[dict]:
    """События как список словарей (из EventLog, таблицы pandas или списка), NaN → None,
    с проверкой обязательных полей; если у всех есть t — упорядочены по t (устойчиво)."""
    if isinstance(events, EventLog):
        events = events.to_list()
    if hasattr(events, "to_dict") and hasattr(events, "columns"):  # pandas.DataFrame
        events = events.to_dict("records")
    if isinstance(events, str | bytes) or not isinstance(events, Sequence):
        raise ValueError(
            "events должно быть списком словарей-событий, EventLog или таблицей pandas, "
            f"получено {type(events).__name__}"
        )
    out = []
    for i, raw in enumerate(events):
        if not isinstance(raw, Mapping):
            raise ValueError(f"events[{i}] должно быть словарём, получено {type(raw).__name__}")
        ev = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in raw.items()}
        kind = choice(f"events[{i}]: поле event", ev.get("event"), EVENT_TYPES)
        text(f"events[{i}]: поле replica", ev.get("replica"))
        version = integer(f"events[{i}] ({kind}): поле version", ev.get("version"), 0)
        if ev.get("t") is not None:
            real(f"events[{i}]: поле t, с", ev["t"])
        out.append(ev | {"version": version, "_pos": i})
    if all(e.get("t") is not None for e in out):
        out.sort(key=lambda e: e["t"])
    return out


def audit_log(events: Any) -> list[str]:
    """Нарушения протокола в журнале схемы ``EVENT_FIELDS`` (пусто — журнал чистый): по
    сообщению «[код] текст» (коды — ``AUDIT_RULES``) на (правило, реплика, версия). Барьер
    версии v пройден, когда ready прислали все её участники (реплики с stage_*/verify_*/
    ready/commit для v) и, если в журнале есть barrier для v, — после первого из них."""
    evs = _normalise(events)
    participants: dict[int, set[str]] = defaultdict(set)
    has_barrier = {ev["version"] for ev in evs if ev["event"] == "barrier"}
    ref_checksum: dict[int, str] = {}
    for ev in evs:
        v = ev["version"]
        if ev["event"] in _REPLICA_EVENTS:
            participants[v].add(ev["replica"])
        if ev["event"] in ("verify_ok", "verify_fail") and ev.get("expected_checksum"):
            ref_checksum.setdefault(v, ev["expected_checksum"])
    for ev in evs:  # без присланной суммы эталон — первая сумма переключения (или init)
        if ev["event"] in ("commit", "init") and ev.get("checksum"):
            ref_checksum.setdefault(ev["version"], ev["checksum"])

    messages: dict[tuple, str] = {}
    current: dict[str, int] = {}
    initial: dict[str, int] = {}
    switched: set[int] = set()  # версии, на которые переключилась хотя бы одна реплика
    ready: dict[int, set[str]] = defaultdict(set)
    barrier_passed: set[int] = set()
    verified: dict[tuple[str, int], str | None] = {}

    def not_ready(v: int) -> list[str]:
        return sorted(participants[v] - ready[v])

    def barrier_missing(v: int) -> str:
        if waiting := not_ready(v):
            return f"не сообщили ready: {', '.join(waiting)}"
        if v in has_barrier and v not in barrier_passed:
            return "событие barrier ещё не записано"
        return ""

    for ev in evs:
        kind, r, v, checksum = ev["event"], ev["replica"], ev["version"], ev.get("checksum")
        where = f"событие №{ev['_pos']} ({kind})"
        ref = ref_checksum.get(v)

        def report(code: str, msg: str, key: Any = None, r: str = r, v: int = v) -> None:
            messages.setdefault((code, r, v, key), f"[{code}] {msg}")

        if kind == "init":
            initial.setdefault(r, v)
            current[r] = v
        elif kind == "stage_start":
            verified[(r, v)] = None
            if ev.get("buffer") == "active":
                report(
                    "inplace_update",
                    f"реплика {r} пишет версию {v} на месте в активный буфер ({where}): "
                    "запросы могут прочитать смесь версий — нужен второй буфер",
                )
        elif kind in ("verify_ok", "verify_fail"):
            verified[(r, v)] = "ok" if kind == "verify_ok" else "fail"
            expected = ev.get("expected_checksum")
            if kind == "verify_ok" and checksum and expected and checksum != expected:
                report(
                    "checksum_mismatch",
                    f"реплика {r}, версия {v}: verify_ok, но сумма {short_checksum(checksum)} ≠ "
                    f"ожидаемой {short_checksum(expected)} ({where})",
                )
        elif kind == "ready":
            ready[v].add(r)
        elif kind == "barrier":
            if waiting := not_ready(v):
                report(
                    "barrier_not_ready",
                    f"барьер версии {v} отмечен пройденным ({where}), а ready не прислали: "
                    f"{', '.join(waiting)}",
                )
            barrier_passed.add(v)
        elif kind in ("commit", "serve"):
            doing = "переключилась на версию" if kind == "commit" else "обслуживает версию"
            if kind == "serve" and r not in current:
                initial.setdefault(r, v)
                current[r] = v
            cur = current.get(r, v)
            if (kind == "commit" or v != initial.get(r)) and (missing := barrier_missing(v)):
                report(
                    f"{kind}_before_barrier",
                    f"реплика {r} {doing} {v} до барьера готовности ({missing}; {where})",
                )
            if kind == "commit":
                state = verified.get((r, v))
                if state != "ok":
                    why = "последняя проверка — verify_fail" if state else "проверки не было"
                    msg = f"реплика {r} переключилась на версию {v} без verify_ok ({why}; {where})"
                    report("commit_without_verify", msg)
                if v < cur:
                    msg = f"реплика {r} переключилась назад: {cur} → {v}"
                    report("version_backwards", f"{msg} ({where})")
                current[r] = v
                switched.add(v)
            elif v < cur:
                msg = f"реплика {r} обслуживает версию {v}, хотя уже переключилась на {cur}"
                report("version_backwards", f"{msg} ({where})")
            elif v > cur:
                msg = f"реплика {r} обслуживает версию {v}, а переключалась только на {cur}"
                report("serve_uncommitted", f"{msg} ({where})")
            # Расхождение — только после переключения на более новую из двух версий: запрос
            # из staging до любого commit — это serve_uncommitted, а не разошедшиеся реплики.
            others = {
                o: w for o, w in current.items() if o != r and w != v and max(w, v) in switched
            }
            if kind == "serve" and others:
                listed = ", ".join(f"{o}: {w}" for o, w in sorted(others.items()))
                msg = f"реплика {r} обслуживает версию {v}, а другие реплики — {listed}"
                report("replicas_diverged", f"{msg} ({where})")
            if checksum and ref and checksum != ref:
                msg = f"реплика {r} {doing} {v} с суммой {short_checksum(checksum)}, "
                report("checksum_mismatch", f"{msg}эталон версии — {short_checksum(ref)} ({where})")
        elif kind == "torn_read":
            rid = ev.get("request_id")
            msg = f"запрос {rid} на реплике {r} помечен версией {v}, но прочитал смесь версий"
            report("torn_read", f"{msg} ({where})", key=rid)
    return list(messages.values())
