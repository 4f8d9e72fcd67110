"""Уровень C: ранги — процессы ОС под ``torch.distributed`` (``launch``, см. ``launcher``).

Точки входа: ``sync_loop`` (12.1), ``zero_state`` (12.2), ``queue_loop`` (12.3),
``weight_broadcast`` (12.4), ``checkpointed_trainer`` (12.5); итоговый прогон —
``course_utils.capstone``; обмен между рангами и общие части циклов — ``transport``.
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
