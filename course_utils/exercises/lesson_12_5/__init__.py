"""Урок 12.5: восстановление, наблюдаемость, выбор стека. Модуль на проверочный шаг, в порядке шагов."""

STEP_MODULES = (
    "manifest_gaps",  # 12.5.6
    "young_interval",  # 12.5.7
    "trace_links",  # 12.5.8
    "log_metrics",  # 12.5.9
    "resume_fn",  # 12.5.10
    "atomic_batches",  # 12.5.11
    "stack_choice",  # 12.5.12
    "final_diagnosis",  # 12.5.13
)
