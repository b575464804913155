import pytest
import torch

from edge_llm_ros.core.engine.kv_cache import KVCache


def filled(length, capacity=16):
    cache = KVCache(num_layers=2, num_kv_heads=2, head_dim=3, capacity=capacity)
    with torch.inference_mode():
        for layer in range(2):
            rows = torch.arange(length, dtype=torch.float32) + 100 * layer  # slot value = slot index (+100 per layer)
            kv = rows.view(1, 1, length, 1).expand(1, 2, length, 3)
            cache.write(layer, kv, -kv)
        cache.commit(length)
    return cache


def slot_values(cache, layer=0):
    return cache.k[layer, 0, 0, : cache.length, 0].tolist()


def test_write_commit_appends_after_committed_slots():
    cache = filled(4)
    with torch.inference_mode():
        new = torch.full((1, 2, 2, 3), 7.0)
        k_all, v_all = cache.write(0, new, new)
    assert k_all.shape == (1, 2, 6, 3) and cache.length == 4  # visible to this pass, not yet committed
    assert k_all[0, 0, :, 0].tolist() == [0, 1, 2, 3, 7, 7]
    cache.commit(2)
    assert cache.length == 6


def test_keep_compacts_accepted_path_in_order_for_every_layer():
    cache = filled(10)
    cache.keep([0, 1, 2, 3, 5, 8])
    assert cache.length == 6
    assert slot_values(cache, 0) == [0, 1, 2, 3, 5, 8]
    assert slot_values(cache, 1) == [100, 101, 102, 103, 105, 108]
    assert cache.v[0, 0, 1, : cache.length, 2].tolist() == [0, -1, -2, -3, -5, -8]


def test_keep_identity_prefix_and_empty():
    cache = filled(5)
    cache.keep(range(5))
    assert slot_values(cache) == [0, 1, 2, 3, 4]
    cache.keep([])
    assert cache.length == 0


@pytest.mark.parametrize("bad", [[3, 2], [0, 0], [0, 5], [-1]])
def test_keep_rejects_unsorted_duplicate_or_out_of_range(bad):
    with pytest.raises(ValueError, match="strictly increasing"):
        filled(5).keep(bad)


def test_truncate_rolls_back_and_rejects_growth():
    cache = filled(6)
    cache.truncate(3)
    assert slot_values(cache) == [0, 1, 2]
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(4)


def test_overflow_is_an_error_and_ensure_capacity_keeps_contents():
    cache = filled(4, capacity=4)
    with pytest.raises(ValueError, match="overflow"), torch.inference_mode():
        cache.write(0, torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3))
    cache.ensure_capacity(9)
    assert cache.capacity >= 9 and slot_values(cache) == [0, 1, 2, 3]
