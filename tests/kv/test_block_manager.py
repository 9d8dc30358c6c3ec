import pytest

from fsd.jobs import Job, SamplingParams
from fsd.kv.block_manager import BlockManager


def job(n_prompt: int) -> Job:
    return Job(prompt_token_ids=list(range(n_prompt)), params=SamplingParams())


def test_allocate_rounds_up_to_whole_blocks():
    bm = BlockManager(num_device_blocks=8, block_size=4)
    j = job(9)
    assert bm.can_allocate(j)
    bm.allocate(j)
    assert len(j.block_table) == 3 and bm.num_free == 5
    bm.check()


def test_append_grows_only_at_block_boundaries():
    bm = BlockManager(8, 4)
    j = job(4)
    bm.allocate(j)
    assert len(j.block_table) == 1
    j.output_token_ids.append(7)  # 5 tokens now
    assert bm.can_append(j)
    bm.append(j)
    assert len(j.block_table) == 2
    j.output_token_ids.append(7)
    bm.append(j)
    assert len(j.block_table) == 2
    bm.check()


def test_cannot_allocate_beyond_the_pool_and_free_returns_everything():
    bm = BlockManager(4, 4)
    a, b = job(12), job(8)
    bm.allocate(a)
    assert not bm.can_allocate(b)
    with pytest.raises(MemoryError):
        bm.allocate(b)
    bm.free(a)
    assert bm.num_free == 4 and a.block_table == []
    bm.allocate(b)
    bm.check()


def test_allocate_twice_is_refused():
    bm = BlockManager(4, 4)
    a = job(3)
    bm.allocate(a)
    with pytest.raises(ValueError, match="already holds"):
        bm.allocate(a)


def test_check_detects_a_block_owned_twice():
    bm = BlockManager(4, 4)
    a, b = job(4), job(4)
    bm.allocate(a)
    bm.allocate(b)
    b.block_table[0] = a.block_table[0]
    with pytest.raises(AssertionError):
        bm.check()
