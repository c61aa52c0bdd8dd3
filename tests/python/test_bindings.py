# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock's Python bindings: round trips through the C++ library, errors as
exceptions that change nothing, and the zero-copy views of a step."""
import ctypes
import ctypes.util
import re

import numpy as np
import pytest

import kvblock


def make_config(num_pages=32, max_batch=8, max_pages_per_seq=8, page_size=4):
    config = kvblock.PagedKvConfig()
    config.num_pages = num_pages
    config.max_batch = max_batch
    config.max_pages_per_seq = max_pages_per_seq
    config.page_size = page_size
    return config


def make_stack(device=None, **kwargs):
    config = make_config(**kwargs)
    manager = kvblock.BlockManager(config)
    device = device or kvblock.Device.host()
    table = kvblock.KVPageTable(config.max_batch, config.max_pages_per_seq,
                                config.num_pages, device)
    commit = kvblock.BatchCommit(manager, table)
    return manager, table, commit


def test_errors_are_kvblock_errors_and_builtins():
    assert issubclass(kvblock.InvalidArgumentError, kvblock.Error)
    assert issubclass(kvblock.InvalidArgumentError, ValueError)
    assert issubclass(kvblock.NotFoundError, KeyError)
    assert issubclass(kvblock.OutOfRangeError, IndexError)
    assert issubclass(kvblock.ResourceExhaustedError, RuntimeError)
    config = make_config(num_pages=0)
    with pytest.raises(kvblock.InvalidArgumentError, match="num_pages"):
        config.validate()
    with pytest.raises(ValueError):
        kvblock.BlockManager(config)


def test_admit_append_fork_free_round_trip():
    manager = kvblock.BlockManager(make_config())
    plan = manager.admit(1, np.arange(10, dtype=np.int32))
    assert plan.new_pages == 3 and plan.hit_pages == 0
    assert 1 in manager and len(manager) == 1
    assert manager.num_tokens(1) == 10
    manager.append(1, [100, 101])
    assert manager.num_tokens(1) == 12
    assert len(manager.pages(1)) == 3
    assert manager.pages(1, 1) == manager.pages(1)[1:]
    with pytest.raises(kvblock.OutOfRangeError, match="start 4"):
        manager.pages(1, 4)
    manager.fork(1, 2)
    assert list(manager.pages(2)) == list(manager.pages(1))
    result = manager.append(2, [7])
    assert result.new_pages == 1 and result.copy is None
    manager.free(1)
    manager.free(2)
    assert len(manager) == 0
    manager.check_invariants()
    stats = manager.stats
    assert stats["admitted"] == 1 and stats["forks"] == 1
    assert stats["freed"] == 2


def test_prefix_hits_and_hashes_on_arrival():
    manager = kvblock.BlockManager(make_config())
    prompt = np.arange(12, dtype=np.int32)
    hashes = manager.hash_prompt(prompt, cache_salt="tenant")
    assert hashes.shape == (3, 32) and hashes.dtype == np.uint8
    manager.admit(1, prompt, cache_salt="tenant", prompt_hashes=hashes)
    plan = manager.plan_admission(prompt, cache_salt="tenant",
                                  prompt_hashes=hashes)
    assert plan.hit_pages == 2  # a fully cached prompt recomputes its last.
    assert manager.plan_admission(prompt, cache_salt="other").hit_pages == 0


def test_a_failed_call_changes_nothing():
    manager = kvblock.BlockManager(make_config(num_pages=4))
    manager.admit(1, np.arange(8, dtype=np.int32))
    before = (manager.num_free, manager.num_tokens(1), manager.stats)
    with pytest.raises(kvblock.AlreadyExistsError, match="1"):
        manager.admit(1, [1, 2])
    with pytest.raises(kvblock.NotFoundError, match="42"):
        manager.free(42)
    with pytest.raises(kvblock.ResourceExhaustedError):
        manager.append(1, np.arange(100, 120, dtype=np.int32))
    with pytest.raises(kvblock.OutOfRangeError):
        manager.admit(2, np.arange(40, dtype=np.int32))
    assert (manager.num_free, manager.num_tokens(1), manager.stats) == before
    manager.check_invariants()


def test_chunked_prefill_and_drafts():
    manager = kvblock.BlockManager(make_config())
    prompt = np.arange(10, dtype=np.int32)
    plan = manager.admit(1, prompt, prefill_tokens=4)
    assert plan.computed_tokens == 4
    assert manager.prompt_tokens_left(1) == 6
    with pytest.raises(kvblock.FailedPreconditionError, match="prompt"):
        manager.append(1, [5])
    manager.append_prompt(1, prompt[4:])
    assert manager.prompt_tokens_left(1) == 0
    result = manager.set_drafts(1, 5)
    assert result.new_pages == 1 and manager.num_drafts(1) == 5
    manager.append(1, [1, 2])  # two drafts accepted.
    assert manager.num_tokens(1) == 12
    manager.check_invariants()


def test_a_step_through_batch_commit():
    manager, table, commit = make_stack()
    step = commit.commit(joins=[
        kvblock.Join(1, np.arange(6, dtype=np.int32)),
        kvblock.Join(2, fork_of=1),
        kvblock.Join(3, np.arange(50, 59, dtype=np.int32), prefill_tokens=4),
    ])
    assert step.batch == 3
    assert list(commit.slots) == [1, 2, 3]
    assert not step.old_to_new.flags.writeable
    table.upload()
    # The host rows are the sequences' pages, as read-only views.
    for slot, seq in enumerate(commit.slots):
        row = table.host_row(slot)
        assert not row.flags.writeable
        np.testing.assert_array_equal(row[:len(manager.pages(seq))],
                                      manager.pages(seq))
    # Decode 1 and 2 (sharing a partial page: 2 copies it), chunk 3's rest.
    step = commit.commit(
        append_counts=np.array([1, 1, 0], dtype=np.int32),
        append_tokens=np.array([7, 8], dtype=np.int32),
        prompt_chunks=[kvblock.PromptChunk(3, np.arange(54, 59,
                                                       dtype=np.int32))])
    assert step.copies.shape == (1, 2)
    assert manager.prompt_tokens_left(3) == 0
    # 1 finishes; the last row fills its hole.
    step = commit.commit(finished=np.array([1]))
    assert step.batch == 2
    assert list(step.old_to_new[:3]) == [-1, 1, 0]
    assert step.moves.tolist() == [[2, 0]]
    commit.check_invariants()
    table.upload()
    table.check_invariants()


def test_hash_prompt_with_groups_hashes_blocks_of_their_hash_page_size():
    # The groups' greatest common page size, not the config's, in both
    # directions: 8 of pages of 16 and 8; 32 of pages of 32.
    window = kvblock.AttentionKind.SLIDING_WINDOW
    for config_page, pages, blocks in ((16, (16, 8), 5), (16, (32, 32), 2)):
        options = kvblock.BlockManagerOptions()
        options.kv_cache_groups = [
            kvblock.KvCacheGroupSpec(page_size=pages[0]),
            kvblock.KvCacheGroupSpec(window, page_size=pages[1],
                                     sliding_window=9)]
        manager = kvblock.BlockManager(
            make_config(num_pages=128, page_size=config_page), options)
        prompt = np.arange(1, 41 if blocks == 5 else 71, dtype=np.int32)
        hashes = manager.hash_prompt(prompt)
        assert hashes.shape == (blocks, 32)
        # What admit takes: its hashes are checked against the prompt.
        assert manager.admit(1, prompt, prompt_hashes=hashes).hit_tokens == 0
        manager.check_invariants()


def test_kv_cache_groups_window_pages_and_one_table_of_both():
    # gpt-oss's shape: full attention and an 8-token sliding window.
    config = make_config(num_pages=64, max_pages_per_seq=16)
    options = kvblock.BlockManagerOptions()
    options.kv_cache_groups = [
        kvblock.KvCacheGroupSpec(page_size=4),
        kvblock.KvCacheGroupSpec(kvblock.AttentionKind.SLIDING_WINDOW,
                                 page_size=4, sliding_window=8),
    ]
    assert options.kv_cache_groups[1].sliding_window == 8
    manager = kvblock.BlockManager(config, options)
    assert manager.num_groups == 2
    assert manager.null_page == 0
    # One table of both groups' rows: group g's slot s is row g * 8 + s.
    table = kvblock.KVPageTable(2 * config.max_batch, 16, config.num_pages,
                                kvblock.Device.host())
    commit = kvblock.BatchCommit(manager, table)
    commit.commit(joins=[kvblock.Join(1, np.arange(30, dtype=np.int32))])
    for step in range(12):
        commit.commit(append_counts=np.array([1], dtype=np.int32),
                      append_tokens=np.array([100 + step], dtype=np.int32))
    window = manager.group_pages(1, 1)
    # (41 - 7) // 4 pages left the window: the null page in their place.
    assert window[:8] == [0] * 8 and 0 not in window[8:]
    assert 0 not in manager.group_pages(1, 0)
    np.testing.assert_array_equal(table.host_row(8)[:len(window)], window)
    # A fork copies the shared partial page in both groups.
    manager_copies = commit.commit(joins=[kvblock.Join(2, fork_of=1)])
    assert manager_copies.copy_groups.size == 0
    step = commit.commit(append_counts=np.array([1, 1], dtype=np.int32),
                         append_tokens=np.array([7, 8], dtype=np.int32))
    assert step.copy_groups.tolist() == [0, 1]
    assert step.copies.shape == (2, 2)
    commit.check_invariants()
    with pytest.raises(kvblock.InvalidArgumentError, match="group 2"):
        manager.group_pages(1, 2)
    # KV cache events name each page's group.
    options.enable_kv_events = True
    events_manager = kvblock.BlockManager(config, options)
    events_manager.admit(7, np.arange(9, dtype=np.int32))
    stored = events_manager.take_kv_events()
    assert [e.group_idx for e in stored] == [0, 1]
    assert stored[0].block_hashes == stored[1].block_hashes
    options.enable_kv_events = False
    # A table of one group's rows does not fit a commit of two.
    with pytest.raises(kvblock.InvalidArgumentError, match="2 KV cache groups"):
        kvblock.BatchCommit(
            kvblock.BlockManager(config, options),
            kvblock.KVPageTable(config.max_batch, 16, config.num_pages,
                                kvblock.Device.host()))


def test_values_that_do_not_fit_are_refused_not_cast():
    """Each refused before anything changes: no token, page or sequence is
    what a silent cast would have made of it."""
    manager = kvblock.BlockManager(make_config())
    manager.admit(1, np.arange(6, dtype=np.int32))
    _, _, commit = make_stack()
    commit.commit(joins=[kvblock.Join(1, np.arange(6, dtype=np.int32))])
    before = (manager.num_tokens(1), manager.pages(1), commit.batch)
    refusals = [
        (OverflowError, "4294967303 does not fit int32",
         lambda: manager.append(1, [2**32 + 7])),
        (OverflowError, "does not fit int32",
         lambda: manager.append(1, np.array([2**40]))),
        (OverflowError, "does not fit",
         lambda: manager.append(1, [2**70])),
        (TypeError, "expected integers, got an array of float64",
         lambda: manager.append(1, [1.9])),
        (TypeError, "float64", lambda: manager.append(1, [float("nan")])),
        (TypeError, "bool", lambda: manager.append(1, np.array([True]))),
        (ValueError, "got 2 dimensions",
         lambda: manager.append(1, np.zeros((2, 2), dtype=np.int32))),
        (TypeError, "float64",
         lambda: commit.commit(finished=[1.9])),
        (TypeError, "expected integers",
         lambda: commit.commit(append_counts=[1], append_tokens=["7"])),
        (ValueError, "page 32 is not in [0, 32)",
         lambda: manager.ref_count(32)),
        (ValueError, "page -1 is not in", lambda: manager.ref_count(-1)),
    ]
    for error, message, call in refusals:
        with pytest.raises(error, match=re.escape(message)):
            call()
        assert (manager.num_tokens(1), manager.pages(1), commit.batch) == \
            before
    # Other integer arrays and sequences are converted, when they fit.
    manager.append(1, np.array([5], dtype=np.int64))
    manager.append(1, [6, 7])
    assert manager.num_tokens(1) == 9
    manager.check_invariants()
    commit.check_invariants()


def test_integer_arguments_take_ints_only():
    """A scalar integer argument is an int, or numpy's integers (__index__),
    that fits; a float (numpy's too), a bool or another number is a
    TypeError, not truncated: np.float32(5.7) was token 5 and True sequence
    1. Nothing changes."""
    from fractions import Fraction
    manager = kvblock.BlockManager(make_config())
    manager.admit(1, [1, 2, 3])
    pool = kvblock.BlockPool(8)
    before = (manager.num_tokens(1), manager.pages(1), manager.num_free)
    for value in (np.float32(5.7), np.float64(1.0), 2.5, True, Fraction(1),
                  "1", 2**70, None):
        for call in (lambda: manager.append_token(1, value),
                     lambda: manager.append_token(value, 7),
                     lambda: manager.num_tokens(value),
                     lambda: manager.admit(value, [4, 5]),
                     lambda: pool.ref_count(value)):
            with pytest.raises(TypeError, match="incompatible function"):
                call()
        assert (manager.num_tokens(1), manager.pages(1),
                manager.num_free) == before
    # numpy's integers are ints; the values are what they say.
    manager.append_token(np.int64(1), np.int32(9))
    assert manager.num_tokens(np.uint8(1)) == 4
    assert pool.ref_count(np.int16(3)) == 0
    with pytest.raises(ValueError, match="page 8 is not in"):
        pool.ref_count(np.int64(8))
    manager.check_invariants()


def test_phase_times_count_only_while_on():
    manager, table, commit = make_stack()
    assert not commit.time_phases
    commit.commit(joins=[kvblock.Join(1, np.arange(6, dtype=np.int32))])
    assert commit.phase_times.total_ns == 0
    commit.time_phases = True
    commit.commit(joins=[kvblock.Join(2, np.arange(9, dtype=np.int32))])
    times = commit.phase_times
    parts = (times.frees_ns + times.admissions_ns + times.appends_ns +
             times.page_table_ns)
    assert times.admissions_ns > 0 and 0 < parts <= times.total_ns
    commit.time_phases = False
    commit.commit(finished=np.array([1]))
    assert commit.phase_times.total_ns == times.total_ns


def test_kv_events_are_taken_once_and_refused_when_off():
    options = kvblock.BlockManagerOptions()
    options.enable_kv_events = True
    config = kvblock.PagedKvConfig()
    config.num_pages, config.max_batch, config.max_pages_per_seq = 16, 4, 8
    config.page_size = 4
    prompt = np.arange(10, dtype=np.int32)
    manager = kvblock.BlockManager(config, options)
    manager.admit(1, prompt)
    (stored,) = manager.take_kv_events()
    assert stored.kind == "BlockStored" and stored.parent_block_hash is None
    assert list(stored.token_ids) == list(range(8))
    assert [bytes(h) for h in manager.hash_prompt(prompt)] == \
        stored.block_hashes
    assert manager.take_kv_events() == []
    off = kvblock.BlockManager(config)
    off.admit(1, prompt)
    before = (off.num_free, off.num_cached, off.stats)
    with pytest.raises(kvblock.FailedPreconditionError,
                       match="enable_kv_events"):
        off.take_kv_events()
    assert (off.num_free, off.num_cached, off.stats) == before


def test_a_failed_step_rolls_back():
    manager, table, commit = make_stack(num_pages=4)
    commit.commit(joins=[kvblock.Join(1, np.arange(8, dtype=np.int32))])
    before = (manager.num_free, list(commit.slots), manager.stats)
    with pytest.raises(kvblock.ResourceExhaustedError):
        commit.commit(append_counts=np.array([12], dtype=np.int32),
                      append_tokens=np.arange(12, dtype=np.int32))
    with pytest.raises(kvblock.InvalidArgumentError, match="append_counts"):
        commit.commit(append_counts=np.array([1, 1], dtype=np.int32),
                      append_tokens=np.arange(2, dtype=np.int32))
    assert (manager.num_free, list(commit.slots), manager.stats) == before
    commit.check_invariants()


def test_speculative_step_with_draft_counts():
    manager, table, commit = make_stack()
    commit.commit(joins=[kvblock.Join(1, np.arange(5, dtype=np.int32))])
    commit.commit(append_counts=np.array([1], dtype=np.int32),
                  append_tokens=np.array([9], dtype=np.int32),
                  draft_counts=np.array([4], dtype=np.int32))
    assert manager.num_drafts(1) == 4
    # Two drafts accepted plus the target's token; four new drafts.
    commit.commit(append_counts=np.array([3], dtype=np.int32),
                  append_tokens=np.array([10, 11, 12], dtype=np.int32),
                  draft_counts=np.array([4], dtype=np.int32))
    assert manager.num_tokens(1) == 9 and manager.num_drafts(1) == 4
    assert len(manager.pages(1)) == 4  # (9 + 4) tokens in pages of 4.
    commit.check_invariants()


def assert_rows_match_host(device_rows, table, commit):
    """The device table's K and V ids of every running slot are its host
    row's (V = K + num_pages)."""
    for slot in range(commit.batch):
        row = table.host_row(slot)
        live = row[row >= 0]
        np.testing.assert_array_equal(device_rows[slot, 0, :len(live)], live)
        np.testing.assert_array_equal(device_rows[slot, 1, :len(live)],
                                      live + table.num_pages)


def test_device_table_through_dlpack_matches_the_host_rows():
    manager, table, commit = make_stack()
    assert table.__dlpack_device__() == (1, 0)  # kDLCPU: the host device.
    commit.commit(joins=[kvblock.Join(1, np.arange(9, dtype=np.int32)),
                         kvblock.Join(2, np.arange(40, 45, dtype=np.int32))])
    table.upload()
    device = np.from_dlpack(table)
    assert device.shape == (table.max_batch, 2, table.max_pages_per_seq)
    assert device.dtype == np.int32
    assert_rows_match_host(device, table, commit)
    # The same memory, no copy: the next upload shows in the same array.
    commit.commit(finished=np.array([1]))
    table.upload()
    np.testing.assert_array_equal(device[0, 0, :2], manager.pages(2))
    del table, commit  # the exported array keeps the table alive.
    assert device.sum() != 0


def test_a_host_table_is_exported_with_no_stream():
    _, table, _ = make_stack()
    with pytest.raises(kvblock.InvalidArgumentError,
                       match="has no stream, got stream=5"):
        table.__dlpack__(stream=5)
    table.__dlpack__(stream=None)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


def read_cuda_capsule(capsule):
    """A CUDA DLPack capsule's tensor (without consuming the capsule) and
    its int32 contents, copied to the host with the CUDA runtime: no torch
    needed."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    tensor = DLTensor.from_address(get(capsule, b"dltensor"))
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    host = np.empty(shape, dtype=np.int32)
    name = ctypes.util.find_library("cudart") or "libcudart.so"
    cudart = ctypes.CDLL(name)
    cuda_memcpy_device_to_host = 2
    assert cudart.cudaMemcpy(
        ctypes.c_void_p(host.ctypes.data),
        ctypes.c_void_p(tensor.data + tensor.byte_offset),
        ctypes.c_size_t(host.nbytes), cuda_memcpy_device_to_host) == 0
    return tensor, host


def test_device_table_on_a_gpu_is_a_cuda_dlpack_tensor():
    try:
        device = kvblock.Device.cuda(0)
    except kvblock.Error as error:
        pytest.skip(f"no CUDA device: {error}")
    _, table, commit = make_stack(device)
    assert table.__dlpack_device__() == (2, 0)  # kDLCUDA, GPU 0.
    commit.commit(joins=[kvblock.Join(1, np.arange(9, dtype=np.int32))])
    table.upload()
    capsule = table.__dlpack__()
    tensor, rows = read_cuda_capsule(capsule)
    assert (tensor.device.device_type, tensor.device.device_id) == (2, 0)
    assert (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes) == \
        (0, 32, 1)  # int32.
    assert rows.shape == (table.max_batch, 2, table.max_pages_per_seq)
    assert_rows_match_host(rows, table, commit)
    # The same memory, no copy: the next upload shows through the capsule.
    commit.commit(joins=[kvblock.Join(2, np.arange(40, 45, dtype=np.int32))])
    table.upload()
    _, rows = read_cuda_capsule(capsule)
    assert commit.batch == 2
    assert_rows_match_host(rows, table, commit)


def test_a_gpu_table_is_exported_to_a_consumer_stream():
    """__dlpack__(stream=s) as the array API passes it: s waits for the
    uploads (the C++ gpu suite checks the order on a busy stream); None, -1,
    1 and 2 are taken, 0 and other values refused, nothing changed."""
    try:
        device = kvblock.Device.cuda(0)
    except kvblock.Error as error:
        pytest.skip(f"no CUDA device: {error}")
    _, table, commit = make_stack(device)
    commit.commit(joins=[kvblock.Join(1, np.arange(9, dtype=np.int32))])
    table.upload()
    cudart = ctypes.CDLL(ctypes.util.find_library("cudart") or "libcudart.so")
    stream = ctypes.c_void_p()
    cuda_stream_non_blocking = 1
    assert cudart.cudaStreamCreateWithFlags(
        ctypes.byref(stream), cuda_stream_non_blocking) == 0
    try:
        for consumer in (None, -1, 1, 2, stream.value):
            _, rows = read_cuda_capsule(table.__dlpack__(stream=consumer))
            assert_rows_match_host(rows, table, commit)
        for bad in (0, -2, True, 1.0, "1"):
            with pytest.raises(ValueError, match="stream must be None, -1"):
                table.__dlpack__(stream=bad)
        assert cudart.cudaStreamSynchronize(stream) == 0
    finally:
        cudart.cudaStreamDestroy(stream)


def test_block_pool_refcounts_copy_on_write_and_the_cache():
    pool = kvblock.BlockPool(4)
    page = pool.allocate()
    assert pool.num_used == 1 and pool.ref_count(page) == 1
    pool.retain(page)
    new, source, copied = pool.writable(page)  # shared: copied first.
    assert copied and source == page and new != page
    assert pool.ref_count(page) == 1 and pool.ref_count(new) == 1
    digest = bytes(range(32))
    assert pool.register_cached(page, digest) == page
    assert pool.lookup(digest) == page
    pool.release(page)
    assert pool.num_evictable == 1 and pool.num_cached == 1
    with pytest.raises(kvblock.InvalidArgumentError, match="32 bytes"):
        pool.lookup(b"short")
    with pytest.raises(kvblock.Error):
        pool.release(page)  # not in use any more.
    pool.check_invariants()
    assert pool.stats["cow_copies"] == 1


def test_batch_commit_is_a_sequence_of_its_slots():
    manager, table, commit = make_stack()
    commit.commit(joins=[kvblock.Join(5, [1, 2, 3]), kvblock.Join(9, [4])])
    assert len(commit) == 2 and list(commit) == [5, 9]


def test_running_sequences_change_only_through_the_commit():
    manager, table, commit = make_stack()
    commit.commit(joins=[kvblock.Join(1, [1, 2, 3, 4, 5])])
    pages = manager.pages(1)
    for call in (lambda: manager.append(1, [6]),
                 lambda: manager.append_token(1, 6),
                 lambda: manager.set_drafts(1, 2),
                 lambda: manager.free(1), lambda: manager.preempt(1)):
        with pytest.raises(kvblock.FailedPreconditionError,
                           match="sequence 1 runs in a BatchCommit"):
            call()
        assert manager.pages(1) == pages and manager.num_tokens(1) == 5
    step = commit.commit(append_counts=[4], append_tokens=[6, 7, 8, 9])
    table.upload()
    assert list(table.host_row(0)[:3]) == manager.pages(1)
    commit.check_invariants()
    commit.commit(finished=[1])
    manager.admit(1, [1, 2])  # left: the caller's again.
    manager.free(1)


def test_threads_sharing_a_manager_and_its_commit_are_serialized():
    # Four threads, 20,000 calls each, on one manager: one drives its
    # BatchCommit (and uploads the table), three call the manager directly
    # on sequences of their own, with shared prefixes so that they hit and
    # evict each other's cached pages. Calls that release the GIL (admit,
    # planning, hashing, prompt chunks, commit, upload) overlap the others;
    # the bindings serialize them, so each thread's view stays exact.
    import threading
    config = make_config(num_pages=1024, max_batch=16, max_pages_per_seq=128,
                         page_size=16)
    manager = kvblock.BlockManager(config)
    table = kvblock.KVPageTable(config.max_batch, config.max_pages_per_seq,
                                config.num_pages, kvblock.Device.host())
    commit = kvblock.BatchCommit(manager, table)
    prefixes = [np.arange(p * 1000, p * 1000 + 256, dtype=np.int32)
                for p in range(4)]
    # Hashing a long prompt takes a while without the GIL: its hashes,
    # known beforehand, show whether another call got in the middle.
    long_prompts = [np.arange(w, 16384 + w, dtype=np.int32) for w in range(4)]
    long_hashes = [manager.hash_prompt(p) for p in long_prompts]
    calls = 20_000
    failures = []

    def prompt(rng):
        n = int(rng.integers(1, 1500))
        prefix = prefixes[int(rng.integers(len(prefixes)))]
        return np.concatenate([prefix, rng.integers(0, 50, n, np.int32)])

    def direct(worker):
        rng = np.random.default_rng(worker)
        tokens = {}  # this thread's sequences: id -> tokens held.
        next_id = worker * 1_000_000
        for _ in range(calls):
            op = int(rng.integers(8))
            try:
                if op <= 1 or not tokens:
                    p = prompt(rng)
                    if op == 0:
                        manager.plan_admission(p)
                        hashes = manager.hash_prompt(long_prompts[worker])
                        if not np.array_equal(hashes, long_hashes[worker]):
                            failures.append(f"worker {worker}: hashes")
                        continue
                    seq = next_id
                    next_id += 1
                    manager.admit(seq, p, prefill_tokens=len(p) // 2)
                    left = manager.prompt_tokens_left(seq)
                    tokens[seq] = len(p) - left
                    if left:
                        manager.append_prompt(seq, p[len(p) - left:])
                        tokens[seq] = len(p)
                    continue
                seq = list(tokens)[int(rng.integers(len(tokens)))]
                if op <= 4:
                    n = int(rng.integers(1, 9))
                    manager.append(seq, rng.integers(0, 50, n, np.int32))
                    tokens[seq] += n
                elif op == 5:
                    manager.fork(seq, next_id)
                    tokens[next_id] = tokens[seq]
                    next_id += 1
                else:
                    manager.free(seq)
                    del tokens[seq]
            except (kvblock.ResourceExhaustedError, kvblock.OutOfRangeError):
                pass  # pages ran out, or a sequence grew too long.
            for seq in list(tokens)[-2:]:
                if manager.num_tokens(seq) != tokens[seq]:
                    failures.append(f"worker {worker}: sequence {seq}")
        for seq in tokens:
            manager.free(seq)

    def committer():
        rng = np.random.default_rng(0)
        next_id = 0
        for _ in range(calls):
            running = list(commit.slots)
            try:
                if rng.integers(4) == 0 and len(running) < config.max_batch:
                    commit.commit(joins=[kvblock.Join(next_id, prompt(rng))])
                    next_id += 1
                elif running and rng.integers(4) == 0:
                    commit.commit(finished=[running[-1]])
                else:
                    counts = rng.integers(0, 3, len(running), np.int32)
                    commit.commit(append_counts=counts,
                                  append_tokens=np.full(int(counts.sum()), 7,
                                                        np.int32))
            except (kvblock.ResourceExhaustedError, kvblock.OutOfRangeError):
                if running:
                    commit.commit(preempted=[running[0]])
            table.upload()
            running = list(commit.slots)
            if running:
                with pytest.raises(kvblock.FailedPreconditionError):
                    manager.free(running[-1])
            slot = int(rng.integers(max(1, commit.batch)))
            if slot < commit.batch:
                seq = commit.slots[slot]
                row = table.host_row(slot)
                if list(row[:len(manager.pages(seq))]) != manager.pages(seq):
                    failures.append(f"committer: slot {slot}")
        commit.commit(finished=list(commit.slots))

    def run(target, *args):
        try:
            target(*args)
        except Exception as error:  # noqa: BLE001 (reported below)
            failures.append(f"{target.__name__}{args}: {error!r}")

    threads = [threading.Thread(target=run, args=(committer,))]
    threads += [threading.Thread(target=run, args=(direct, w))
                for w in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stats = manager.stats  # each kind of call ran, and pages ran out.
    assert stats["admitted"] > 5000 and stats["forks"] > 1000
    assert stats["preemptions"] > 0 and stats["evictions"] > 0
    assert stats["prefix_hit_tokens"] > 0 and stats["prompt_chunks"] > 0
    assert len(manager) == 0
    commit.check_invariants()
    manager.check_invariants()
    assert manager.num_allocatable == config.num_pages


# Host tier -----------------------------------------------------------------

STORE = kvblock.HostCopyDirection.DEVICE_TO_HOST
LOAD = kvblock.HostCopyDirection.HOST_TO_DEVICE


def host_manager(host_pages=16, **options):
    """8 pages of 4 tokens and a host tier of `host_pages`."""
    settings = kvblock.BlockManagerOptions()
    settings.host_pages = host_pages
    for name, value in options.items():
        setattr(settings, name, value)
    return kvblock.BlockManager(make_config(num_pages=8), settings)


def test_host_tier_options_and_their_refusals():
    options = kvblock.BlockManagerOptions()
    assert options.host_pages == 0
    assert options.host_write_policy == kvblock.HostWritePolicy.WRITE_BACK
    options.host_write_policy = kvblock.HostWritePolicy.WRITE_THROUGH
    assert options.host_write_policy == kvblock.HostWritePolicy.WRITE_THROUGH
    with pytest.raises(kvblock.InvalidArgumentError, match="prefix caching"):
        host_manager(enable_prefix_caching=False)
    with pytest.raises(kvblock.InvalidArgumentError, match="host_pages"):
        host_manager(host_pages=-1)
    groups = [kvblock.KvCacheGroupSpec(page_size=4),
              kvblock.KvCacheGroupSpec(kvblock.AttentionKind.SLIDING_WINDOW,
                                       page_size=4, sliding_window=8)]
    with pytest.raises(kvblock.InvalidArgumentError,
                       match="one full-attention"):
        host_manager(kv_cache_groups=groups)
    # Without a host tier there is nothing to take, in the same dtype.
    plain = kvblock.BlockManager(make_config(num_pages=8))
    plain.admit(1, np.arange(9, dtype=np.int32))
    copies = plain.take_host_copies()
    assert copies.dtype == kvblock.HOST_COPY_DTYPE and len(copies) == 0
    assert plain.num_host_cached == 0


def test_host_copy_rows_have_the_cpp_layout():
    dtype = kvblock.HOST_COPY_DTYPE
    assert dtype.itemsize == 12
    assert dtype.names == ("device_page", "host_page", "direction")
    assert [dtype.fields[name][1] for name in dtype.names] == [0, 4, 8]
    assert (int(STORE), int(LOAD)) == (0, 1)
    rows = np.zeros(2, dtype=dtype)
    rows["direction"][1] = LOAD
    assert (rows["direction"] == LOAD).tolist() == [False, True]


def test_a_prompt_evicted_to_the_host_tier_is_loaded_back():
    manager = host_manager()
    prompt_a = np.arange(1, 18, dtype=np.int32)  # 4 full pages and a token.
    manager.admit(1, prompt_a)
    manager.free(1)
    # Write-back: nothing moves until the pool evicts A's cached pages.
    assert len(manager.take_host_copies()) == 0
    manager.admit(2, np.arange(1000, 1032, dtype=np.int32))  # all 8 pages.
    manager.free(2)
    stores = manager.take_host_copies()
    assert len(stores) == 4 and (stores["direction"] == STORE).all()
    assert len(set(stores["host_page"].tolist())) == 4
    assert manager.num_host_cached == 4
    assert manager.stats["host_stores"] == 4
    assert len(manager.take_host_copies()) == 0  # taken once.

    planned = manager.plan_admission(prompt_a)
    assert (planned.hit_pages, planned.host_hit_pages) == (4, 4)
    assert planned.new_pages == 1 and planned.pages_consumed == 5
    plan = manager.admit(3, prompt_a)
    assert plan.hit_tokens == 16 and plan.host_hit_pages == 4
    pages = manager.pages(3)
    copies = manager.take_host_copies()
    loads = copies[copies["direction"] == LOAD]
    # Each page it takes evicts one of B's (stored): 5 stores, 4 loads into
    # A's first four pages, from the host pages A went to.
    assert len(copies) == 9 and len(loads) == 4
    assert loads["device_page"].tolist() == pages[:4]
    assert set(loads["host_page"].tolist()) == set(stores["host_page"].tolist())
    stats = manager.stats
    assert stats["prefix_hit_tokens"] == 16 and stats["host_hit_tokens"] == 16
    assert stats["host_loads"] == 4 and stats["host_stores"] == 9
    assert stats["host_evictions"] == 0
    # Loaded, A's pages are device hits again.
    manager.free(3)
    again = manager.plan_admission(prompt_a)
    assert (again.hit_pages, again.host_hit_pages) == (4, 0)
    manager.check_invariants()


def test_write_through_stores_in_the_batch_after_the_step():
    manager = host_manager(
        host_write_policy=kvblock.HostWritePolicy.WRITE_THROUGH)
    manager.admit(1, np.arange(1, 18, dtype=np.int32))
    # Cached in this batch: stored in the next one, once its KV is computed.
    assert len(manager.take_host_copies()) == 0
    stores = manager.take_host_copies()
    assert len(stores) == 4 and (stores["direction"] == STORE).all()
    assert manager.num_host_cached == 4
    manager.check_invariants()


def test_a_step_carries_its_host_copies():
    config = make_config(num_pages=8, max_batch=4)
    options = kvblock.BlockManagerOptions()
    options.host_pages = 16
    manager = kvblock.BlockManager(config, options)
    table = kvblock.KVPageTable(4, 8, 8, kvblock.Device.host())
    commit = kvblock.BatchCommit(manager, table)
    prompt_a = np.arange(1, 18, dtype=np.int32)
    step = commit.commit(joins=[kvblock.Join(1, prompt_a)])
    assert len(step.host_copies) == 0
    assert step.host_copies.dtype == kvblock.HOST_COPY_DTYPE
    commit.commit(finished=[1])
    step = commit.commit(
        joins=[kvblock.Join(2, np.arange(1000, 1032, dtype=np.int32))])
    assert len(step.host_copies) == 4
    assert (step.host_copies["direction"] == STORE).all()
    assert not step.host_copies.flags.writeable  # a view, as `copies`.
    commit.commit(finished=[2])
    step = commit.commit(joins=[kvblock.Join(3, prompt_a)])
    loads = step.host_copies[step.host_copies["direction"] == LOAD]
    assert loads["device_page"].tolist() == manager.pages(3)[:4]
    assert manager.stats["host_hit_tokens"] == 16
    # The manager's batch was the step's: nothing is left to take.
    assert len(manager.take_host_copies()) == 0
    commit.check_invariants()


def test_block_pool_host_tier_stores_loads_and_parks():
    pool = kvblock.BlockPool(4, host_pages=2)
    assert pool.host_pages == 2 and pool.num_host_cached == 0
    hashes = [bytes([i]) * 32 for i in range(1, 5)]
    pages = [pool.allocate() for _ in hashes]
    for page, digest in zip(pages, hashes):
        pool.register_cached(page, digest)
    assert len(pool.take_host_copies()) == 0  # cached in that batch.
    for page in pages:
        pool.release(page)
    page = pool.allocate()  # evicts the LRU head, stored first.
    assert page == pages[0] and pool.lookup(hashes[0]) is None
    (store,) = pool.host_copies
    assert (store["device_page"], store["direction"]) == (page, STORE)
    assert pool.host_lookup(hashes[0]) == store["host_page"]
    assert pool.take_host_copies().tolist() == [
        (page, store["host_page"], int(STORE))]
    with pytest.raises(kvblock.FailedPreconditionError, match="host tier"):
        pool.load_from_host(hashes[1])  # on the device still.
    loaded = pool.load_from_host(hashes[0])  # into the next evicted page.
    assert pool.lookup(hashes[0]) == loaded and pool.ref_count(loaded) == 1
    copies = pool.host_copies
    assert copies["direction"].tolist() == [STORE, LOAD]
    assert copies["device_page"].tolist() == [loaded, loaded]
    # Released in its batch, a loaded page is held until the batch is taken.
    pool.release(loaded)
    assert pool.parked_pages == [loaded] and pool.num_used == 2
    with pytest.raises(kvblock.FailedPreconditionError, match="not taken"):
        pool.reset_prefix_cache()
    assert len(pool.take_host_copies()) == 2
    assert pool.parked_pages == [] and pool.num_used == 1
    stats = pool.stats
    assert (stats["host_stores"], stats["host_loads"]) == (2, 1)
    assert stats["host_evictions"] == 0
    pool.check_invariants()
