"""A PostgreSQL server for the ``mesh-node-pg`` bench row, started by the bench as the test
suite starts its own (``tests.postgres_support.running_postgres``: Debian's binaries, ``initdb``
into a temporary folder, a free port, deleted after).

    python -m tests.bench.servers.postgres --port 8123 --url-file /tmp/row/postgres.url

Creates the database ``bench``, writes its URL to ``--url-file``, then answers ``GET /health``
on ``--port`` (the harness's readiness check) until SIGTERM, when the server is stopped. The
server runs as this process's child, so the harness's CPU of this process is the database's.
"""

from __future__ import annotations

import argparse
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import FrameType

from tests.postgres_support import running_postgres, server_bin


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.servers.postgres")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url-file", type=Path, required=True)
    args = parser.parse_args()
    bindir = server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries: apt-get install postgresql", file=sys.stderr)
        return 2
    import psycopg

    signal.signal(signal.SIGTERM, _stop)
    with running_postgres(bindir) as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("create database bench")
        args.url_file.write_text(server.url("bench"))
        with HTTPServer(("127.0.0.1", args.port), _Health) as http:
            http.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
