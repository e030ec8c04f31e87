"""Feature detection of the vLLM adapters (kvoracle.conformance.engines.vllm_api), on stand-ins
shaped like two releases' constructors: no vLLM needed."""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.vllm_api import UnsupportedByRelease, call, takes


def manager_0_33(config, *, scheduler_block_size: int, hash_block_size: int, watermark: float = 0.0):
    return ("0.33", config, scheduler_block_size, hash_block_size, watermark)


def manager_0_14(config, *, hash_block_size: int):
    return ("0.14", config, hash_block_size)


def request_0_14(request_id, prompt, eos_token_id, block_hasher=None):
    return (request_id, prompt, eos_token_id, block_hasher)


def test_a_release_taking_every_keyword_gets_them_all() -> None:
    got = call("0.33.0", manager_0_33, "cfg", scheduler_block_size=16, hash_block_size=4, watermark=0.0,
               built_in={"scheduler_block_size": 16, "watermark": 0.0})
    assert got == ("0.33", "cfg", 16, 4, 0.0)


def test_a_keyword_with_the_built_in_value_is_left_out_where_the_release_lacks_it() -> None:
    got = call("0.14.1", manager_0_14, "cfg", scheduler_block_size=16, hash_block_size=4, watermark=0.0,
               built_in={"scheduler_block_size": 16, "watermark": 0.0})
    assert got == ("0.14", "cfg", 4)


def test_a_keyword_kvoracle_needs_at_another_value_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedByRelease, match=r"vLLM 0\.14\.1: manager_0_14 takes no scheduler_block_size=32"):
        call("0.14.1", manager_0_14, "cfg", scheduler_block_size=32, hash_block_size=4,
             built_in={"scheduler_block_size": 16})
    with pytest.raises(UnsupportedByRelease, match=r"watermark=0\.1"):
        call("0.14.1", manager_0_14, "cfg", hash_block_size=4, watermark=0.1)


def test_a_required_parameter_later_releases_dropped_gets_its_unused_value() -> None:
    assert call("0.14.1", request_0_14, "r", [1, 2], block_hasher="h") == ("r", [1, 2], None, "h")


def test_takes_sees_keyword_catch_alls() -> None:
    def anything(**kwargs):
        return kwargs

    assert takes(anything, "whatever")
    assert not takes(manager_0_14, "watermark")
