"""The manager suite's `mooncake` part: prompts shaped like the Mooncake conversation trace
(conformance/manager/trace.py, scripts/derive_mooncake_workload.py)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvoracle.conformance.harness.runner import RunOptions, RunResult, run_suite
from kvoracle.conformance.harness.suites import get_suite
from kvoracle.conformance.manager import trace

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO.parent / "shared" / "data" / "mooncake-fast25" / "conversation_trace.jsonl"


def test_conversations_keep_the_traces_shape() -> None:
    conversations = trace.conversations()
    assert len(conversations) > 300
    turns = [turn for conversation in conversations for turn in conversation]
    # Every turn opens with the shared first block, as every request of the trace does.
    assert all(blocks[0] == 0 for blocks, _ in turns)
    assert all(0 < fill <= 1 for _, fill in turns)
    # Most conversations are one turn; the others repeat an earlier turn's blocks as a prefix.
    several = [c for c in conversations if len(c) > 1]
    assert 0 < len(several) < len(conversations) / 2
    for conversation in several:
        for (earlier, _), (later, _) in itertools.pairwise(conversation):
            assert later[1] == earlier[1] or earlier[1] in later, (earlier, later)


def test_a_turns_tokens_follow_its_blocks() -> None:
    tokens = trace.turn_tokens(3, (0, 1, 2), 0.3, block_size=4, limit=100)
    stride = trace.CONVERSATION_STRIDE
    assert tokens == (0,) * 4 + (1 + 3 * stride + 1,) * 4 + (1 + 3 * stride + 2,) * 2
    assert trace.turn_tokens(3, (0, 1, 2), 0.3, block_size=4, limit=6) == tokens[:6]
    # Another conversation shares only the first block.
    other = trace.turn_tokens(4, (0, 1, 2), 0.3, block_size=4, limit=100)
    assert other[:4] == tokens[:4] and other[4] != tokens[4]


def _run(engine: str, max_examples: int) -> RunResult:
    return run_suite(engine, RunOptions(max_examples=max_examples, max_rounds=1, replay_dir=None),
                     suite=get_suite("mooncake"))


def test_the_mooncake_part_passes_the_reference_and_judges_its_lookups() -> None:
    result = _run("reference", 30)
    assert result.verdicts.ok(), result.verdicts.summary()
    # That later turns share their conversation's blocks is test_conversations_keep_the_traces_shape's.
    assert result.verdicts.outcomes["KV-FULL-001"].checks > 0
    assert result.verdicts.outcomes["KV-HYB-006"].not_applicable  # one-group part only


def test_the_mooncake_part_convicts_a_broken_engine() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    # Touching a hit leaves its blocks in the free queue: with the reference's contracts on, the
    # engine's own pool breaks KV-POOL-010's contract (an engine error); off, the queue differs.
    result = _run("broken_engines:TouchLeavesHitsFree", 150)
    failed = {rule for rule, outcome in result.verdicts.outcomes.items() if outcome.counterexamples or outcome.errors}
    assert failed & {"KV-LIFE-006", "KV-POOL-008", "KV-POOL-010"}, (failed, result.verdicts.summary())


@pytest.mark.skipif(not TRACE.is_file(), reason=f"the Mooncake trace is not at {TRACE} (the workplace's shared data)")
def test_the_committed_workload_is_what_the_script_derives(tmp_path: Path) -> None:
    out = tmp_path / "derived.json"
    subprocess.run([sys.executable, str(REPO / "scripts" / "derive_mooncake_workload.py"), str(TRACE),
                    "--out", str(out)], check=True, capture_output=True)
    committed = REPO / "conformance" / "manager" / "mooncake_conversations.json"
    assert json.loads(out.read_text()) == json.loads(committed.read_text())
