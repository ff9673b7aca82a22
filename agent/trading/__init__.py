"""The one trading step (observation -> decision -> size -> risk -> order) and what it needs."""
