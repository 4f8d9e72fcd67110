"""Уровень C: запускатель ``launch`` — ранги как отдельные процессы ОС под ``torch.distributed``.

``launch("пакет.модуль:функция", nprocs, args)`` выдаёт каждому процессу окружение как у
``torchrun`` (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, свободный MASTER_PORT…), ждёт их с
дедлайном и возвращает ``LaunchResult``: результаты рангов (``<run_dir>/rank_<r>.json``), а при
сбое — код выхода и хвост stderr. По таймауту или после сбоя ранга остальные убиваются целой
группой процессов; если умер сам запускатель, группу ранга убивает его сторож — сирот нет.
Те же точки входа — под ``torchrun -m course_utils.multiproc --entry …``; без RANK эта команда
сама работает как ``launch``. Бэкенд: "nccl", если GPU не меньше процессов, иначе "gloo".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils import atomic
from course_utils.args import choice, integer, path, positive
from course_utils.csv_tables import REPO_ROOT
from course_utils.fmt import count

BACKENDS = ("gloo", "nccl")
STDERR_TAIL_LINES = 30
_FAILURE_GRACE_S = 1.0  # сколько ждать остальные ранги после первого сбоя, прежде чем убить, с
_STACK_DUMP_WAIT_S = 0.3  # сколько ждать стек зависших процессов (SIGUSR1) перед SIGKILL, с
_GROUP_EXIT_WAIT_S = 5.0  # сколько ждать, пока убитые группы процессов исчезнут, с
_RESERVED_ARGS = ("rank", "world_size", "backend")


# ----------------------------------------------------------------------------- результаты


@dataclass
class RankFailure:
    """Сбой одного ранга: код выхода (отрицательный — убит сигналом) и хвост его stderr."""

    rank: int
    exitcode: int | None
    stderr_tail: str
    killed: bool = False  # True: ранг остановил запускатель (таймаут или сбой другого ранга)

    def describe(self, max_lines: int | None = None, note: str = "") -> str:
        """По-русски: ранг, код выхода или сигнал и хвост stderr (≤ max_lines строк); у ранга,
        убитого запускателем, вместо хвоста — где он ждал (дамп стека faulthandler)."""
        who = f"Ранг {self.rank}{note}"
        code = self.exitcode
        if self.killed:
            frames = _hang_frames(self.stderr_tail)
            where = ", где он ждал (самый глубокий вызов первым):" if frames else ""
            head, lines = f"{who}: остановлен запускателем (SIGKILL){where}", frames[:max_lines]
        else:
            head = f"{who}: код выхода {code}"
            if code is not None and code < 0:
                head = f"{who}: убит сигналом {_signal_name(-code)}"
            elif code == 0:
                head = f"{who}: вышел с кодом 0, но не записал результат"
            lines = [ln for ln in self.stderr_tail.splitlines() if ln.strip()]
            if max_lines is not None:
                lines = lines[-max_lines:] if max_lines > 0 else []
        return "\n".join([head, *("    " + ln for ln in lines)])


@dataclass(repr=False)
class LaunchResult:
    """Итог запуска: статус "ok" | "failed" | "timeout", результаты по рангам и сбои; время — с."""

    ok: bool
    status: str
    nprocs: int
    backend: str
    wall_s: float
    results: list[dict | None]
    failures: list[RankFailure] = field(default_factory=list)
    entry: str = ""
    run_dir: str = ""
    pids: list[int] = field(default_factory=list)
    exitcodes: list[int | None] = field(default_factory=list)
    timeout_s: float = math.nan

    def summary(self) -> str:
        """Сводка по-русски: функция, число процессов, бэкенд, время; при сбое — ранги и ошибки."""
        procs = count(self.nprocs, "процесс", "процесса", "процессов")
        head = f"Запуск {self.entry}: {procs}, бэкенд {self.backend}"
        if self.status == "ok":
            return f"{head} — успешно за {self.wall_s:.2f} с."
        if self.status == "timeout":
            stop = "все процессы остановлены (SIGKILL)"
            lines = [f"{head} — ТАЙМАУТ: не уложились в {self.timeout_s:g} с, {stop}."]
            lines += [f.describe(max_lines=3) for f in self.failures]
        else:
            lines = [f"{head} — ОШИБКА за {self.wall_s:.2f} с."]
            lines += [f.describe() for f in self.failures[:1]]
            note = f" (после сбоя ранга {self.failures[0].rank})" if self.failures else ""
            lines += [f.describe(max_lines=3, note=note) for f in self.failures[1:]]
        if self.run_dir:
            lines.append(f"Журналы процессов: {self.run_dir}")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return (
            f"LaunchResult(status={self.status!r}, nprocs={self.nprocs}, "
            f"backend={self.backend!r}, wall_s={self.wall_s:.2f}, failures={len(self.failures)})"
        )

    def raise_for_status(self) -> LaunchResult:
        """Бросает RuntimeError со сводкой, если запуск не успешен; иначе возвращает self."""
        if not self.ok:
            raise RuntimeError(self.summary())
        return self


_THREAD_HEADER = re.compile(
    r"^(Current thread|Thread) 0x[0-9a-fA-F]+ .*\(most recent call first\):"
)


def _hang_frames(stderr_text: str) -> list[str]:
    """Кадры главного потока из дампа faulthandler (самый глубокий вызов первым)."""
    blocks: list[list[str]] = []
    for line in map(str.strip, stderr_text.splitlines()):
        if _THREAD_HEADER.match(line):
            blocks.append([])
        elif blocks and line.startswith("File "):
            blocks[-1].append(line)
    main_blocks = [b for b in blocks if any("_run_module_as_main" in ln for ln in b)]
    if not main_blocks:
        return []
    frames = [ln for ln in main_blocks[-1] if "<frozen runpy>" not in ln]
    internal = ("in <module>", "in main", "in _child_main")
    return [ln for ln in frames if not any(k in ln for k in internal)] or frames


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


# ----------------------------------------------------------------------------- проверки


def _resolve_entry(entry: Any):
    """Импортирует "пакет.модуль:функция": (модуль, функция); ValueError с понятным текстом."""
    module_name, _, func_name = entry.partition(":") if isinstance(entry, str) else ("", "", "")
    if not all(p.isidentifier() for p in [*module_name.split("."), func_name]) or ":" in func_name:
        raise ValueError(
            f"entry должно иметь вид 'пакет.модуль:функция' (одно двоеточие): {entry!r}"
        )
    if module_name == "__main__":
        raise ValueError("entry: функцию из ячейки ноутбука (__main__) дочерний процесс не найдёт")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(
            f"entry: не удалось импортировать модуль '{module_name}': {exc!r}"
        ) from exc
    fn = getattr(module, func_name, None)
    if fn is None:
        raise ValueError(f"entry: в модуле '{module_name}' нет функции '{func_name}'")
    if not callable(fn):
        raise ValueError(f"entry: '{entry}' не является функцией")
    return module, fn


def _check_args(args: Any) -> dict:
    if args is None:
        return {}
    if not isinstance(args, dict) or set(args) & {*_RESERVED_ARGS}:
        raise ValueError(f"args — словарь без ключей {_RESERVED_ARGS} (их задаёт запускатель)")
    try:
        json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"args должно быть JSON-сериализуемым: {exc}") from exc
    return dict(args)


def default_backend(nprocs: int) -> str:
    """Бэкенд по умолчанию: "nccl", если CUDA доступна и GPU ≥ nprocs, иначе "gloo"."""
    nprocs = integer("nprocs", nprocs, 1, strict=True)
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs else "gloo"


def _check_backend(backend: Any, nprocs: int) -> str:
    if backend is None:
        return default_backend(nprocs)
    if choice("backend", backend, BACKENDS) == "nccl":
        import torch

        n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_gpu < nprocs:
            raise ValueError(
                f"backend='nccl' требует по GPU на процесс: nprocs={nprocs}, доступно GPU: {n_gpu}"
                f"; на CPU используйте backend='gloo'"
            )
    return backend


# ----------------------------------------------------------------------------- запускатель


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _module_root(module) -> str | None:
    """Каталог, из которого импортируется пакет верхнего уровня модуля entry."""
    top = getattr(sys.modules.get(module.__name__.split(".")[0]), "__file__", None)
    if not top:
        return None
    p = Path(top).resolve()
    return str(p.parent.parent if p.name == "__init__.py" else p.parent)


def _tail(file: Path, n: int = STDERR_TAIL_LINES) -> str:
    try:
        return "\n".join(file.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_all(procs: list[subprocess.Popen], dump_stacks: bool) -> list[int]:
    """Убивает группы всех процессов (SIGKILL); возвращает ранги, которые были ещё живы."""
    alive = [r for r, p in enumerate(procs) if p.poll() is None]
    if alive and dump_stacks and hasattr(signal, "SIGUSR1"):
        for r in alive:  # стек зависшего процесса попадёт в его stderr (faulthandler)
            with contextlib.suppress(ProcessLookupError):
                os.kill(procs[r].pid, signal.SIGUSR1)
        time.sleep(_STACK_DUMP_WAIT_S)
    for p in procs:  # и живые, и завершившиеся: в группе могли остаться их дочерние процессы
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
    deadline = time.monotonic() + _GROUP_EXIT_WAIT_S  # SIGKILL доходит не мгновенно
    for p in procs:
        while _group_exists(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
    return alive


def _run_once(
    entry: str, nprocs: int, args: dict, timeout_s: float, backend: str, env: dict, run_dir: Path
) -> LaunchResult:
    base_env = {**os.environ, **env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    base_env["COURSE_RUN_DIR"] = str(run_dir)
    base_env |= dict.fromkeys(("WORLD_SIZE", "LOCAL_WORLD_SIZE"), str(nprocs))
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    base_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs)))
    procs: list[subprocess.Popen] = []
    exit_at: list[float | None] = [None] * nprocs
    changed = threading.Event()

    def waiter(rank: int) -> None:
        procs[rank].wait()
        exit_at[rank] = time.monotonic()
        changed.set()

    start = time.monotonic()
    deadline, status, killed = start + timeout_s, "ok", []
    # Канал «жив ли запускатель»: конец записи держит только этот процесс. Когда он умрёт (даже
    # от SIGKILL), ядро закроет конец записи, сторож каждого ранга прочтёт EOF и убьёт группу.
    alive_r, alive_w = os.pipe()
    cmd = [sys.executable, "-m", "course_utils.multiproc", "--entry", entry, "--backend", backend]
    cmd += ["--result-dir", str(run_dir), "--args", json.dumps(args), "--parent-fd", str(alive_r)]
    cmd += ["--timeout-s", repr(float(timeout_s))]
    try:
        for rank in range(nprocs):
            rank_env = base_env | dict.fromkeys(("RANK", "LOCAL_RANK"), str(rank))
            (run_dir / f"rank_{rank}.json").unlink(missing_ok=True)  # журналы перезапишет "wb"
            with (
                open(run_dir / f"rank_{rank}.stdout.txt", "wb") as out,
                open(run_dir / f"rank_{rank}.stderr.txt", "wb") as err,
            ):
                # start_new_session: своя группа процессов, killpg убьёт всё дерево ранга
                opts = {"env": rank_env, "stdin": subprocess.DEVNULL, "stdout": out, "stderr": err}
                proc = subprocess.Popen(cmd, start_new_session=True, pass_fds=(alive_r,), **opts)
                procs.append(proc)
        os.close(alive_r)
        alive_r = -1
        for rank in range(nprocs):
            threading.Thread(target=waiter, args=(rank,), daemon=True).start()
        failed_at = math.inf  # первый замеченный сбой
        while None in (codes := [p.poll() for p in procs]):
            now = time.monotonic()
            # Сбой — ненулевой код или код 0 без файла результата (sys.exit(0) раньше времени):
            # результат пишется до выхода, поэтому его отсутствие видно сразу.
            failed = any(
                c not in (None, 0) or (c == 0 and not (run_dir / f"rank_{r}.json").exists())
                for r, c in enumerate(codes)
            )
            if failed and failed_at == math.inf:
                failed_at = now
            grace_over = now >= failed_at + _FAILURE_GRACE_S
            if grace_over or now >= deadline:
                status = "failed" if grace_over else "timeout"
                killed = _stop_all(procs, dump_stacks=True)
                break
            changed.wait(timeout=0.1)  # выход любого ранга будит раньше
            changed.clear()
    finally:
        _stop_all(procs, dump_stacks=False)  # и при исключении (KeyboardInterrupt в ноутбуке)
        for fd in (alive_r, alive_w):
            if fd >= 0:
                os.close(fd)
    wall_s = time.monotonic() - start
    results: list[dict | None] = [None] * nprocs
    failures: list[RankFailure] = []
    for rank, p in enumerate(procs):
        result_file = run_dir / f"rank_{rank}.json"
        if p.returncode == 0 and result_file.exists():
            results[rank] = json.loads(result_file.read_text(encoding="utf-8"))
        else:
            tail = _tail(run_dir / f"rank_{rank}.stderr.txt")
            failures.append(RankFailure(rank, p.returncode, tail, killed=rank in killed))
    # Первым — ранг, упавший раньше всех: это причина, остальные — следствия.
    failures.sort(
        key=lambda f: (f.killed, 0.0 if f.killed else exit_at[f.rank] or math.inf, f.rank)
    )
    status = "failed" if status == "ok" and failures else status
    pids, codes = [p.pid for p in procs], [p.returncode for p in procs]
    head = (status == "ok", status, nprocs, backend, wall_s, results, failures, entry)
    return LaunchResult(*head, str(run_dir), pids, codes, float(timeout_s))


def launch(
    entry: str,
    nprocs: int = 2,
    args: dict | None = None,
    timeout_s: float = 120,
    backend: str | None = None,
    run_dir: str | os.PathLike | None = None,
) -> LaunchResult:
    """Запускает fn из entry в nprocs процессах ОС под torch.distributed; время wall_s — с.

    entry — "пакет.модуль:функция", вызов fn(rank=, world_size=, backend=, **args) возвращает
    JSON-словарь. 1 ≤ nprocs ≤ 64, timeout_s > 0 — общий дедлайн, с; backend — "gloo", "nccl"
    или None (по наличию GPU); run_dir — каталог результатов и журналов (по умолчанию
    временный). Занятый порт — одна повторная попытка.
    """
    nprocs = integer("nprocs", nprocs, 1, 64, strict=True)
    timeout_s = positive("timeout_s", timeout_s)
    args = _check_args(args)
    module, fn = _resolve_entry(entry)
    backend = _check_backend(backend, nprocs)
    try:
        inspect.signature(fn).bind(rank=0, world_size=nprocs, backend=backend, **args)
    except TypeError as exc:
        raise ValueError(
            f"entry '{entry}' нельзя вызвать как fn(rank=, world_size=, backend=, **args) "
            f"с args={args}: {exc}"
        ) from exc
    except ValueError:
        pass  # сигнатуру встроенной функции не прочитать — проверит дочерний процесс
    if os.name != "posix":
        raise RuntimeError("launch работает только в Linux и macOS (нужны группы процессов POSIX)")
    if run_dir is None:
        run_path = Path(tempfile.mkdtemp(prefix="course_launch_"))
    else:
        run_path = path("run_dir", run_dir).resolve()
        run_path.mkdir(parents=True, exist_ok=True)
    paths = [str(REPO_ROOT), _module_root(module)]  # курс и модуль entry — до чужого PYTHONPATH
    paths += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}
    result = _run_once(entry, nprocs, args, timeout_s, backend, env, run_path)
    tails = " ".join(f.stderr_tail for f in result.failures).lower()
    if result.status == "failed" and ("eaddrinuse" in tails or "address already in use" in tails):
        # Свободный порт успел занять кто-то другой: одна повторная попытка с новым портом.
        result = _run_once(entry, nprocs, args, timeout_s, backend, env, run_path)
    return result


# ----------------------------------------------------------------------------- дочерний процесс


def local_device(backend: str):
    """Устройство ранга: cuda:LOCAL_RANK для "nccl", иначе cpu (torch.device)."""
    import torch

    if choice("backend", backend, BACKENDS) == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _reap_group_when_launcher_dies(alive_fd: int) -> None:
    """Сторож ранга: процесс в группе ранга ждёт EOF канала от запускателя и убивает группу.

    Конец записи держит только запускатель; когда тот умирает (OOM, перезапуск ядра Colab),
    ``os.read`` возвращает b"" и сторож шлёт SIGKILL всей группе: рангу, «внукам» и себе.
    Процесс, а не поток: ему не нужен GIL ранга, занятого долгим вызовом C.
    """
    if os.fork() == 0:  # сторож: до импорта torch, потоков ещё нет
        with contextlib.suppress(OSError):
            while os.read(alive_fd, 1):
                pass
        os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(0)
    os.close(alive_fd)


def _child_main(ns: argparse.Namespace) -> int:
    import datetime

    if hasattr(signal, "SIGUSR1"):
        import faulthandler

        faulthandler.register(signal.SIGUSR1, all_threads=True)
    if ns.parent_fd >= 0:
        _reap_group_when_launcher_dies(ns.parent_fd)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if ns.result_dir:
        os.environ.setdefault("COURSE_RUN_DIR", str(Path(ns.result_dir).resolve()))
    args = json.loads(ns.args) if ns.args else {}
    _, fn = _resolve_entry(ns.entry)
    import torch
    import torch.distributed as dist

    backend = ns.backend or default_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    init_kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=ns.timeout_s)}
    if backend == "nccl":
        init_kwargs["device_id"] = local_device(backend)
        torch.cuda.set_device(init_kwargs["device_id"])
    dist.init_process_group(backend, init_method="env://", **init_kwargs)
    try:
        result = fn(rank=rank, world_size=world_size, backend=backend, **args)
    except SystemExit as exc:
        print(
            f"Ранг {rank}: {ns.entry} вызвала sys.exit({exc.code!r})", file=sys.stderr, flush=True
        )
        raise
    except Exception as exc:
        # Трассировка начинается с кадра функции пользователя: кадры обёртки ему не нужны.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.stderr.flush()
        return 1
    if not isinstance(result, dict):
        raise TypeError(
            f"функция {ns.entry} должна вернуть словарь (JSON), вернула {type(result).__name__}"
        )
    try:
        text = json.dumps(result, ensure_ascii=False, indent=1)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"результат {ns.entry} не сериализуется в JSON: {exc}") from exc
    if ns.result_dir:
        Path(ns.result_dir).mkdir(parents=True, exist_ok=True)
        atomic.write_text(Path(ns.result_dir) / f"rank_{rank}.json", text)
    else:
        print(json.dumps(result, ensure_ascii=False), flush=True)
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ранг (если RANK и WORLD_SIZE заданы, как в torchrun) или запускатель launch."""
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.multiproc",
        description="Точка входа ранга (под launch или torchrun) или запускатель (без RANK).",
    )
    parser.add_argument("--entry", required=True, help="'пакет.модуль:функция'")
    parser.add_argument("--result-dir", default=None, help="каталог для rank_<r>.json")
    parser.add_argument("--args", default="{}", help="аргументы функции, JSON-словарь")
    parser.add_argument("--backend", choices=BACKENDS, default=None)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="таймаут, с")
    parser.add_argument("--nprocs", type=int, default=2, help="только в режиме запускателя")
    parser.add_argument("--parent-fd", type=int, default=-1, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return _child_main(ns)
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            return 1
    kwargs = {"args": json.loads(ns.args), "timeout_s": ns.timeout_s, "backend": ns.backend}
    result = launch(ns.entry, nprocs=ns.nprocs, run_dir=ns.result_dir, **kwargs)
    print(result.summary())
    return 0 if result.ok else 1
