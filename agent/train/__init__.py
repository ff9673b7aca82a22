"""The embedded trainer: vectorised environment, C51 learner, walk-forward folds, gates, floors.

``tradeagent train`` (:mod:`agent.commands.train`) drives :func:`agent.train.walkforward.run_training`.
"""
