"""A small real HTTP process for supervisor tests, answering health the way mesh services do.

    python -m tests.pid_server PORT

GET /health  -> 200 {"status": "ok", "pid": <its pid>}
GET /exit/N  -> 200, then the process exits with code N (0: a clean exit, 78: EX_CONFIG, ...)

It prints one line when it listens, so a log shows which start wrote what.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/exit/"):
            code = int(self.path.removeprefix("/exit/"))
            self._answer({"exiting": code})
            self.wfile.flush()
            os._exit(code)
        self._answer({"status": "ok", "pid": os.getpid()})

    def _answer(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per health poll would bury what the tests read in the log


def main() -> None:
    port = int(sys.argv[1])
    server = HTTPServer(("127.0.0.1", port), _Handler)
    print(f"pid_server {os.getpid()} listening on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
