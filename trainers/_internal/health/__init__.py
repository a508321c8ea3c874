"""Run health: what a rank measures of itself with each report (``rank_health``) and leaves when it
runs out of memory (``memory_failure``), the driver's judgements of it (``stragglers``,
``goodput``, ``preflight``), the timeline of a ``fit()`` call and its picture, and their settings.
Imports the event road only."""
