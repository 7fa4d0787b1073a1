"""The agent's long-running parts, driven in a sandboxed subprocess (sandboxed.py).

    healthprobe.py xids ROOT [API_URL TOKEN NODE]   read ROOT/dev/kmsg to its end the way
        the agent does (open_xid_source, watch_once rounds), report to the fake API
    healthprobe.py metrics ROOT LIB_DIR             one collection over the NVML stand-in
        in LIB_DIR, served and scraped once over 127.0.0.1
    healthprobe.py serve READ_TIMEOUT DEADLINE      serve a fixed 8-GPU snapshot until
        stdin closes; prints the port and this process's pid first

Each prints one JSON line on stdout; the log is JSON lines on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import structlog

from installer.node.host import RealHost, Roots


def _log() -> Any:
    structlog.configure(processors=[structlog.processors.add_log_level,
                                    structlog.processors.JSONRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    return structlog.get_logger()


def _host(root: Path) -> RealHost:
    return RealHost(Roots(root, root / "proc", root / "sys", root / "dev"))


def xids(root: Path, api_url: str = "", token: str = "", node: str = "") -> dict[str, Any]:
    from installer.agent import health
    from installer.agent.xids import KmsgXidSource
    from installer.config.health import ALWAYS_CRITICAL
    from installer.node import kmsg, kube

    log, host = _log(), _host(root)
    api = kube.ApiServer(api_url, Path(token), None) if api_url else None
    source = health.open_xid_source(host, use_nvml=False)
    assert isinstance(source, KmsgXidSource)
    watched = health.Health({ALWAYS_CRITICAL, 79})
    last: int | None = -1
    for _ in range(20):  # bounded: a plain file reads to its end in one or two rounds
        health.watch_once(source, watched, api=api, node=node or None,
                          boot_id=kmsg.boot_id(host), timeout_s=0.3, log=log)
        if source.log.last_seq == last:
            break
        last = source.log.last_seq
    source.close()
    return {"counts": {gpu: {str(code): n for code, n in c.items()}
                       for gpu, c in watched.counts.items()},
            "refused": dict(source.refused), "gpus": sorted(source.gpus),
            "last_seq": source.log.last_seq, "dropped": watched.dropped}


def metrics(root: Path, lib_dir: Path) -> dict[str, Any]:
    from native.nvmlsession import nvml_session

    from installer.agent.metrics import collect, server

    log = _log()
    agent = SimpleNamespace(
        log=log, config=SimpleNamespace(node_name="node-1", pod_resources_dir=root / "none",
                                        metrics_gpm_interval=0.0, metrics_dcgm_names=False),
        nvml_ready=lambda: True, state=SimpleNamespace(nvml_error=None, verdict=None),
        ctx=SimpleNamespace(install_root=root / "install"), supervisor=None,
        health=SimpleNamespace(counts={}, last={}), next_said=None)
    with nvml_session(lib_dir):
        collector = collect.Collector(agent)  # type: ignore[arg-type]
        collector.collect()
    httpd, _ = server.serve("127.0.0.1", 0, server.make_app(lambda: collector.latest, 1, log))
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            status, text = answer.status, answer.read().decode()
    finally:
        httpd.shutdown()
        httpd.server_close()
    return {"status": status, "text": text}


def serve(read_timeout_s: float, deadline_s: float) -> None:
    import time

    from installer.agent.metrics import server
    from installer.agent.metrics.snapshot import GpuReading, Snapshot

    gpus = tuple(GpuReading(index=i, uuid=f"GPU-{i:08x}", model="NVIDIA A100-SXM4-40GB",
                            pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", duty_cycle=10.0 * i,
                            memory_used=i << 30, memory_total=40 << 30) for i in range(8))
    snap = Snapshot(taken_at=time.time(), node_name="node-1", gpus=gpus)
    app = server.make_app(lambda: snap, 3600, _log())
    httpd, _ = server.serve("127.0.0.1", 0, app, read_timeout_s=read_timeout_s,
                            deadline_s=deadline_s)
    print(json.dumps({"port": httpd.server_address[1], "pid": os.getpid(),
                      "max_threads": server.MAX_THREADS,
                      "backlog": server.LISTEN_BACKLOG}), flush=True)
    sys.stdin.read()  # until the test closes it
    httpd.shutdown()
    httpd.server_close()


def main(argv: list[str]) -> int:
    what, *args = argv
    if what == "serve":
        serve(float(args[0]), float(args[1]))
        return 0
    found = xids(Path(args[0]), *args[1:]) if what == "xids" else metrics(
        Path(args[0]), Path(args[1]))
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
