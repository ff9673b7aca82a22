"""Self-contained HTML reports with inline SVG plots (no script, no network, no plotting library).

:mod:`agent.reports.svg` draws the charts, :mod:`agent.reports.page` holds the page scaffold,
tables and the atomic writer; the training report (:mod:`agent.reports.training`) and the
backtest report (:mod:`agent.reports.backtest`) are built from them. The package sits above
:mod:`agent.train` and :mod:`agent.backtest`, whose results it draws; neither imports it.
"""
