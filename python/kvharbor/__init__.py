"""kvharbor: Python client of the kvharbor KV-cache daemon.

    import kvharbor
    with kvharbor.Client("127.0.0.1:50051") as c:
        c.create_namespace("llama", kvharbor.Geometry(32, 8, 128, 16),
                           if_not_exists=True)
        c.insert("llama", tokens, pages)           # any buffer, no copy
        with c.match("llama", tokens, lock=True) as lease:
            lease.fetch_into(dst)                   # preallocated buffer

See docs/python.md. The native part is libkvharbor_c.so (KVHARBOR_LIB).
"""

from .client import Client, Lease
from .engine import Upload
from .layout import PagedKvLayout
from .errors import (AlreadyExistsError, DataLossError, DeadlineExceededError,
                     FailedPreconditionError, InvalidArgumentError,
                     KvHarborError, NotFoundError, OutOfRangeError,
                     PermissionDeniedError, ResourceExhaustedError, StatusCode,
                     UnauthenticatedError, UnavailableError,
                     UnimplementedError)
from .types import (Calibration, CreateNamespaceResult, DType, EvictResult,
                    FetchFormat, FetchResult, Geometry, GlobalStats,
                    InsertResult, KeyKind, LayoutInsertResult, NamespaceInfo,
                    NamespaceStats, PageLayout, Stats, Tier, TierStats,
                    TransferResult, TreeDump)

# The contract's short name of INVALID_ARGUMENT errors.
InvalidArgument = InvalidArgumentError

__version__ = "0.1.0"

__all__ = [
    "Client", "Lease", "PagedKvLayout", "TransferResult", "Upload", "KeyKind",
    "LayoutInsertResult", "InvalidArgument", "KvHarborError", "StatusCode", "InvalidArgumentError",
    "NotFoundError", "AlreadyExistsError", "DeadlineExceededError",
    "FailedPreconditionError", "OutOfRangeError", "ResourceExhaustedError",
    "UnavailableError", "UnimplementedError", "DataLossError",
    "PermissionDeniedError", "UnauthenticatedError",
    "Calibration", "CreateNamespaceResult", "DType", "EvictResult", "FetchFormat",
    "FetchResult", "Geometry", "GlobalStats", "InsertResult", "NamespaceInfo",
    "NamespaceStats", "PageLayout", "Stats", "Tier", "TierStats", "TreeDump",
]
