# Copyright 2026 The kvblock Authors.
"""kvblock: the KV-cache block manager of an LLM serving engine, from Python.

The classes are the C++ library's (kvblock._kvblock, pybind11): PagedKvConfig,
BlockPool, BlockManagerOptions, BlockManager, Device, KVPageTable, BatchCommit with Join
and PromptChunk. Token ids, counts and slot maps are numpy arrays; a step's
results are read-only views valid until the next commit. Every error is a
kvblock.Error, whose subclasses name the status code and also derive from
the matching built-in (InvalidArgumentError is a ValueError, NotFoundError a
KeyError, OutOfRangeError an IndexError, ...).
"""

from kvblock._kvblock import (
    AdmissionPlan,
    AlreadyExistsError,
    AppendResult,
    BatchCommit,
    BlockManager,
    BlockManagerOptions,
    BlockPool,
    CommitPhaseTimes,
    Device,
    DType,
    Error,
    FailedPreconditionError,
    HashAlgorithm,
    InternalError,
    InvalidArgumentError,
    Join,
    KVPageTable,
    KvCacheEvent,
    NotFoundError,
    OutOfRangeError,
    PagedKvConfig,
    PromptChunk,
    ResourceExhaustedError,
    StepResult,
    UnimplementedError,
)

__all__ = [
    "AdmissionPlan",
    "AlreadyExistsError",
    "AppendResult",
    "BatchCommit",
    "BlockManager",
    "BlockManagerOptions",
    "BlockPool",
    "CommitPhaseTimes",
    "Device",
    "DType",
    "Error",
    "FailedPreconditionError",
    "HashAlgorithm",
    "InternalError",
    "InvalidArgumentError",
    "Join",
    "KVPageTable",
    "KvCacheEvent",
    "NotFoundError",
    "OutOfRangeError",
    "PagedKvConfig",
    "PromptChunk",
    "ResourceExhaustedError",
    "StepResult",
    "UnimplementedError",
]
