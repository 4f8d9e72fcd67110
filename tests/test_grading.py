"""Тесты движка проверочных шагов course_utils.grading."""

import copy
import json
import os
import random
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from course_utils import grading
from course_utils.exercises.answers import Fields, Number
from course_utils.exercises.step import Step, Trap
from course_utils.grading import ____

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- упражнения-однодневки
def _num_task(variant: int) -> dict:
    rng = random.Random(variant)
    n = rng.randint(1, 90) * 10**8
    return {"statement": f"Сколько байт занимает состояние fp32 Adam для {n} параметров?", "n": n}


NUMERIC = Step(
    id="t.num",
    make_task=_num_task,
    solve=lambda t: 16 * t["n"],
    answer=Number(),
    hint="Веса, градиенты и два момента Adam — по 4 байта.",
    solution=lambda t, ref: f"4 + 4 + 4 + 4 = 16 Б на параметр, итого **{ref}** Б.",
    traps=(Trap("params_only", "Вы учли только веса: забыты градиенты и моменты Adam.",
                wrong=lambda t, ref: 4 * t["n"]),),
)  # fmt: skip


def _kv_task(variant: int) -> dict:
    rng = random.Random(1000 + variant)
    t = {"layers": rng.choice([24, 28, 32]), "kv_heads": rng.choice([2, 4, 8]),
         "head_dim": rng.choice([64, 128]), "tokens": rng.choice([4096, 8192, 32768])}  # fmt: skip
    return {"statement": "Сколько байт на токен и ГиБ на все токены занимает KV-кэш в bf16?", **t}


def _kv(t: dict, kv_factor: int = 2, unit: float = 2**30) -> dict:
    per_token = kv_factor * t["layers"] * t["kv_heads"] * t["head_dim"] * 2
    return {"bytes_per_token": per_token, "total_gib": per_token * t["tokens"] / unit}


KV = Step(
    id="t.kv",
    make_task=_kv_task,
    solve=_kv,
    answer=Fields({"bytes_per_token": Number(integer=True), "total_gib": Number()}),
    hint="В кэше лежат и ключи, и значения.",
    solution=lambda t, ref: f"2 · L · h_kv · d · 2 Б = {ref['bytes_per_token']} Б на токен.",
    traps=(Trap("no_kv_factor", "Забыт множитель 2: в кэше лежат и K, и V.",
                wrong=lambda t, ref: _kv(t, kv_factor=1)),
           Trap("gb_not_gib", "Вы поделили на 10⁹ (ГБ), а спрашивали ГиБ (2³⁰ байт).",
                wrong=lambda t, ref: _kv(t, unit=1e9))),
)  # fmt: skip


@pytest.fixture(autouse=True)
def progress_path(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(path))
    return path


def _register(*steps):
    for step in steps:
        grading.register(step.exercise())


@pytest.fixture
def registry(monkeypatch):
    """Временный реестр с шагами-однодневками вместо шагов курса."""
    grading.exercise_ids()  # шаги курса уже зарегистрированы и во временный реестр не попадут
    monkeypatch.setattr(grading, "_registry", {})
    _register(NUMERIC, KV)


def _stored(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["exercises"]


# ---------------------------------------------------------------- заглушка и отзывы
def test_placeholder_is_not_attempted(registry, progress_path, capsys):
    assert repr(____) == "____ (заполните ответ)"
    assert grading.check("t.num", copy.deepcopy(____)).status == "not_attempted"
    for ex_id, answer in [("t.num", ____), ("t.kv", {"bytes_per_token": ____, "total_gib": 1.0}),
                          ("t.kv", [[____]])]:  # fmt: skip
        result = grading.check(ex_id, answer)
        assert result.status == "not_attempted" and not result
        assert "ещё не решено" in result.message
    assert "ещё не решено" in capsys.readouterr().out
    assert not progress_path.exists()
    grading.solution("t.num")
    assert "после первой попытки" in capsys.readouterr().out


def test_wrong_answer_gives_feedback(registry, capsys):
    ref = grading._reference("t.num")
    result = grading.check("t.num", ref * 1.37)
    assert result.status == "wrong" and not result
    assert "37 %" in result.message and "grading.hint" in result.message
    assert "37 %" in capsys.readouterr().out
    assert "отношение ровно 2³⁰" in grading.check("t.num", ref / 2**30).message
    assert "знак" in grading.check("t.num", -ref).message
    assert "ожидается число" in grading.check("t.num", "много").message.lower()
    kv = grading._reference("t.kv")
    wrong = grading.check("t.kv", {**kv, "total_gib": kv["total_gib"] * 3})
    assert wrong.status == "wrong" and "total_gib" in wrong.message


@pytest.mark.parametrize("step", [NUMERIC, KV], ids=lambda step: step.id)
def test_each_misconception_named(registry, step):
    assert [m.key for m in grading.misconceptions(step.id)] == [t.key for t in step.traps]
    for m in grading.misconceptions(step.id):
        result = grading.check(step.id, m.answer(grading.task(step.id)))
        assert result.status == "misconception" and not result
        assert result.misconception == m.key and result.message == m.message


def test_correct_answer_is_truthy(registry, progress_path):
    result = grading.check("t.num", np.float64(grading._reference("t.num")))
    assert result and result.status == "correct" and result.misconception is None
    assert grading.check("t.kv", grading._reference("t.kv"))
    entry = _stored(progress_path)["t.num"]
    assert entry["attempts"] == 1 and entry["solved"] and entry["last_status"] == "correct"
    assert "CheckResult(t.num: correct" in repr(result)


def test_malformed_answer(registry):
    result = grading.check("t.kv", {"bytes_per_token": 1})
    assert result.status == "malformed" and "не хватает — total_gib" in result.message


def test_solution_locked_until_first_attempt(registry, capsys):
    grading.solution("t.num")
    out = capsys.readouterr().out
    assert "после первой попытки" in out and "16 Б на параметр" not in out
    grading.check("t.num", 1)
    capsys.readouterr()
    grading.solution("t.num")
    out = capsys.readouterr().out
    assert "16 Б на параметр" in out and f"{grading._reference('t.num')}" in out
    grading.hint("t.kv")
    assert "и ключи, и значения" in capsys.readouterr().out


def test_solution_lock_is_per_variant_and_per_real_attempt(registry, progress_path, capsys):
    """Разбор открывает только ответ верного вида на текущем варианте; new_variant закрывает снова."""
    for not_an_attempt in (None, "шестнадцать", [1, 2], grading.____):
        grading.check("t.kv", not_an_attempt)
        capsys.readouterr()
        grading.solution("t.kv")
        assert "🔒" in capsys.readouterr().out, not_an_attempt
    assert not progress_path.exists()  # ни одна из них не записана как попытка
    grading.check("t.kv", {"bytes_per_token": 1, "total_gib": 2.0})  # неверно, но верного вида
    capsys.readouterr()
    grading.solution("t.kv")
    assert "Б на токен" in capsys.readouterr().out
    grading.new_variant("t.kv")
    capsys.readouterr()
    grading.solution("t.kv")
    out = capsys.readouterr().out
    assert "🔒" in out and "варианта 1" in out and "Б на токен" not in out
    grading.check("t.kv", {"bytes_per_token": 1, "total_gib": 2.0})
    capsys.readouterr()
    grading.solution("t.kv")
    assert f"{grading._reference('t.kv')['bytes_per_token']} Б на токен" in capsys.readouterr().out
    entry = _stored(progress_path)["t.kv"]
    assert (entry["attempts"], entry["variant"], entry["variant_attempts"]) == (2, 1, 1)


def test_reference_is_not_public():
    assert not hasattr(grading, "reference")


def test_progress_survives_restart(registry, progress_path):
    _register(replace(NUMERIC, id="12.2.6"))
    grading.check("12.2.6", 12345)
    grading.new_variant("12.2.6")
    grading.check("12.2.6", 54321)  # попытка на новом варианте: разбор открыт и после перезапуска
    script = textwrap.dedent("""
        from course_utils import grading
        grading.solution("12.2.6")  # шаг курса: попытка записана на варианте 1 однодневки
        row = grading.progress().set_index("id").loc["12.2.6"]
        print("attempts", row["попыток"], "variant", row["вариант"])
    """)
    env = {**os.environ, "COURSE_PROGRESS_PATH": str(progress_path)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "📖 Разбор 12.2.6" in proc.stdout and "attempts 2 variant 1" in proc.stdout


@pytest.mark.parametrize(
    "content", ["{не json", "[1, 2]", '{"format": 99, "exercises": {}}', '{"format": 1}']
)
def test_corrupt_progress_is_set_aside(registry, progress_path, content):
    progress_path.write_text(content, encoding="utf-8")
    with pytest.warns(grading.ProgressWarning, match="повреждён"):
        result = grading.check("t.num", 1)
    assert result.status == "wrong"
    aside = list(progress_path.parent.glob("progress.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text(encoding="utf-8") == content
    assert _stored(progress_path)["t.num"]["attempts"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # новый файл исправен: больше никаких предупреждений
        grading.check("t.num", 2)
    assert _stored(progress_path)["t.num"]["attempts"] == 2


def _write_progress(path: Path, exercises: dict) -> str:
    text = json.dumps({"format": 1, "exercises": exercises}, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    return text


def test_bad_entry_is_reset_alone(registry, progress_path, capsys):
    _register(replace(NUMERIC, id="12.2.6"), replace(KV, id="12.2.7"))
    good = {"attempts": 2, "solved": False, "variant": 1,
            "last_attempt": "2026-05-04T10:20:00+03:00", "last_status": "wrong"}  # fmt: skip
    original = _write_progress(progress_path, {"12.2.6": good, "12.2.7": {"attempts": -1}})
    with pytest.warns(grading.ProgressWarning) as caught:
        rows = grading.progress().set_index("id")
    (message,) = [str(w.message) for w in caught]
    assert "12.2.7" in message and "attempts = -1" in message and "12.2.6" not in message
    assert rows.loc["12.2.6", "статус"] == "в работе" and rows.loc["12.2.6", "попыток"] == 2
    assert rows.loc["12.2.6", "вариант"] == 1 and rows.loc["12.2.7", "статус"] == "не начато"
    (aside,) = progress_path.parent.glob("progress.json.corrupt-*")  # копия — одна, исходная
    assert aside.read_text(encoding="utf-8") == original and aside.name in message
    # у записи прежней версии нет variant_attempts: попытки засчитываются текущему варианту
    assert _stored(progress_path) == {"12.2.6": {**good, "variant_attempts": 2},
                                      "12.2.7": grading._blank()}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # файл исправлен: ни предупреждений, ни новых копий
        assert grading.task("12.2.6") == grading.task("12.2.6", 1)
        grading.solution("12.2.6")
        assert "16 Б на параметр" in capsys.readouterr().out
        grading.solution("12.2.7")
        assert "после первой попытки" in capsys.readouterr().out
    assert len(list(progress_path.parent.glob("progress.json.corrupt-*"))) == 1


BLANK = {"attempts": 0, "solved": False, "variant": 0, "last_attempt": None, "last_status": None}
BAD_ENTRIES = [  # (запись t.num в файле, что названо в предупреждении, запись после починки)
    ({"attempts": -1, "variant": 2}, "attempts = -1", {**BLANK, "variant": 2}),
    ({"attempts": 1.5}, "attempts = 1.5", BLANK),
    ({"attempts": True}, "attempts = true", BLANK),
    ({"attempts": "3", "solved": True, "last_status": "correct"}, 'attempts = "3"',
     {**BLANK, "attempts": 1, "solved": True, "last_status": "correct"}),
    ({"attempts": 4, "solved": "yes"}, 'solved = "yes"', {**BLANK, "attempts": 4}),
    ({"attempts": 1, "variant": -2}, "variant = -2", {**BLANK, "attempts": 1}),
    ({"attempts": 1, "variant": None}, "variant = null", {**BLANK, "attempts": 1}),
    ({"attempts": 1, "last_attempt": "вчера"}, 'last_attempt = "вчера"', {**BLANK, "attempts": 1}),
    ({"attempts": 1, "last_attempt": 5}, "last_attempt = 5", {**BLANK, "attempts": 1}),
    ({"attempts": 1, "last_status": "great"}, 'last_status = "great"', {**BLANK, "attempts": 1}),
    ({"attempts": 1, "solved": 1, "variant": -1}, "поля solved = 1, variant = -1",
     {**BLANK, "attempts": 1}),
    (5, "не словарь: 5", BLANK),
]  # fmt: skip


@pytest.mark.parametrize("bad, named, repaired", BAD_ENTRIES, ids=range(len(BAD_ENTRIES)))
def test_each_field_is_checked_per_entry(registry, progress_path, bad, named, repaired):
    kept = {"attempts": 3, "solved": True, "variant": 0, "last_attempt": None,
            "last_status": "correct"}  # fmt: skip
    _write_progress(progress_path, {"t.num": bad, "t.kv": kept})
    with pytest.warns(grading.ProgressWarning, match="t.num") as caught:
        assert grading.task("t.kv") == grading.task("t.kv", 0)
    assert named in str(caught[0].message) and "t.kv" not in str(caught[0].message)
    derived = {"variant_attempts": repaired["attempts"]}  # поля нет в файле прежней версии
    assert _stored(progress_path) == {"t.num": {**repaired, **derived},
                                      "t.kv": {**kept, "variant_attempts": 3}}  # fmt: skip


def _wait_for(paths: list[Path], procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline and all(proc.poll() is None for proc in procs)
        time.sleep(0.01)


def test_two_kernels_lose_no_attempts(progress_path, tmp_path):
    """Два процесса одновременно записывают по N попыток в один файл: записаны все 2N."""
    n, kernels = 30, 2
    worker = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from course_utils import grading
        from course_utils.exercises.answers import Number
        from course_utils.exercises.step import Step
        grading.register(Step("t.race", lambda v: {"statement": "s"}, lambda t: 1, Number(), "",
                              lambda t, ref: "разбор").exercise())
        Path(f"{sys.argv[1]}.ready{sys.argv[3]}").touch()
        while not Path(sys.argv[1]).exists():
            time.sleep(0.002)
        for _ in range(int(sys.argv[2])):
            grading.check("t.race", 0)
    """)
    go = tmp_path / "go"
    env = {**os.environ, "COURSE_PROGRESS_PATH": str(progress_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", worker, str(go), str(n), str(i)], cwd=REPO,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(kernels)
    ]  # fmt: skip
    _wait_for([tmp_path / f"go.ready{i}" for i in range(kernels)], procs)
    go.touch()  # оба процесса импортировали всё и стартуют вместе
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert _stored(progress_path)["t.race"]["attempts"] == n * kernels


@pytest.mark.skipif(sys.platform == "win32", reason="flock есть только в Linux и macOS")
def test_writer_waits_for_lock_held_by_another_process(progress_path):
    import fcntl

    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from course_utils import grading
        from course_utils.exercises.answers import Number
        from course_utils.exercises.step import Step
        grading.register(Step("t.wait", lambda v: {"statement": "s"}, lambda t: 1, Number(), "",
                              lambda t, ref: "разбор").exercise())
        Path(sys.argv[1]).touch()
        grading.check("t.wait", 0)
    """)
    ready = progress_path.with_name("ready")
    env = {**os.environ, "COURSE_PROGRESS_PATH": str(progress_path)}
    lock_path = progress_path.with_name(".progress.json.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-c", script, str(ready)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        _wait_for([ready], [proc])
        time.sleep(0.5)  # без блокировки check записал бы попытку за миллисекунды
        assert proc.poll() is None and not progress_path.exists()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert _stored(progress_path)["t.wait"]["attempts"] == 1


def test_without_fcntl_progress_is_still_recorded(registry, progress_path, monkeypatch):
    monkeypatch.setattr(grading, "_fcntl", None)  # как в Windows
    grading.check("t.num", 1)
    grading.new_variant("t.num")
    grading.check("t.num", 2)
    assert _stored(progress_path)["t.num"]["attempts"] == 2
    assert _stored(progress_path)["t.num"]["variant"] == 1
    assert sorted(p.name for p in progress_path.parent.iterdir()) == ["progress.json"]


def test_leftover_temp_files_are_removed(registry, progress_path):
    stale = progress_path.with_name(".progress.json.k2j4d9x1.tmp")  # прерванная запись
    live = progress_path.with_name(".progress.json.a8f3b2c7.tmp")  # чужая запись идёт сейчас
    other = progress_path.with_name(".notes.json.k2j4d9x1.tmp")  # не наш файл
    for tmp in (stale, live, other):
        tmp.write_text('{"format": 1, "exer', encoding="utf-8")
    old = time.time() - 60
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    grading.check("t.num", 1)
    assert not stale.exists() and live.exists() and other.exists()
    assert _stored(progress_path)["t.num"]["attempts"] == 1


def test_directory_is_fsynced_after_rename(registry, progress_path, monkeypatch):
    import stat

    events, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace_(src, dst):
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace_)
    grading.check("t.num", 1)
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_unwritable_location_keeps_progress_in_memory(registry, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(blocker / "progress.json"))
    with pytest.warns(grading.ProgressWarning, match="Не удалось сохранить"):
        grading.check("t.num", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # второй раз не предупреждаем
        grading.check("t.num", 2)
    capsys.readouterr()
    grading.solution("t.num")
    assert "16 Б на параметр" in capsys.readouterr().out
    row = grading.progress().set_index("id")
    assert len(row) == 21
    grading._memory.clear()


def test_unreadable_progress_path_does_not_crash(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(tmp_path))  # это папка, а не файл
    with pytest.warns(grading.ProgressWarning):
        assert grading.check("t.num", grading._reference("t.num"))
    capsys.readouterr()
    grading.solution("t.num")
    assert "16 Б на параметр" in capsys.readouterr().out
    grading._memory.clear()


def test_atomic_write_leaves_only_the_progress_file(registry, progress_path):
    for answer in (1, 2, grading._reference("t.num")):
        grading.check("t.num", answer)
    lock = [".progress.json.lock"] if sys.platform != "win32" else []  # блокировка, не данные
    assert sorted(p.name for p in progress_path.parent.iterdir()) == [*lock, "progress.json"]
    data = json.loads(progress_path.read_text(encoding="utf-8"))
    assert data["format"] == 1
    assert set(data["exercises"]["t.num"]) == {
        "attempts", "solved", "variant", "variant_attempts", "last_attempt", "last_status"
    }  # fmt: skip


def test_progress_path_read_at_call_time(registry, tmp_path, monkeypatch):
    other = tmp_path / "sub" / "other.json"
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(other))
    grading.check("t.num", 1)
    assert _stored(other)["t.num"]["attempts"] == 1


class _Nasty:
    def __eq__(self, other):
        raise RuntimeError("eq")

    def __bool__(self):
        raise RuntimeError("bool")

    def __getattr__(self, name):
        raise RuntimeError(name)

    def __hash__(self):
        return 1


def _cyclic():
    items = [1]
    items.append(items)
    return items


GARBAGE = [object(), lambda: 1, [[{"a": object()}]], float("nan"), float("inf"), "строка", "",
           None, b"bytes", {1, 2}, (), np.array([1.0, 2.0]), np.float64("nan"), _Nasty(),
           [_Nasty()], {"bytes_per_token": _Nasty(), "total_gib": _Nasty()}, _cyclic(), 10**400,
           1 + 2j, True, {"bytes_per_token": "a", "total_gib": None}, print]  # fmt: skip


@pytest.mark.parametrize("answer", GARBAGE, ids=range(len(GARBAGE)))
@pytest.mark.parametrize("ex_id", ["t.num", "t.kv"])
def test_garbage_never_raises(registry, ex_id, answer, capsys):
    result = grading.check(ex_id, answer)
    assert result.status in {"wrong", "malformed"} and not result
    assert result.message and capsys.readouterr().out


class _RaisingSame(Number):
    def same(self, expected, given):
        raise KeyError("optimizer")


class _OwnMismatch(Number):
    def mismatch(self, expected, given):
        return f"свой отзыв: {given}"


class _RaisingMismatch(Number):
    def mismatch(self, expected, given):
        return 1 / 0


def test_raising_compare_is_malformed(registry):
    _register(replace(NUMERIC, id="t.bad", answer=_RaisingSame()))
    result = grading.check("t.bad", 5)
    assert result.status == "malformed" and "не удалось сравнить" in result.message
    assert "KeyError" in result.message and "optimizer" in result.message


# ---------------------------------------------------------------- варианты
def test_task_is_deterministic_per_variant(registry):
    for variant in range(5):
        assert grading.task("t.num", variant) == grading.task("t.num", variant)
        assert grading.task("t.kv", variant) == grading.task("t.kv", variant)
    assert len({grading.task("t.num", v)["n"] for v in range(10)}) > 1
    assert grading.task("t.num") == grading.task("t.num", 0)


def test_new_variant_changes_numbers_and_check_uses_it(registry, progress_path, capsys):
    old_task, old_ref = grading.task("t.num"), grading._reference("t.num")
    fresh = grading.new_variant("t.num")
    assert "вариант 1" in capsys.readouterr().out
    assert fresh == grading.task("t.num") == grading.task("t.num", 1)
    assert fresh["n"] != old_task["n"]
    assert _stored(progress_path)["t.num"]["variant"] == 1
    assert not grading.check("t.num", old_ref)
    assert grading.check("t.num", grading._reference("t.num"))
    assert grading._reference("t.num", 0) == old_ref


def test_evaluate_records_nothing(registry, progress_path):
    assert grading.evaluate("t.kv", grading._reference("t.kv", 3), variant=3)
    assert grading.evaluate("t.kv", ____).status == "not_attempted"
    assert not progress_path.exists()


# ---------------------------------------------------------------- реестр
def test_unknown_id_is_value_error(registry):
    for call in (lambda: grading.check("t.nope", 1), lambda: grading.task("t.nope"),
                 lambda: grading.solution("t.nope"), lambda: grading.hint(None)):  # fmt: skip
        with pytest.raises(ValueError, match="t.num"):
            call()
    with pytest.raises(ValueError, match="ещё не вошло"):
        grading.check("12.5.13", 1)


def test_register_rules(registry):
    with pytest.raises(ValueError, match="уже зарегистрировано"):
        _register(NUMERIC)
    with pytest.raises(TypeError):
        grading.register("t.num")
    with pytest.raises(ValueError, match="ключи повторяются"):
        _register(replace(KV, id="t.dup", traps=(KV.traps[0], KV.traps[0])))
    assert grading.exercise_ids() == ["t.num", "t.kv"]


def test_shipped_registry_uses_course_ids():
    from course_utils import exercises

    assert exercises.LESSON_MODULES == tuple(f"lesson_12_{i}" for i in range(1, 6))
    assert exercises.LOAD_ERRORS == {}, f"модули уроков не загрузились: {exercises.LOAD_ERRORS}"
    ids = grading.exercise_ids()
    assert set(ids) <= set(grading.COURSE_STEPS)
    assert ids == [key for key in grading.COURSE_STEPS if key in ids]


def test_course_steps_table():
    expected = ["12.1.6", "12.1.7", *(f"12.2.{k}" for k in range(6, 9)),
                *(f"12.3.{k}" for k in range(6, 10)), *(f"12.4.{k}" for k in range(6, 10)),
                *(f"12.5.{k}" for k in range(6, 14))]  # fmt: skip
    assert list(grading.COURSE_STEPS) == expected
    assert all(topic and topic.strip() for topic in grading.COURSE_STEPS.values())


def test_progress_table(registry):
    _register(replace(NUMERIC, id="12.2.6"), replace(NUMERIC, id="12.2.7"))
    grading.check("12.2.6", grading._reference("12.2.6"))
    table = grading.progress()
    assert len(table) == 21 and list(table["id"]) == list(grading.COURSE_STEPS)
    assert {"id", "тема", "попыток", "решено", "вариант", "последняя попытка"} <= set(table.columns)
    rows = table.set_index("id")
    assert rows.loc["12.2.6", "статус"] == "решено" and rows.loc["12.2.6", "попыток"] == 1
    assert rows.loc["12.2.6", "решено"] == "да" and rows.loc["12.1.6", "решено"] == "нет"
    assert rows.loc["12.2.7", "статус"] == "не начато"
    assert rows.loc["12.5.13", "статус"] == "нет в этой версии"


# ---------------------------------------------------------------- показ в ноутбуке
class _FakeShell:
    execution_count = 5


def test_check_result_is_not_displayed_twice(registry, monkeypatch, capsys):
    shell = _FakeShell()
    monkeypatch.setattr(grading, "_shell", lambda: shell)
    result = grading.check("t.num", 1)
    assert "пока неверно" in capsys.readouterr().out
    result._ipython_display_()  # последнее выражение той же ячейки: не повторяем отзыв
    assert capsys.readouterr().out == ""
    shell.execution_count = 6
    result._ipython_display_()  # показ в другой ячейке: отзыв виден
    assert "пока неверно" in capsys.readouterr().out
    result._ipython_display_()
    assert "пока неверно" in capsys.readouterr().out


def test_markdown_under_a_kernel(registry, monkeypatch):
    display_mod = pytest.importorskip("IPython.display")
    shown = []
    shell = _FakeShell()
    shell.kernel = object()
    monkeypatch.setattr(grading, "_shell", lambda: shell)
    monkeypatch.setattr(display_mod, "display", lambda obj, raw=False: shown.append((obj, raw)))
    grading.check("t.num", ____)
    ((bundle, raw),) = shown
    assert raw and "**" in bundle["text/markdown"] and "ещё не решено" in bundle["text/plain"]


def test_custom_mismatch_feedback_and_its_failure_fall_back(registry):
    _register(replace(NUMERIC, id="t.own", answer=_OwnMismatch()))
    _register(replace(NUMERIC, id="t.broken", answer=_RaisingMismatch()))
    res = grading.evaluate("t.own", -12345.0)
    assert res.status == "wrong" and "свой отзыв: -12345.0" in res.message
    res = grading.evaluate("t.broken", -12345.0)
    assert res.status == "wrong" and "Ответ не совпал" in res.message
