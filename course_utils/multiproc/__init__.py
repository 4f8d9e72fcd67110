"""Уровень C: настоящие процессы ОС под ``torch.distributed`` и точки входа уроков.

``launch("модуль:функция", nprocs, args)`` запускает ранги как отдельные процессы (окружение как у
``torchrun``), ждёт их с дедлайном, убивает всю группу при сбое и возвращает ``LaunchResult``.
Точки входа: ``sync_loop`` (12.1), ``zero_state`` (12.2), ``queue_loop`` (12.3),
``weight_broadcast`` (12.4), ``checkpointed_trainer`` (12.5); итоговый прогон —
``course_utils.capstone``; обмен между рангами и общие части циклов — ``transport``.
Те же точки входа без изменений работают под ``torchrun -m course_utils.multiproc --entry …``.
"""

from course_utils.multiproc.launcher import (
    BACKENDS,
    STDERR_TAIL_LINES,
    LaunchResult,
    RankFailure,
    default_backend,
    launch,
    local_device,
    main,
)

__all__ = [
    "BACKENDS",
    "STDERR_TAIL_LINES",
    "LaunchResult",
    "RankFailure",
    "default_backend",
    "launch",
    "local_device",
    "main",
]
