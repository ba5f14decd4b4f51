"""``vllm-srun serve``: compose the plugins, load models in the background, serve HTTP.

HTTP answers from the first moment (``/health/live`` 200, ``/health`` 503 with
per-model states) while models load. SIGTERM (or SIGINT) stops admission
(``/health`` 503, new requests 503 ``not_ready``), lets queued work finish
within ``--shutdown-grace-seconds`` and exits 0; a second signal exits at once.
"""

from __future__ import annotations

import logging
import threading
from types import FrameType

import uvicorn

from . import autotune
from .app import build_app
from .config import ServeConfig
from .runtime import Runtime

log = logging.getLogger("vllm_srun.serve")


def serve(config: ServeConfig) -> int:
    """Run the server until it is told to stop; returns the exit status."""
    import torch

    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    try:  # before any model loads, so before any kernel compiles
        cache = autotune.apply(config.autotune_cache)
    except OSError as err:
        raise SystemExit(f"vllm-srun serve: --autotune-cache cannot be created: {err}") from err
    if cache is not None:
        log.info("autotune cache: %s", cache)
    runtime = Runtime(config)
    app = build_app(runtime)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        uds=config.uds,
        log_level=config.log_level,
        access_log=False,
        loop="auto",
        http="auto",
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(uv_config, runtime)
    runtime.start_loading()
    where = config.uds or f"http://{config.host}:{config.port}"
    log.info("serving %d model(s) on %s", len(runtime.models), where)
    server.run()
    return 0 if server.drained else 1


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose exit signal first drains the queues while HTTP still answers."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.draining = False
        self.drained = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain in the background; a second one exits at once."""
        if self.draining:
            self.force_exit = True
            self.should_exit = True
            return
        self.draining = True
        log.info("signal %d: no new work; finishing queued work, then exiting", sig)
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        self.drained = self.runtime.stop()
        if not self.drained:
            log.warning("queued work did not finish within the grace period")
        self.should_exit = True
