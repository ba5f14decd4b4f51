"""The Dashboard: one page on the management listener where an operator sees what runs
(mode, configuration, deployments and their replicas, routes and signals, the
``vsr_model_runtime_*`` figures) and changes deployments through the configuration API.
It shows the start mode and never switches it.

:mod:`.snapshot` builds the document the page reads; :mod:`.routes` serves the page, its
files and that document; ``static/`` holds the page (plain HTML, one script, one style
sheet: no build step, nothing fetched from elsewhere).
"""

from .routes import dashboard_routes

__all__ = ["dashboard_routes"]
