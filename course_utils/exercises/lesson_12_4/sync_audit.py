"""12.4.9 — аудит журнала синхронизации весов: какие правила протокола нарушены.

Журнал строится по сценарию (``plan``) с внедрёнными нарушениями; верный ответ считает
``weight_sync.audit_log`` (он импортирует torch — лениво, только когда шаг нужен).
"""

import itertools
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
    "verify_ok_mismatch": ("checksum_mismatch",), "commit_mismatch": ("checksum_mismatch",),
    "skip_verify": ("commit_without_verify",), "stale_request": ("version_backwards", "replicas_diverged"),
    "inplace": ("inplace_update",), "missed_commit": ("replicas_diverged",),
}  # fmt: skip
_BARRIER_KINDS = ("commit_no_wait", "serve_from_staging", "early_commit", "barrier_not_ready")
_CHECKSUM_KINDS = ("verify_ok_mismatch", "commit_mismatch")
BARRIER_CODES = {"serve_before_barrier", "commit_before_barrier", "barrier_not_ready"}
_PUBLISHER = "publisher"


def _weight_sync():
    from course_utils import weight_sync  # импортирует torch: только когда шаг 12.4.9 нужен

    return weight_sync


def plan(variant: int) -> dict:
    """Сценарий варианта (в условие не попадает): реплики, нарушения по публикациям, отмена-ловушка.

    В каждом варианте — нарушение барьера и нарушение контрольной суммы (на них держатся ловушки
    commit_is_enough и checksum_ignored), иногда ещё одно нарушение другого вида.
    """
    rng = random.Random(12_4_9_000 + 7919 * variant)
    replicas = [f"replica-{i}" for i in range(rng.choice([2, 3]))]
    n_pub = rng.choice([1, 2])
    kinds = [rng.choice(_BARRIER_KINDS), rng.choice(_CHECKSUM_KINDS)]
    if n_pub * len(replicas) > 2 and rng.random() < 0.6:
        kinds.append(rng.choice(sorted(set(INJECTIONS) - {*_BARRIER_KINDS, *_CHECKSUM_KINDS})))
    pubs: list[dict[str, str]] = [{} for _ in range(n_pub)]
    for kind in kinds:
        i, r = rng.choice(
            [(i, r) for i in range(n_pub) for r in replicas if r not in pubs[i].values()]
        )
        pubs[i][kind] = r
    abort_at = rng.randrange(n_pub) if rng.random() < 0.4 else None
    return {"replicas": replicas, "v0": rng.randint(10, 60), "publications": pubs,
            "abort_before": abort_at, "abort_replica": rng.choice(replicas),
            "seed": rng.randrange(10**9)}  # fmt: skip


def expected_codes(p: dict) -> set[str]:
    return {code for pub in p["publications"] for kind in pub for code in INJECTIONS[kind]}


def _events(p: dict) -> list[dict]:
    """Журнал weight_sync.EventLog: начальная версия, затем публикации по протоколу шага 12.4.5."""
    rng, replicas, cur, requests = random.Random(p["seed"]), p["replicas"], {}, itertools.count(1)
    times = itertools.accumulate(rng.uniform(0.003, 0.05) for _ in itertools.count())
    log = _weight_sync().EventLog(clock=lambda: round(next(times), 3), t0=0.0)
    add, checksum = log.add, lambda: f"{rng.getrandbits(32):08x}"

    def serve(r: str, version: int | None = None, ck: str | None = None) -> None:
        version, ck = cur[r] if version is None else (version, ck)
        add("serve", r, version, checksum=ck, request_id=f"req-{next(requests):03d}")

    def serve_all() -> None:
        for r in rng.sample(replicas, len(replicas)):
            serve(r)

    def publish(v: int, inj: dict[str, str], failed: str | None = None) -> None:
        """Версия v с нарушениями ``inj``; ``failed`` — проверка этой реплики не прошла → abort."""
        ck, bad, prev = checksum(), checksum(), dict(cur)
        staged = {r: bad if r in (inj.get("verify_ok_mismatch"), failed) else ck for r in replicas}
        switched = {r: bad if r in (inj.get("verify_ok_mismatch"), inj.get("commit_mismatch")) else ck for r in replicas}  # fmt: skip
        buf = {r: "active" if r == inj.get("inplace") else "staging" for r in replicas}
        early, late = inj.get("early_commit"), inj.get("barrier_not_ready")

        def ready(r: str) -> None:
            if r == failed:
                return add("verify_fail", r, v, checksum=bad, expected_checksum=ck, detail="сумма буфера ≠ ожидаемой")  # fmt: skip
            if r != inj.get("skip_verify"):
                add("verify_ok", r, v, checksum=staged[r], expected_checksum=ck)
            add("ready", r, v)

        def commit(r: str) -> None:
            if r != inj.get("missed_commit"):
                add("commit", r, v, checksum=switched[r], buffer=buf[r])
                cur[r] = (v, switched[r])

        for r in replicas:
            add("stage_start", r, v, buffer=buf[r])
        serve(rng.choice(replicas))  # старая версия, пока пишется второй буфер — это норма
        for r in replicas:
            add("stage_done", r, v, checksum=staged[r], buffer=buf[r])
        if "serve_from_staging" in inj:
            serve(inj["serve_from_staging"], v, staged[inj["serve_from_staging"]])
        if failed:  # ловушка: проверка одной реплики не прошла, никто не переключился — это норма
            for r in replicas:
                ready(r)
            add("abort", _PUBLISHER, v, detail=f"не прошли проверку: {failed}")
            return serve_all()
        if "commit_no_wait" in inj:  # каждая реплика переключается сама, барьер записан потом
            for r in replicas:
                ready(r)
                commit(r)
            serve_all()
        if early:
            ready(early)
            commit(early)
            serve(early)
        for r in replicas:
            if r not in (early, late) and "commit_no_wait" not in inj:
                ready(r)
        add("barrier", _PUBLISHER, v)
        if late:
            ready(late)
        for r in replicas:
            if r != early and "commit_no_wait" not in inj:
                commit(r)
        serve_all()
        if "stale_request" in inj:
            serve(inj["stale_request"], *prev[inj["stale_request"]])

    v, ck0 = p["v0"], checksum()
    for r in replicas:
        add("init", r, v, checksum=ck0, buffer="active")
        cur[r] = (v, ck0)
    serve_all()
    for i, inj in enumerate(p["publications"]):
        if p["abort_before"] == i:
            v += 1
            publish(v, {}, failed=p["abort_replica"])
        v += 1
        publish(v, inj)
    return log.to_list()


def make_task(variant: int) -> dict:
    ws, p = _weight_sync(), plan(variant)
    events, cols = _events(p), tuple(ws.EVENT_FIELDS)
    body = "\n".join("| " + " | ".join("—" if e[c] in (None, "") else str(e[c]) for c in cols) + " |" for e in events)  # fmt: skip
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
    aborted = sorted({e["version"] for e in events if e["event"] == "abort"})
    notes = "запрос `serve` старой версии, пока новая пишется во второй буфер, — не нарушение: ради этого и нужен двойной буфер"  # fmt: skip
    if aborted:
        notes += (f"; `verify_fail` и `abort` версии {', '.join(map(str, aborted))} — протокол "
                  "сработал: проверка поймала порчу, и ни одна реплика не переключилась")  # fmt: skip
    replicas = sorted({e["replica"] for e in events if e["replica"] != _PUBLISHER})
    return (
        f"Идём по журналу по времени и для каждой реплики ({', '.join(replicas)}) и версии "
        "проверяем порядок stage → verify_ok (сумма = ожидаемой) → ready → barrier (когда ready "
        "прислали все) → commit → serve; после переключения все реплики должны обслуживать "
        "одну версию, и версия реплики не убывает.\n\n"
        f"`audit_log` находит нарушения (сообщений: {len(messages)}):\n\n"
        + "\n".join(f"- {m}" for m in messages)
        + f"\n\n**Ответ:** `{ref}`.\n\nНе нарушения: {notes}.\n\n"
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
        if not isinstance(g, (list, tuple, set, frozenset)) or not all(isinstance(x, str) for x in g):  # fmt: skip
            return ('Ожидается список кодов нарушений (строк), например ["inplace_update"], или [] '
                    f"для чистого журнала; получено: {type(given).__name__}.")  # fmt: skip
        unknown = sorted(_codes(g) - set(task["rules"]))
        return f"Неизвестные коды: {', '.join(unknown)}. Допустимы ключи AUDIT_RULES: {', '.join(task['rules'])}." if unknown else None  # fmt: skip

    def same(self, expected: Any, given: Any) -> bool:
        return _codes(given) == set(expected)

    def mismatch(self, expected: Any, given: Any) -> str:
        g, ref = _codes(given), set(expected)
        return (f"Нарушенных правил в журнале: {len(ref)}. Вы верно назвали {len(ref & g)}, лишних "
                f"(не нарушенных) кодов в ответе: {len(g - ref)}.")  # fmt: skip


def _missed(codes: set[str]):
    """Правило Trap.matches: ответ — верный без части нарушений из ``codes`` (и без других)."""
    return lambda t, g: _codes(g) < set(solve(t)) and set(solve(t)) - _codes(g) <= codes


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
             wrong=lambda t, ref: list(t["rules"]),
             matches=lambda t, g: _codes(g) != set(solve(t)) and len(_codes(g)) >= len(t["rules"]) - 1),
        Trap("commit_is_enough",
             "Вы пропустили нарушения барьера готовности. Переключение (commit) и проверка "
             "одной реплики не делают версию доступной: обслуживать и включать её можно "
             "только после barrier, когда ready прислали все реплики (и barrier не должен "
             "опережать их ready).",
             wrong=lambda t, ref: [c for c in ref if c not in BARRIER_CODES], matches=_missed(BARRIER_CODES)),
        Trap("checksum_ignored",
             "Вы не сверили контрольные суммы. verify_ok ещё не значит, что checksum равна "
             "expected_checksum, а commit и serve должны нести сумму той же версии — иначе "
             "реплика обслуживает не те веса.",
             wrong=lambda t, ref: [c for c in ref if c != "checksum_mismatch"],
             matches=_missed({"checksum_mismatch"})),
    ),
)  # fmt: skip
