"""The agent's Prometheus metrics: the install, the agent's verdict and daemons,
each GPU through NVML, and each container's GPUs through the kubelet's PodResources API.

`collect` reads on the agent's schedule into an immutable `snapshot`; `server` renders the
latest one per scrape (`families`: GKE's drop-in names and our `gpu_node_installer_` family).
`serving` ties both to the agent's life: started with it, stopped before it ends. Both read
the agent through `source.AgentView`: the loop imports the metrics, never the reverse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from installer.agent.metrics.source import AgentView


@contextmanager
def serving(agent: AgentView) -> Iterator[None]:
    """Collect and serve while the block runs (METRICS_PORT=0: neither)."""
    config, log = agent.config, agent.log
    if config.metrics_port == 0:
        yield
        return
    from installer.agent.metrics import collect, server
    from installer.config import webconfig

    stop = threading.Event()
    collector = collect.Collector(agent, wait=stop.wait)
    app = server.make_app(lambda: collector.latest, config.metrics_interval, log,
                          dcgm_names=config.metrics_dcgm_names)
    web = webconfig.load(config.metrics_web_config_file)  # ConfigError: the agent stops, exit 2
    if web is not None and web.users:
        from installer.agent.metrics.auth import basic_auth

        app = basic_auth(app, web.users)
    try:
        tls = web.ssl_context() if web is not None else None
        httpd, _ = server.serve(config.metrics_address, config.metrics_port, app, tls=tls)
    except OSError as exc:  # SSLError too; the agent's readiness matters more than metrics
        log.error("metrics not served", address=config.metrics_address,
                  port=config.metrics_port, reason=exc.strerror or str(exc))
        yield
        return
    thread = threading.Thread(target=collect.run, name="metrics-collect", daemon=True,
                              args=(collector, stop, config.metrics_interval, log))
    thread.start()
    log.info("metrics served", address=config.metrics_address, port=config.metrics_port,
             interval_s=config.metrics_interval, tls=tls is not None,
             basic_auth=bool(web is not None and web.users))
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=config.metrics_interval + 5)
        httpd.shutdown()
        httpd.server_close()
