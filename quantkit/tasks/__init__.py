"""The built-in validation tasks, one module each (mmlu, humaneval, domain, sampling,
long_context): its own options, its lifecycle (prepare, settings, run), its report section and
its `register_task` line. The registry they join is quantkit.task_registry, which imports them;
its names (its `__all__`) are handed on here, for plugins (`from quantkit.tasks import Metric,
Task`) and the commands. The work the tasks call is quantkit.validate's. Pure: imports no torch."""

from quantkit.task_registry import *  # noqa: F403 - the registry's names, as its __all__ lists them
