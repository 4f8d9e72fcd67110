"""Тесты course_utils.multiproc: настоящие процессы ОС под torch.distributed (gloo на CPU).

Каждый запуск стоит ~3 с на 2 ядрах (дочерние процессы импортируют torch), поэтому процессных
тестов немного: успешный all-reduce, сбой ранга, таймаут, путь torchrun и режим запускателя CLI.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import multiproc_entries as entries
import pytest

from course_utils import multiproc
from course_utils.fmt import NBSP
from course_utils.multiproc import LaunchResult, RankFailure, launch, launcher

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS = str(
    Path(__file__).resolve().parent
)  # здесь multiproc_entries: ранги находят его по PYTHONPATH
ENTRIES = "multiproc_entries"
SMOKE = f"{ENTRIES}:smoke_allreduce"

try:
    import psutil
except ImportError:  # psutil необязателен: тогда проверяем только os.kill(pid, 0)
    psutil = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if psutil is not None:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return True


def _processes_mentioning(text: str) -> list[int]:
    """pid процессов, в командной строке которых встречается text (нужен psutil)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info["pid"] != os.getpid() and any(text in part for part in cmdline):
            found.append(proc.info["pid"])
    return found


def _assert_all_gone(result: LaunchResult) -> None:
    assert len(result.pids) == result.nprocs
    assert not [pid for pid in result.pids if _alive(pid)]
    if psutil is not None:
        assert _processes_mentioning(result.run_dir) == []


# ----------------------------------------------------------------------------- настоящие процессы


def test_smoke_allreduce_two_processes(tmp_path, monkeypatch):
    # Ячейка ноутбука работает из notebooks/: course_utils должен импортироваться из любой cwd.
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    res = launch(
        SMOKE,
        nprocs=2,
        args={"numel": 256, "repeats": 3},
        timeout_s=60,
        run_dir=tmp_path / "run",
    )
    elapsed = time.monotonic() - start
    assert res.ok and res.status == "ok", res.summary()
    assert res.failures == []
    assert res.backend == multiproc.default_backend(2)
    assert [r["rank"] for r in res.results] == [0, 1]
    for r in res.results:
        assert r["value"] == 3.0 and r["expected"] == 3.0
        assert r["world_size"] == 2 and r["numel"] == 256 and r["bytes"] == 1024
        assert len(r["times_s"]) == 3 and r["median_s"] > 0
    pids = [r["pid"] for r in res.results]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert pids == res.pids
    assert res.exitcodes == [0, 0]
    assert sorted(p.name for p in (tmp_path / "run").glob("rank_*.json")) == [
        "rank_0.json",
        "rank_1.json",
    ]
    text = str(res)
    assert f"2{NBSP}процесса" in text and res.backend in text and "успешно" in text
    assert res.raise_for_status() is res
    assert elapsed < 30
    _assert_all_gone(res)


def test_failing_rank_is_reported_and_others_stopped(tmp_path):
    start = time.monotonic()
    res = launch(
        f"{ENTRIES}:fail_on_rank",
        nprocs=2,
        args={"bad_rank": 1},
        timeout_s=40,
        run_dir=tmp_path / "run",
    )
    elapsed = time.monotonic() - start
    assert not res.ok and res.status == "failed"
    assert elapsed < 25  # не ждём таймаута: остальные ранги останавливаются после паузы
    first = res.failures[0]
    assert first.rank == 1 and not first.killed
    assert first.exitcode not in (0, None)
    assert "RuntimeError: намеренная ошибка на ранге 1" in first.stderr_tail
    assert len(first.stderr_tail.splitlines()) <= multiproc.STDERR_TAIL_LINES
    assert res.results[1] is None
    assert {f.rank for f in res.failures} | {
        r for r, x in enumerate(res.results) if x is not None
    } == {0, 1}
    summary = res.summary()
    assert "Ранг 1: код выхода" in summary and "намеренная ошибка на ранге 1" in summary
    with pytest.raises(RuntimeError, match="намеренная ошибка на ранге 1"):
        res.raise_for_status()
    _assert_all_gone(res)


def test_timeout_kills_whole_process_tree(tmp_path):
    timeout_s = 8.0  # дочерним процессам нужно ~3 с на импорт torch, чтобы успеть породить «внуков»
    start = time.monotonic()
    res = launch(
        f"{ENTRIES}:sleep_forever",
        nprocs=2,
        args={"spawn_grandchild": True},
        timeout_s=timeout_s,
        run_dir=tmp_path / "run",
    )
    elapsed = time.monotonic() - start
    assert res.status == "timeout" and not res.ok
    assert timeout_s <= elapsed < timeout_s + 10
    assert sorted(f.rank for f in res.failures) == [0, 1]
    assert all(f.killed and f.exitcode == -signal.SIGKILL for f in res.failures)
    assert res.results == [None, None]
    assert "ТАЙМАУТ" in res.summary() and "sleep_forever" in res.summary()
    grandchildren = [int(p.read_text()) for p in (tmp_path / "run").glob("grandchild_*.pid")]
    assert len(grandchildren) == 2, "ранги не успели породить внуков: увеличьте timeout_s"
    _assert_all_gone(res)
    assert not [pid for pid in grandchildren if _alive(pid)]


@pytest.mark.parametrize("mode, exitcode", [("exit0", 0), ("sigkill", -signal.SIGKILL)])
def test_rank_that_vanishes_without_result_is_reported_at_once(tmp_path, mode, exitcode):
    # Ранг 1 исчезает без результата (sys.exit(0) или SIGKILL), ранг 0 ждёт его в barrier.
    # Сбой должен быть виден сразу, а не по общему дедлайну в 120 с.
    start = time.monotonic()
    res = launch(
        f"{ENTRIES}:fail_on_rank",
        nprocs=2,
        args={"bad_rank": 1, "mode": mode},
        timeout_s=120,
        run_dir=tmp_path / "run",
    )
    elapsed = time.monotonic() - start
    assert res.status == "failed" and not res.ok, res.summary()
    assert elapsed < 30, f"сбой замечен через {elapsed:.0f} с"
    first = res.failures[0]
    assert first.rank == 1 and not first.killed and first.exitcode == exitcode
    assert res.results[1] is None
    if mode == "exit0":
        assert "Ранг 1: вышел с кодом 0, но не записал результат" in res.summary()
        assert "вызвала sys.exit(0)" in first.stderr_tail
    else:
        assert "Ранг 1: убит сигналом SIGKILL" in res.summary()
    _assert_all_gone(res)


_LAUNCHER = """
import sys
from course_utils.multiproc import launch
launch("multiproc_entries:sleep_forever", nprocs=2, args={"spawn_grandchild": True},
       timeout_s=300, run_dir=sys.argv[1])
"""


def test_launcher_killed_takes_ranks_and_grandchildren_down(tmp_path):
    # Запускатель (как ядро Colab под OOM killer) получает SIGKILL посреди запуска: ни ранги,
    # ни их дочерние процессы не должны пережить его.
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, str(run_dir)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), TESTS])},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(run_dir.glob("grandchild_*.pid"))) < 2:
            assert launcher.poll() is None, "запускатель завершился раньше времени"
            assert time.monotonic() < deadline, "ранги не породили внуков за 60 с"
            time.sleep(0.2)
        ranks = [p.pid for p in psutil.Process(launcher.pid).children()]
        grandchildren = [int(p.read_text()) for p in run_dir.glob("grandchild_*.pid")]
        assert len(ranks) == 2 and all(_alive(pid) for pid in ranks + grandchildren)
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        # ранги, внуки и сторожа рангов (они тоже упоминают run_dir) — на загруженной машине
        # сторож может выходить на доли секунды позже рангов, поэтому ждём всех с тем же сроком
        while [pid for pid in ranks + grandchildren if _alive(pid)] or _processes_mentioning(
            str(run_dir)
        ):
            assert time.monotonic() < deadline, "процессы пережили запускатель"
            time.sleep(0.1)
    finally:
        for pid in _processes_mentioning(str(run_dir)):  # уборка, если тест упал
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)


def test_torchrun_runs_the_same_entry(tmp_path):
    result_dir = tmp_path / "torchrun"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), TESTS])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "course_utils.multiproc",
        "--entry",
        SMOKE,
        "--result-dir",
        str(result_dir),
        "--args",
        json.dumps({"numel": 16, "repeats": 2}),
        "--backend",
        "gloo",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("torchrun не завершился за 90 с:\n" + out.decode(errors="replace")[-3000:])
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    files = sorted(p.name for p in result_dir.glob("rank_*.json"))
    assert files == ["rank_0.json", "rank_1.json"]
    for rank in (0, 1):
        data = json.loads((result_dir / f"rank_{rank}.json").read_text(encoding="utf-8"))
        assert data["rank"] == rank and data["world_size"] == 2 and data["value"] == 3.0


def test_cli_without_rank_acts_as_launcher(tmp_path, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    rc = multiproc.main(
        [
            "--entry",
            SMOKE,
            "--nprocs",
            "2",
            "--backend",
            "gloo",
            "--args",
            '{"numel": 8, "repeats": 1}',
            "--result-dir",
            str(tmp_path / "cli"),
            "--timeout-s",
            "60",
        ]
    )
    assert rc == 0
    assert "успешно" in capsys.readouterr().out
    assert (tmp_path / "cli" / "rank_1.json").exists()


# ----------------------------------------------------------------------------- проверка ввода


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"entry": "course_utils.multiproc.smoke_allreduce"}, "двоеточие"),
        ({"entry": "a:b:c"}, "двоеточие"),
        ({"entry": 42}, "entry"),
        ({"entry": "course_utils.no_such_module_xyz:f"}, "не удалось импортировать"),
        ({"entry": f"{ENTRIES}:no_such_function"}, "нет функции"),
        ({"entry": "course_utils.multiproc:BACKENDS"}, "не является функцией"),
        ({"entry": "__main__:f"}, "ноутбука"),
        ({"entry": SMOKE, "nprocs": 0}, "nprocs"),
        ({"entry": SMOKE, "nprocs": 65}, "nprocs"),
        ({"entry": SMOKE, "nprocs": 2.0}, "nprocs"),
        ({"entry": SMOKE, "timeout_s": -1}, "timeout_s"),
        ({"entry": SMOKE, "timeout_s": 0}, "timeout_s"),
        ({"entry": SMOKE, "timeout_s": float("inf")}, "timeout"),
        ({"entry": SMOKE, "args": {"numel": object()}}, "JSON"),
        ({"entry": SMOKE, "args": {"x": float("nan")}}, "JSON"),
        ({"entry": SMOKE, "args": [1]}, "args"),
        ({"entry": SMOKE, "args": {"rank": 1}}, "args"),
        ({"entry": SMOKE, "args": {"bogus": 1}}, "bogus"),
        ({"entry": SMOKE, "backend": "mpi"}, "backend"),
    ],
)
def test_bad_input_rejected_before_any_process_starts(tmp_path, kwargs, fragment):
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError) as err:
        launch(**kwargs, run_dir=run_dir)
    assert fragment in str(err.value)
    assert not run_dir.exists()  # каталог создаётся только после всех проверок


def test_nccl_without_enough_gpus_is_rejected(tmp_path):
    import torch

    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="nccl"):
        launch(
            SMOKE,
            nprocs=n_gpu + 1,
            backend="nccl",
            run_dir=tmp_path / "run",
        )


def test_entry_point_arguments_validated():
    with pytest.raises(ValueError, match="numel"):
        entries.smoke_allreduce(0, 2, "gloo", numel=0)
    with pytest.raises(ValueError, match="repeats"):
        entries.smoke_allreduce(0, 2, "gloo", repeats=0)
    with pytest.raises(ValueError, match="bad_rank"):
        entries.fail_on_rank(0, 2, "gloo", bad_rank=2)
    with pytest.raises(ValueError, match="mode"):
        entries.fail_on_rank(0, 2, "gloo", mode="segfault")
    with pytest.raises(ValueError, match="backend"):
        multiproc.local_device("mpi")


# ----------------------------------------------------------------------------- без процессов


def _fake_result(status, failures, results=None):
    return LaunchResult(
        ok=status == "ok",
        status=status,
        nprocs=3,
        backend="gloo",
        wall_s=1.5,
        results=results or [None, None, None],
        failures=failures,
        entry="pkg.mod:fn",
        timeout_s=10.0,
    )


def test_summary_names_processes_backend_and_first_failure():
    tail = "Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: плохо"
    res = _fake_result(
        "failed",
        [
            RankFailure(rank=2, exitcode=1, stderr_tail=tail),
            RankFailure(rank=0, exitcode=-9, stderr_tail="", killed=True),
            RankFailure(rank=1, exitcode=-11, stderr_tail=""),
        ],
    )
    text = res.summary()
    assert text.startswith(f"Запуск pkg.mod:fn: 3{NBSP}процесса, бэкенд gloo — ОШИБКА")
    assert "Ранг 2: код выхода 1" in text and "ValueError: плохо" in text
    assert "Ранг 0 (после сбоя ранга 2): остановлен запускателем" in text
    assert "убит сигналом SIGSEGV" in text
    assert str(res) == text and "status='failed'" in repr(res)
    with pytest.raises(RuntimeError, match="ValueError: плохо"):
        res.raise_for_status()


def test_hang_frames_from_faulthandler_dump():
    dump = """Thread 0x00007f01 (most recent call first):
  File "/x/threading.py", line 320 in wait
Current thread 0x00007f00 (most recent call first):
  File "/x/distributed_c10d.py", line 5356 in barrier
  File "/x/course_utils/multiproc/smoke.py", line 80 in fail_on_rank
  File "/x/course_utils/multiproc/launcher.py", line 700 in _child_main
  File "/x/course_utils/multiproc/launcher.py", line 720 in main
  File "/x/course_utils/multiproc/__main__.py", line 7 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
    frames = launcher._hang_frames(dump)
    assert frames == [
        'File "/x/distributed_c10d.py", line 5356 in barrier',
        'File "/x/course_utils/multiproc/smoke.py", line 80 in fail_on_rank',
    ]
    text = RankFailure(rank=0, exitcode=-9, stderr_tail=dump, killed=True).describe()
    assert "где он ждал" in text and "in barrier" in text
