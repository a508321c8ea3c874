"""The one implementation behind ``trainers.xgboost`` and ``trainers.lightgbm``: each library gives
a ``Library`` (its adapter); ``GBDTTrainer``, the parameter form, the report callbacks' rules and the
checkpoint classes' are here. Users import the libraries' modules, not this one."""
