"""The embedded trainer: vectorised environment, C51 learner, walk-forward folds, gates, floors.

``tradeagent train`` (:mod:`agent.commands.train`) drives :mod:`agent.train.run`.
"""
