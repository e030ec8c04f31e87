"""Derive the manager suite's trace-shaped workload from the Mooncake FAST'25 conversation trace.

The trace (kvcache-ai/Mooncake, FAST25-release/traces, Apache-2.0) lists, per request, the
512-token prefix blocks it reads as remapped hash ids. Every request begins with block 0 (a
shared system prompt); about four requests in ten continue an earlier conversation (they
share more than that block with an earlier request); conversations run to a few turns.

This script keeps that structure at a size a property-based example can use: it joins each
request to the earlier request it shares the longest prefix with (more than the first block),
takes the connected groups as *conversations*, and writes every ``--every``-th of them, each
turn as its hash ids renumbered inside the conversation (0 stays the shared first block), at
most ``--max-blocks`` of them, with the fraction of its last block the prompt fills. The
output is package data of ``kvoracle.conformance.manager`` (its ``trace`` module reads it):

    python scripts/derive_mooncake_workload.py ../shared/data/mooncake-fast25/conversation_trace.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TRACE_BLOCK_TOKENS = 512
OUT = Path(__file__).resolve().parent.parent / "conformance" / "manager" / "mooncake_conversations.json"


def conversations(requests: list[dict], longest: int) -> list[list[int]]:
    """Indices of the requests of each conversation, in arrival order, conversations ordered by
    their first request."""
    first_holder: dict[tuple[int, ...], int] = {}
    root = list(range(len(requests)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, request in enumerate(requests):
        ids = request["hash_ids"][:longest]
        shared, holder = 0, None
        for k in range(1, len(ids) + 1):
            earlier = first_holder.get(tuple(ids[:k]))
            if earlier is None:
                break
            shared, holder = k, earlier
        if shared > 1 and holder is not None:
            root[find(i)] = find(holder)
        for k in range(1, len(ids) + 1):
            first_holder.setdefault(tuple(ids[:k]), i)
    groups: dict[int, list[int]] = {}
    for i in range(len(requests)):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda members: members[0])


def turn(request: dict, names: dict[int, int], max_blocks: int) -> dict:
    """One request as local block ids and the share of its last block that the prompt fills."""
    ids = request["hash_ids"]
    local = [names.setdefault(h, len(names)) if h else 0 for h in ids[:max_blocks]]
    tail = request["input_length"] - TRACE_BLOCK_TOKENS * (len(ids) - 1)
    fill = 1.0 if len(ids) > max_blocks else min(max(tail / TRACE_BLOCK_TOKENS, 0.0), 1.0)
    return {"blocks": local, "last_block_fill": round(fill, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--every", type=int, default=20, help="keep every n-th conversation")
    parser.add_argument("--max-blocks", type=int, default=24, help="blocks kept per request")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    requests = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    kept = []
    for members in conversations(requests, longest=64)[::args.every]:
        names: dict[int, int] = {0: 0}
        kept.append([turn(requests[i], names, args.max_blocks) for i in members])
    turns = sum(len(c) for c in kept)
    document = {
        "source": "Mooncake FAST'25 conversation_trace.jsonl (kvcache-ai/Mooncake, FAST25-release/traces, "
                  "Apache-2.0), derived by scripts/derive_mooncake_workload.py",
        "trace_requests": len(requests), "every": args.every, "max_blocks": args.max_blocks,
        "conversations": kept,
    }
    args.out.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    print(f"{len(kept)} conversations, {turns} requests -> {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
