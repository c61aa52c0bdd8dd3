# Copyright 2026 The kvblock Authors.
# SPDX-License-Identifier: Apache-2.0
"""kvblock: the KV-cache block manager of an LLM serving engine, from Python.

The classes are the C++ library's (kvblock._kvblock, pybind11): PagedKvConfig,
BlockPool, BlockManagerOptions, BlockManager, Device, KVPageTable, BatchCommit with Join
and PromptChunk. A host tier's copies are numpy arrays of HOST_COPY_DTYPE rows
(device_page, host_page, direction: a HostCopyDirection). Token ids, counts and slot maps are numpy arrays; a step's
results are read-only views valid until the next commit. Every error is a
kvblock.Error, whose subclasses name the status code and also derive from
the matching built-in (InvalidArgumentError is a ValueError, NotFoundError a
KeyError, OutOfRangeError an IndexError, ...).
"""

import sys as _sys

from kvblock._build_info import built_for_python as _built_for_python
from kvblock._build_info import version as __version__

try:
    from kvblock._kvblock import (
        AdmissionPlan,
        AlreadyExistsError,
        AppendResult,
        AttentionKind,
        BatchCommit,
        BlockManager,
        BlockManagerOptions,
        BlockPool,
        CommitPhaseTimes,
        Device,
        DType,
        Error,
        FailedPreconditionError,
        HOST_COPY_DTYPE,
        HashAlgorithm,
        HostCopyDirection,
        HostWritePolicy,
        InternalError,
        InvalidArgumentError,
        Join,
        KVPageTable,
        KvCacheEvent,
        KvCacheGroupSpec,
        NotFoundError,
        OutOfRangeError,
        PagedKvConfig,
        PromptChunk,
        ResourceExhaustedError,
        StepResult,
        UnimplementedError,
        collect_metrics,
    )
except ImportError as _error:
    raise ImportError(
        f"kvblock {__version__}: its extension module does not load in "
        f"{_sys.executable} (Python {_sys.version.split()[0]}); it was built "
        f"for {_built_for_python}. Run that interpreter, or build kvblock for "
        f"this one (pip install --no-build-isolation . in the source tree, "
        f"with numpy and pybind11 installed): {_error}") from _error

__all__ = [
    "__version__",
    "AdmissionPlan",
    "AlreadyExistsError",
    "AppendResult",
    "AttentionKind",
    "BatchCommit",
    "BlockManager",
    "BlockManagerOptions",
    "BlockPool",
    "CommitPhaseTimes",
    "Device",
    "DType",
    "Error",
    "FailedPreconditionError",
    "HOST_COPY_DTYPE",
    "HashAlgorithm",
    "HostCopyDirection",
    "HostWritePolicy",
    "InternalError",
    "InvalidArgumentError",
    "Join",
    "KVPageTable",
    "KvCacheEvent",
    "KvCacheGroupSpec",
    "NotFoundError",
    "OutOfRangeError",
    "PagedKvConfig",
    "PromptChunk",
    "ResourceExhaustedError",
    "StepResult",
    "UnimplementedError",
    "collect_metrics",
]
