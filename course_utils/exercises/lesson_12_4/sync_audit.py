"""12.4.9 — аудит журнала синхронизации весов: какие правила протокола нарушены.

Журнал строится по сценарию (``_plan``) с внедрёнными нарушениями; верный ответ считает
``weight_sync.audit_log`` (импорт torch — лениво, только когда шаг нужен).
"""

import random
from dataclasses import dataclass
from typing import Any

from course_utils.exercises.answers import IdSet, norm
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

# Внедряемые нарушения → коды audit_log, которые они вызывают (тесты сверяют с audit_log).
INJECTIONS = {
    "commit_no_wait": ("commit_before_barrier", "serve_before_barrier"),
    "serve_from_staging": ("serve_before_barrier", "serve_uncommitted"),  # до любого commit
    "early_commit": ("commit_before_barrier", "serve_before_barrier", "replicas_diverged"),
    "barrier_not_ready": ("barrier_not_ready",),
    "verify_ok_mismatch": ("checksum_mismatch",),
    "commit_mismatch": ("checksum_mismatch",),
    "skip_verify": ("commit_without_verify",),
    "stale_request": ("version_backwards", "replicas_diverged"),
    "inplace": ("inplace_update",),
    "missed_commit": ("replicas_diverged",),
}
_BARRIER_KINDS = ("commit_no_wait", "serve_from_staging", "early_commit", "barrier_not_ready")
_CHECKSUM_KINDS = ("verify_ok_mismatch", "commit_mismatch")
BARRIER_CODES = {"serve_before_barrier", "commit_before_barrier", "barrier_not_ready"}
_PUBLISHER = "publisher"


def _weight_sync():
    from course_utils import weight_sync  # импортирует torch: только когда шаг 12.4.9 нужен

    return weight_sync


def plan(variant: int) -> dict:
    """Сценарий варианта: реплики, версии, внедрённые нарушения (по публикациям), отменённая
    публикация-ловушка. В условие не попадает; тесты сверяют коды с audit_log.

    В каждом варианте — нарушение барьера и нарушение контрольной суммы (на них держатся ловушки
    commit_is_enough и checksum_ignored), иногда ещё одно нарушение другого вида.
    """
    rng = random.Random(12_4_9_000 + 7919 * variant)
    replicas = [f"replica-{i}" for i in range(rng.choice([2, 3]))]
    n_pub = rng.choice([1, 2])
    kinds = [rng.choice(_BARRIER_KINDS), rng.choice(_CHECKSUM_KINDS)]
    other = sorted(set(INJECTIONS) - set(_BARRIER_KINDS) - set(_CHECKSUM_KINDS))
    if n_pub * len(replicas) > 2 and rng.random() < 0.6:
        kinds.append(rng.choice(other))
    pubs: list[dict[str, str]] = [{} for _ in range(n_pub)]
    for kind in kinds:
        free = [(i, r) for i in range(n_pub) for r in replicas if r not in pubs[i].values()]
        i, r = rng.choice(free)
        pubs[i][kind] = r
    abort_at = rng.randrange(n_pub) if rng.random() < 0.4 else None
    return {"replicas": replicas, "v0": rng.randint(10, 60), "publications": pubs,
            "abort_before": abort_at, "abort_replica": rng.choice(replicas),
            "seed": rng.randrange(10**9)}  # fmt: skip


def expected_codes(p: dict) -> set[str]:
    return {code for pub in p["publications"] for kind in pub for code in INJECTIONS[kind]}


class _Journal:
    """Журнал событий схемы weight_sync.EVENT_FIELDS: seq по порядку, t растёт."""

    def __init__(self, rng: random.Random):
        self.rng, self.events, self.t, self.requests = rng, [], 0.0, 0
        self.current: dict[str, tuple[int, str]] = {}  # реплика → (версия, сумма) активного буфера

    def checksum(self) -> str:
        return f"{self.rng.getrandbits(32):08x}"

    def add(self, event: str, replica: str, version: int, **fields: Any) -> None:
        self.t += self.rng.uniform(0.003, 0.05)
        row = {"seq": len(self.events), "t": round(self.t, 3), "replica": replica,
               "event": event, "version": version, "checksum": None, "expected_checksum": None,
               "request_id": None, "buffer": None, "detail": ""}  # fmt: skip
        self.events.append({**row, **fields})

    def serve(self, replica: str, version: int | None = None, checksum: str | None = None) -> None:
        v, c = self.current[replica] if version is None else (version, checksum)
        self.requests += 1
        self.add("serve", replica, v, checksum=c, request_id=f"req-{self.requests:03d}")

    def commit(self, replica: str, version: int, checksum: str, buffer: str) -> None:
        self.add("commit", replica, version, checksum=checksum, buffer=buffer)
        self.current[replica] = (version, checksum)

    def serve_all(self, replicas: list[str]) -> None:
        for r in self.rng.sample(replicas, len(replicas)):
            self.serve(r)


def _aborted(j: _Journal, replicas: list[str], v: int, failed: str) -> None:
    """Ловушка: проверка одной реплики не прошла → abort, никто не переключился. Это норма."""
    ck, bad = j.checksum(), j.checksum()
    for r in replicas:
        j.add("stage_start", r, v, buffer="staging")
    j.serve(j.rng.choice(replicas))
    for r in replicas:
        j.add("stage_done", r, v, checksum=bad if r == failed else ck, buffer="staging")
    for r in replicas:
        if r == failed:
            j.add("verify_fail", r, v, checksum=bad, expected_checksum=ck, detail="сумма буфера ≠ ожидаемой")  # fmt: skip
        else:
            j.add("verify_ok", r, v, checksum=ck, expected_checksum=ck)
            j.add("ready", r, v)
    j.add("abort", _PUBLISHER, v, detail=f"не прошли проверку: {failed}")
    j.serve_all(replicas)


def _published(j: _Journal, replicas: list[str], v: int, inj: dict[str, str]) -> None:
    """Публикация версии v по протоколу шага 12.4.5 с внедрёнными нарушениями ``inj``."""
    ck, bad, prev = j.checksum(), j.checksum(), dict(j.current)
    staged = {r: bad if r == inj.get("verify_ok_mismatch") else ck for r in replicas}
    switched = {r: bad if r in (inj.get("verify_ok_mismatch"), inj.get("commit_mismatch")) else ck
                for r in replicas}  # fmt: skip
    buf = {r: "active" if r == inj.get("inplace") else "staging" for r in replicas}

    def verify_ready(r: str) -> None:
        if r != inj.get("skip_verify"):
            j.add("verify_ok", r, v, checksum=staged[r], expected_checksum=ck)
        j.add("ready", r, v)

    def commit(r: str) -> None:
        if r != inj.get("missed_commit"):
            j.commit(r, v, switched[r], buf[r])

    for r in replicas:
        j.add("stage_start", r, v, buffer=buf[r])
    j.serve(j.rng.choice(replicas))  # старая версия, пока пишется второй буфер — это норма
    for r in replicas:
        j.add("stage_done", r, v, checksum=staged[r], buffer=buf[r])
    if "serve_from_staging" in inj:
        r = inj["serve_from_staging"]
        j.serve(r, v, staged[r])
    others = [
        r for r in replicas if r not in (inj.get("early_commit"), inj.get("barrier_not_ready"))
    ]
    if "commit_no_wait" in inj:  # каждая реплика переключается сама, барьер записан потом
        for r in replicas:
            verify_ready(r)
            commit(r)
        j.serve_all(replicas)
        j.add("barrier", _PUBLISHER, v)
    elif "early_commit" in inj:
        r = inj["early_commit"]
        verify_ready(r)
        commit(r)
        j.serve(r)
        for x in others:
            verify_ready(x)
        j.add("barrier", _PUBLISHER, v)
        for x in others:
            commit(x)
    elif "barrier_not_ready" in inj:
        for x in others:
            verify_ready(x)
        j.add("barrier", _PUBLISHER, v)
        verify_ready(inj["barrier_not_ready"])
        for x in replicas:
            commit(x)
    else:
        for x in replicas:
            verify_ready(x)
        j.add("barrier", _PUBLISHER, v)
        for x in replicas:
            commit(x)
    j.serve_all(replicas)
    if "stale_request" in inj:
        r = inj["stale_request"]
        j.serve(r, *prev[r])


def _events(p: dict) -> list[dict]:
    j = _Journal(random.Random(p["seed"]))
    replicas, v = p["replicas"], p["v0"]
    ck0 = j.checksum()
    for r in replicas:
        j.add("init", r, v, checksum=ck0, buffer="active")
        j.current[r] = (v, ck0)
    j.serve_all(replicas)
    for i, inj in enumerate(p["publications"]):
        if p["abort_before"] == i:
            v += 1
            _aborted(j, replicas, v, p["abort_replica"])
        v += 1
        _published(j, replicas, v, inj)
    return j.events


def make_task(variant: int) -> dict:
    ws, p = _weight_sync(), plan(variant)
    events = _events(p)
    cols = ("seq", "t", "replica", "event", "version", "checksum", "expected_checksum",
            "request_id", "buffer", "detail")  # fmt: skip
    body = "\n".join("| " + " | ".join("—" if e[c] in (None, "") else str(e[c]) for c in cols) + " |"
                     for e in events)  # fmt: skip
    types = "\n".join(f"- `{k}` — {text}" for k, text in ws.EVENT_TYPES.items())
    rules = "\n".join(f"- `{k}` — {text}" for k, text in ws.AUDIT_RULES.items())
    statement = (
        f"**Аудит журнала синхронизации весов.** Публикатор (`{_PUBLISHER}`) раздаёт новые "
        f"версии весов {len(p['replicas'])} репликам движка генерации. Протокол шага 12.4.5: "
        "реплика пишет версию во второй (staging) буфер, проверяет её контрольной суммой "
        "(`checksum` против присланной `expected_checksum`), сообщает `ready`; когда готовы все "
        "реплики, публикатор записывает `barrier`, и только после него реплики переключаются "
        "(`commit`) и обслуживают новую версию. Запрос (`serve`) закрепляет за собой версию "
        "активного буфера; `checksum` у `serve` и `commit` — сумма активных весов.\n\n"
        f"Журнал (событий: {len(events)}, по времени; он же — `task_12_4_9['events']`, удобно "
        "`pd.DataFrame(task_12_4_9['events'])`):\n\n"
        f"| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n{body}\n\n"
        f"Типы событий:\n{types}\n\nПравила аудита (коды — `task_12_4_9['rules']`):\n{rules}\n\n"
        "Какие правила нарушены в этом журнале? Ответ — список кодов (каждый код один раз, "
        'порядок не важен), например `["inplace_update"]`; если журнал чистый — `[]`. Ищите '
        "сами; после проверки можно сверить с `weight_sync.audit_log(task_12_4_9['events'])`."
    )
    return {"statement": statement, "events": events, "rules": dict(ws.AUDIT_RULES)}


def solve(task: dict) -> list[str]:
    found = {m[1 : m.index("]")] for m in _weight_sync().audit_log(task["events"])}
    return [code for code in task["rules"] if code in found]


def solution(task: dict, ref: list[str]) -> str:
    messages, events = _weight_sync().audit_log(task["events"]), task["events"]
    lines = "\n".join(f"- {m}" for m in messages)
    aborted = sorted({e["version"] for e in events if e["event"] == "abort"})
    notes = ["запрос `serve` старой версии, пока новая пишется во второй буфер, — не нарушение: "
             "ради этого и нужен двойной буфер"]  # fmt: skip
    if aborted:
        notes.append(f"`verify_fail` и `abort` версии {', '.join(map(str, aborted))} — протокол "
                     "сработал: проверка поймала порчу, и ни одна реплика не переключилась")  # fmt: skip
    found = (f"`audit_log` находит нарушения (сообщений: {len(messages)}):\n\n{lines}" if messages
             else "`audit_log` нарушений не находит: журнал чистый.")  # fmt: skip
    replicas = sorted({e["replica"] for e in events if e["replica"] != _PUBLISHER})
    return (
        f"Идём по журналу по времени и для каждой реплики ({', '.join(replicas)}) и версии "
        "проверяем порядок stage → verify_ok (сумма = ожидаемой) → ready → barrier (когда ready "
        "прислали все) → commit → serve; после переключения все реплики должны обслуживать "
        "одну версию, и версия реплики не убывает.\n\n"
        f"{found}\n\n**Ответ:** `{ref}`.\n\nНе нарушения: " + "; ".join(notes) + ".\n\n"
        "Барьер нужен не для красоты: реплика, переключившаяся или начавшая обслуживать новую "
        "версию до барьера, может оказаться единственной с этой версией (остальные ещё не "
        "готовы или провалят проверку) — и в пакет попадут роллауты разных политик."
    )


def _codes(given: Any) -> set[str]:
    return {norm(x).strip("[]` ") for x in _plain(given)}


@dataclass(frozen=True)
class _Codes(IdSet):
    """Коды нарушений: строки из AUDIT_RULES без учёта регистра, скобок «[…]» и повторов."""

    def problem(self, given: Any, task: dict) -> str | None:
        g = _plain(given)
        if not isinstance(g, (list, tuple, set, frozenset)) or not all(
            isinstance(x, str) for x in g
        ):
            return ('Ожидается список кодов нарушений (строк), например ["inplace_update"], или [] '
                    f"для чистого журнала; получено: {type(given).__name__}.")  # fmt: skip
        unknown = sorted(_codes(g) - set(task["rules"]))
        if unknown:
            return (f"Неизвестные коды: {', '.join(unknown)}. Допустимы ключи AUDIT_RULES: "
                    f"{', '.join(task['rules'])}.")  # fmt: skip
        return None

    def same(self, expected: Any, given: Any) -> bool:
        return _codes(given) == set(expected)

    def mismatch(self, expected: Any, given: Any) -> str:
        g, ref = _codes(given), set(expected)
        if not ref:
            return f"В ответе {len(g)} кодов, а журнал стоит перепроверить: нарушено ли что-то на самом деле?"
        return (f"Нарушенных правил в журнале: {len(ref)}. Вы верно назвали {len(ref & g)}, лишних "
                f"(не нарушенных) кодов в ответе: {len(g - ref)}.")  # fmt: skip


def _everything(task: dict, given: Any) -> bool:
    g = _codes(given)
    return g != set(solve(task)) and len(g) >= len(task["rules"]) - 1


def _commit_enough(task: dict, given: Any) -> bool:
    ref, g = set(solve(task)), _codes(given)
    return g < ref and (ref - g) <= ref & BARRIER_CODES


def _checksum_ignored(task: dict, given: Any) -> bool:
    ref = set(solve(task))
    return "checksum_mismatch" in ref and _codes(given) == ref - {"checksum_mismatch"}


STEP = Step(
    id="12.4.9", make_task=make_task, solve=solve, solution=solution,
    answer=_Codes(universe=lambda t: t["rules"], noun="кодов"),
    hint=(
        "Для каждой версии: у всех ли реплик были verify_ok с checksum = expected_checksum "
        "и ready до barrier? Не было ли commit или serve новой версии до barrier? Совпадает "
        "ли сумма commit/serve с эталоном версии? Писались ли веса в staging? После "
        "переключений — одна ли версия у всех реплик, не уменьшается ли она?"
    ),
    traps=(
        Trap("everything_wrong",
             "Вы перечислили (почти) все правила. Аудит — это поиск конкретных нарушений: "
             "найдите событие, которое нарушает каждое названное правило; остальные коды "
             "уберите.",
             wrong=lambda t, ref: list(t["rules"]), matches=_everything),
        Trap("commit_is_enough",
             "Вы пропустили нарушения барьера готовности. Переключение (commit) и проверка "
             "одной реплики не делают версию доступной: обслуживать и включать её можно "
             "только после barrier, когда ready прислали все реплики (и barrier не должен "
             "опережать их ready).",
             wrong=lambda t, ref: [c for c in ref if c not in BARRIER_CODES], matches=_commit_enough),
        Trap("checksum_ignored",
             "Вы не сверили контрольные суммы. verify_ok ещё не значит, что checksum равна "
             "expected_checksum, а commit и serve должны нести сумму той же версии — иначе "
             "реплика обслуживает не те веса.",
             wrong=lambda t, ref: [c for c in ref if c != "checksum_mismatch"], matches=_checksum_ignored),
    ),
)  # fmt: skip
