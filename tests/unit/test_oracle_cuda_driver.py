"""The emulated CUDA driver's allocation count (oracle/cuda_driver.py), pure Python.

The oracle adds the bytes a model build allocates through cuMemCreate (the Engram peer
shards) to the role's resident weights. A warm worker keeps other roles' models; when the
collector releases one of their allocations during a build, a net difference of the live
bytes came out low (CI: a Qwen decode built 0.8 GB under its tp-1 figure, which
test_oracle_differential.py test_weights_lower_bound_holds caught). The count is by handle.
"""

from __future__ import annotations

from sglang_pd_operator.oracle import cuda_driver


def test_bytes_created_since_a_mark_ignore_older_allocations_released_meanwhile():
    _, older = cuda_driver.cuMemCreate(3 << 30, None, 0)
    _, kept = cuda_driver.cuMemCreate(1 << 30, None, 0)
    mark = cuda_driver.live_handles()
    cuda_driver.cuMemRelease(older)  # another model's shard collected during the build
    _, new = cuda_driver.cuMemCreate(2 << 30, None, 0)
    try:
        assert cuda_driver.created_bytes(since=mark) == 2 << 30
        assert cuda_driver.created_bytes() >= (1 << 30) + (2 << 30)
    finally:
        for handle in (kept, new):
            cuda_driver.cuMemRelease(handle)
    assert cuda_driver.created_bytes(since=mark) == 0
