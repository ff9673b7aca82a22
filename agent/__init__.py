"""tradeagent's daemon and learning core (model, policy, training, execution, control)."""
