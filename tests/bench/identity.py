"""What signed identity costs per hop, measured in-process (``python -m tests.bench.identity``).

The ``coord-remote-signed`` row of ``make bench`` measures a whole delegation with keys; on a
shared machine its difference from ``coord-remote`` (a few tenths of a millisecond) is inside
the run-to-run noise. This measures the work keys add to each call directly, in CPU time of this
process (``time.process_time``: what scheduling on a loaded machine inflates least):

- ``mint``: the caller's call token (``CallerIdentity.token``: one ES256 signature);
- ``verify``: the callee's check of it (``CallerCheck.verify``: one ES256 verification, the
  claims, the replay set; the certificate and header checked once per caller);
- ``card``: a peer's signed card verified (``verify_card``), which a caller does once per peer
  URL per verdict (30 s), not per call: what that caching saves.

Each is timed over ``--n`` operations, ``--repeat`` times interleaved; the median is printed
and written as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mesh._a2a.card import build_card, card_to_dict
from mesh._a2a.signing import CardSigner, verify_card
from mesh._identity import CallerCheck, CallerIdentity
from mesh._keys import AgentKeys, TrustRoot, init_mesh, issue_agent
from tests.bench.agents.specialist import agent as specialist

__all__ = ["main", "measure"]


def _per_op_ms(run: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        run()
    return 1000 * (time.process_time() - start) / n


def measure(n: int = 3000, repeat: int = 3) -> dict[str, float]:
    """Median CPU ms per operation of minting, verifying and (for contrast) a card check."""
    with tempfile.TemporaryDirectory() as tmp:
        root_dir = Path(tmp) / "mesh"
        init_mesh(root_dir)
        caller = AgentKeys.load(issue_agent(root_dir, "bench-coordinator"), "bench-coordinator")
        callee = AgentKeys.load(issue_agent(root_dir, "bench-bureau"), "bench-bureau")
        root = TrustRoot.load(root_dir)
    mint = CallerIdentity(caller)
    check = CallerCheck(root, "bench-bureau")
    card = card_to_dict(CardSigner(callee).sign(build_card(specialist, "http://127.0.0.1:8101")))
    samples: dict[str, list[float]] = {"mint": [], "verify": [], "card": []}
    for _ in range(repeat):
        tokens = iter([mint.token("bench-bureau") for _ in range(n)])
        samples["mint"].append(_per_op_ms(lambda: mint.token("bench-bureau"), n))
        samples["verify"].append(_per_op_ms(lambda t=tokens: check.verify(next(t)), n))
        samples["card"].append(_per_op_ms(lambda: verify_card(card, root), max(1, n // 20)))
    result = {name: round(statistics.median(values), 4) for name, values in samples.items()}
    result["per_hop"] = round(result["mint"] + result["verify"], 4)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.identity", description=__doc__)
    parser.add_argument("--n", type=int, default=3000, help="operations per timing (3000)")
    parser.add_argument("--repeat", type=int, default=3, help="timings per operation (3)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    result = measure(args.n, args.repeat)
    print(
        f"call token: mint {result['mint']:.3f} ms + verify {result['verify']:.3f} ms = "
        f"{result['per_hop']:.3f} ms CPU per hop; a peer's card verified: {result['card']:.3f} "
        "ms (once per peer URL per 30 s verdict)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
