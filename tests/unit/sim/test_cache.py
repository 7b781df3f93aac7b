from gateway.sim.cache import PrefixCache, block_hashes


def test_block_hashes_chain_and_cover_only_full_blocks() -> None:
    tokens = list(range(40))
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == 2
    assert block_hashes(tokens[:32], 16) == hashes
    # Block 1's hash depends on block 0: change a token in block 0, block 1 changes too.
    other = block_hashes([99, *tokens[1:]], 16)
    assert other[0] != hashes[0]
    assert other[1] != hashes[1]
    # Continuing from a parent gives the same hashes as hashing the whole list.
    assert block_hashes(tokens, 16, start=1, parent=hashes[0]) == hashes[1:]


def test_released_blocks_stay_cached_and_match_again() -> None:
    cache = PrefixCache(capacity=8)
    assert cache.reserve(3)
    for h in (1, 2, 3):
        assert cache.commit(h)
    assert cache.used == 3
    cache.release([1, 2, 3], private=0)
    assert cache.used == 0
    assert cache.cached == 3
    assert cache.match([1, 2, 3, 4]) == 3
    assert cache.match([5, 1]) == 0


def test_eviction_takes_least_recent_free_blocks_tail_first() -> None:
    cache = PrefixCache(capacity=4)
    assert cache.reserve(2)
    cache.commit(10)
    cache.commit(11)
    cache.release([10, 11], private=0)
    assert cache.reserve(3)  # needs one free block: the tail block 11 goes first
    assert cache.match([10]) == 1
    assert cache.match([10, 11]) == 1


def test_pinned_blocks_are_never_evicted() -> None:
    cache = PrefixCache(capacity=4)
    assert cache.reserve(2)
    cache.commit(1)
    cache.commit(2)
    assert not cache.reserve(3)  # only 2 blocks left and both others pinned
    assert cache.match([1, 2]) == 2
    cache.release([1, 2], private=0)
    cache.acquire([1])
    assert cache.reserve(3)  # evicts 2, keeps the pinned 1
    assert cache.match([1, 2]) == 1


def test_a_block_cached_twice_is_shared_and_frees_the_duplicate() -> None:
    cache = PrefixCache(capacity=4)
    assert cache.reserve(1)
    assert cache.reserve(1)
    assert cache.commit(7)
    assert not cache.commit(7)
    assert cache.used == 1
    cache.release([7], private=0)
    assert cache.used == 1
    cache.release([7], private=0)
    assert cache.used == 0
    assert cache.cached == 1
