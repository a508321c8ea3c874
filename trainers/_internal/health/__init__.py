"""Run health: what a rank measures of itself and leaves when it runs out of memory, the driver's
judgements (stragglers, goodput, pre-flight), a ``fit()`` call's timeline and picture, and their
settings. Imports the event road only."""
