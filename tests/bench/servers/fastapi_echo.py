"""The floor: a bare FastAPI app that echoes a JSON object. No A2A, no store, no metrics.

python -m tests.bench.servers.fastapi_echo --port 8001
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from fastapi import FastAPI

app = FastAPI()


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/echo")
async def echo(body: dict[str, Any]) -> dict[str, Any]:
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # Same server settings as the other rows: uvloop/httptools when installed, no access log.
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
