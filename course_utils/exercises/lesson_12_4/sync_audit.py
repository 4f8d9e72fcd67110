"""12.4.9 — аудит журнала синхронизации весов (EventLog по сценарию ``plan``): что нарушено."""

import itertools
import random
from functools import partial
from importlib import import_module
from typing import Any

from course_utils.exercises.answers import IdSet, md_table, norm
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

_INJECTIONS = {  # внедряемое нарушение → коды, которые оно вызывает (тесты сверяют с audit_log)
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
_WEIGHT_SYNC = "course_utils.weight_sync"  # импортирует torch: грузится, только когда шаг нужен
_AUDIT = "course_utils.weight_audit"


def plan(variant: int) -> dict:
    """Реплики, нарушения по публикациям, отмена-ловушка; всегда есть нарушение барьера и суммы."""
    rng = random.Random(12_4_9_000 + 7919 * variant)
    replicas, n_pub = [f"replica-{i}" for i in range(rng.choice([2, 3]))], rng.choice([1, 2])
    kinds = [rng.choice(_BARRIER_KINDS), rng.choice(_CHECKSUM_KINDS)]
    if n_pub * len(replicas) > 2 and rng.random() < 0.6:
        kinds.append(rng.choice(sorted(set(_INJECTIONS) - {*_BARRIER_KINDS, *_CHECKSUM_KINDS})))
    pubs: list[dict[str, str]] = [{} for _ in range(n_pub)]
    for kind in kinds:
        free = [(i, r) for i in range(n_pub) for r in replicas if r not in pubs[i].values()]
        i, r = rng.choice(free)
        pubs[i][kind] = r
    p = {"abort_before": rng.randrange(n_pub) if rng.random() < 0.4 else None}
    p |= {"replicas": replicas, "v0": rng.randint(10, 60), "publications": pubs}
    return p | {"abort_replica": rng.choice(replicas), "seed": rng.randrange(10**9)}


def expected_codes(p: dict) -> set[str]:
    return {code for pub in p["publications"] for kind in pub for code in _INJECTIONS[kind]}


def _sync_events(p: dict) -> list[dict]:
    rng, replicas, cur, requests = random.Random(p["seed"]), p["replicas"], {}, itertools.count(1)
    times = itertools.accumulate(rng.uniform(0.003, 0.05) for _ in itertools.count())
    log = import_module(_WEIGHT_SYNC).EventLog(clock=lambda: round(next(times), 3), t0=0.0)
    add, checksum = log.add, lambda: f"{rng.getrandbits(32):08x}"

    def serve(r: str, version: int | None = None, ck: str | None = None) -> None:
        version, ck = cur[r] if version is None else (version, ck)
        add("serve", r, version, checksum=ck, request_id=f"req-{next(requests):03d}")

    def serve_all() -> None:
        for r in rng.sample(replicas, len(replicas)):
            serve(r)

    def publish(v: int, inj: dict[str, str], failed: str | None = None) -> None:  # failed → abort
        ck, bad, prev, get = checksum(), checksum(), dict(cur), inj.get
        staged = {r: bad if r in (get("verify_ok_mismatch"), failed) else ck for r in replicas}
        wrong = (get("verify_ok_mismatch"), get("commit_mismatch"))
        switched = {r: bad if r in wrong else ck for r in replicas}
        buf = {r: "active" if r == get("inplace") else "staging" for r in replicas}
        early, late, nowait = get("early_commit"), get("barrier_not_ready"), "commit_no_wait" in inj

        def ready(r: str) -> None:
            if r == failed:
                detail = "сумма буфера ≠ ожидаемой"
                return add("verify_fail", r, v, checksum=bad, expected_checksum=ck, detail=detail)
            if r != get("skip_verify"):
                add("verify_ok", r, v, checksum=staged[r], expected_checksum=ck)
            add("ready", r, v)

        def commit(r: str) -> None:
            if r != get("missed_commit"):
                add("commit", r, v, checksum=switched[r], buffer=buf[r])
                cur[r] = (v, switched[r])

        for r in replicas:
            add("stage_start", r, v, buffer=buf[r])
        serve(rng.choice(replicas))  # старая версия, пока пишется второй буфер, — это норма
        for r in replicas:
            add("stage_done", r, v, checksum=staged[r], buffer=buf[r])
        if "serve_from_staging" in inj:
            serve(inj["serve_from_staging"], v, staged[inj["serve_from_staging"]])
        if failed:  # ловушка: проверка одной реплики не прошла, никто не переключился — это норма
            for r in replicas:
                ready(r)
            add("abort", "publisher", v, detail=f"не прошли проверку: {failed}")
            return serve_all()
        if nowait or early:  # все переключаются сами (барьер записан потом) или одна — раньше
            for r in replicas if nowait else [early]:
                ready(r)
                commit(r)
            serve_all() if nowait else serve(early)
        waiting = [] if nowait else [r for r in replicas if r != early]
        for r in [r for r in waiting if r != late]:
            ready(r)
        add("barrier", "publisher", v)
        if late:
            ready(late)
        for r in waiting:
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
            publish(v := v + 1, {}, failed=p["abort_replica"])
        publish(v := v + 1, inj)
    return log.to_list()


def _audit_task(variant: int) -> dict:
    ws, audit, p = import_module(_WEIGHT_SYNC), import_module(_AUDIT), plan(variant)
    events, cols = _sync_events(p), tuple(ws.EVENT_FIELDS)
    rows = [["—" if e[c] in (None, "") else e[c] for c in cols] for e in events]
    types = "\n".join(f"- `{k}` — {text}" for k, text in ws.EVENT_TYPES.items())
    rules = "\n".join(f"- `{k}` — {text}" for k, text in audit.AUDIT_RULES.items())
    statement = (
        f"**Аудит журнала синхронизации весов.** Публикатор (`publisher`) раздаёт новые версии весов {len(p['replicas'])} репликам движка генерации. Протокол шага 12.4.5: реплика пишет версию во второй (staging) буфер, проверяет её контрольной суммой (`checksum` против присланной `expected_checksum`) и сообщает `ready`; когда готовы все, публикатор записывает `barrier`, и только после него реплики переключаются (`commit`) и обслуживают новую версию. Запрос (`serve`) закрепляет за собой версию активного буфера; `checksum` у `serve` и `commit` — сумма активных весов.\n\nЖурнал (событий: {len(events)}, по времени; он же — `task_12_4_9['events']`, удобно `pd.DataFrame(task_12_4_9['events'])`):\n\n"
        f"{md_table(cols, rows)}\n\nТипы событий:\n{types}\n\nПравила аудита (`task_12_4_9['rules']`):\n{rules}\n\nКакие правила нарушены в этом журнале? Ответ — список кодов, например `[\"inplace_update\"]`, или `[]` для чистого журнала. Ищите сами; после проверки можно сверить с `weight_sync.audit_log(task_12_4_9['events'])`."
    )
    return {"statement": statement, "events": events, "rules": dict(audit.AUDIT_RULES)}


def _audit_solve(task: dict) -> list[str]:
    found = {m[1 : m.index("]")] for m in import_module(_AUDIT).audit_log(task["events"])}
    return [code for code in task["rules"] if code in found]


def _audit_solution(task: dict, ref: list[str]) -> str:
    events = task["events"]
    found = "\n".join(f"- {m}" for m in import_module(_AUDIT).audit_log(events))
    aborted = ", ".join(map(str, sorted({e["version"] for e in events if e["event"] == "abort"})))
    replicas = sorted({e["replica"] for e in events} - {"publisher"})
    return f"Для каждой реплики ({', '.join(replicas)}) и версии проверяем порядок stage → verify_ok (сумма = ожидаемой) → ready → barrier (ready прислали все) → commit → serve; после переключения у всех реплик одна версия, и она не убывает. `audit_log` находит:\n\n{found}\n\n**Ответ:** `{ref}`.\n\nНе нарушения: `serve` старой версии, пока новая пишется во второй буфер, — ради этого и нужен двойной буфер{aborted and f'; `verify_fail` и `abort` версии {aborted} — протокол сработал: проверка поймала порчу, и никто не переключился'}. Реплика, переключившаяся до барьера, может остаться единственной с новой версией — и в пакет попадут роллауты разных политик."


def _audit_wrong(dropped: set[str] | None, task: dict, ref: list[str]) -> list[str]:
    return list(task["rules"]) if dropped is None else [c for c in ref if c not in dropped]


def _audit_rule(dropped: set[str] | None, task: dict, given: Any) -> bool:
    """Trap.matches: названы (почти) все правила (dropped=None) или верный ответ без части dropped."""
    ref, got = set(_audit_solve(task)), {norm(x) for x in _plain(given)}
    if dropped is None:
        return got != ref and len(got) >= len(task["rules"]) - 1
    return got < ref and ref - got <= dropped


_ANSWER = IdSet(lambda t: t["rules"], noun="кодов нарушений", repeats=True)
_HINT = "Для каждой версии: были ли у всех реплик verify_ok с checksum = expected_checksum и ready до barrier? Не было ли commit или serve новой версии до barrier? Совпадает ли сумма commit/serve с эталоном? Писались ли веса в staging? Одна ли версия у всех реплик после переключений и не убывает ли она?"
_MESSAGES = {
    "everything_wrong": "Вы перечислили (почти) все правила. Аудит — поиск конкретных нарушений: для каждого названного кода найдите нарушающее его событие.",
    "commit_is_enough": "Вы пропустили нарушения барьера готовности: commit и проверка одной реплики не делают версию доступной — обслуживать её можно только после barrier, когда ready прислали все.",
    "checksum_ignored": "Вы не сверили контрольные суммы: verify_ok ещё не значит, что checksum равна expected_checksum, а commit и serve должны нести сумму той же версии.",
}
_TRAPS = tuple(  # пропущенные коды ошибки: None — названы все правила
    Trap(k, text, partial(_audit_wrong, d), matches=partial(_audit_rule, d))
    for (k, text), d in zip(_MESSAGES.items(), (None, BARRIER_CODES, {"checksum_mismatch"}))
)
STEP = Step("12.4.9", _audit_task, _audit_solve, _ANSWER, _HINT, _audit_solution, _TRAPS)
