"""The ZeroMQ control socket of the daemon and its client (``tradeagent ctl``)."""
