"""Урок 12.3: конвейеры, очереди, хвосты. Модуль на проверочный шаг, в порядке шагов."""

STEP_MODULES = (
    "pipeline_split",  # 12.3.6
    "tails_timeout",  # 12.3.7
    "queue_stability",  # 12.3.8
    "critical_path",  # 12.3.9
)
