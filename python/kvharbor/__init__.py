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
from .cluster import (ClusterClient, ClusterInsertResult, ClusterLease,
                      ClusterLookup, ClusterMemberStatus)
from .errors import (AlreadyExistsError, DataLossError, DeadlineExceededError,
                     FailedPreconditionError, InvalidArgumentError,
                     KvHarborError, NotFoundError, OutOfRangeError,
                     PermissionDeniedError, ResourceExhaustedError, StatusCode,
                     UnauthenticatedError, UnavailableError,
                     UnimplementedError)
from .types import (Calibration, CalibrationInfo, CalibrationState,
                    CalibrationStats, CodecStats, CompressedPage, CreateNamespaceResult,
                    DeviceHandles, DevicePage, DType, EvictResult, FetchFormat,
                    FetchResult, FetchTransform, Geometry, GlobalStats,
                    HostFetchStats, HostHandles, HostPage, InsertResult,
                    KeyKind, KvtcRowKind, LayoutInsertResult, NamespaceInfo,
                    NamespaceStats, OnlineCalibration, PageLayout, RopeStyle,
                    Stats, Tier, TierStats, Topology, TransferResult,
                    TransformedKv, TreeDump)

# The contract's short name of INVALID_ARGUMENT errors.
InvalidArgument = InvalidArgumentError


__version__ = "0.1.0"

__all__ = [
    "Client", "Lease", "PagedKvLayout", "TransferResult", "LayoutInsertResult",
    "InvalidArgument", "Upload", "KeyKind", "ClusterClient",
    "ClusterInsertResult", "ClusterLease",
    "ClusterLookup", "ClusterMemberStatus", "KvHarborError", "StatusCode",
    "InvalidArgumentError", "NotFoundError", "AlreadyExistsError",
    "DeadlineExceededError", "FailedPreconditionError", "OutOfRangeError",
    "ResourceExhaustedError", "UnavailableError", "UnimplementedError",
    "DataLossError", "PermissionDeniedError", "UnauthenticatedError",
    "Calibration", "CalibrationInfo", "CalibrationState", "CalibrationStats", "CodecStats",
    "CompressedPage", "CreateNamespaceResult", "DeviceHandles", "DevicePage",
    "DType", "EvictResult", "FetchFormat", "FetchResult", "FetchTransform",
    "Geometry", "GlobalStats", "HostFetchStats", "HostHandles", "HostPage",
    "InsertResult", "KvtcRowKind", "NamespaceInfo", "NamespaceStats",
    "OnlineCalibration", "PageLayout", "RopeStyle", "Stats", "Tier",
    "TierStats", "Topology", "TransformedKv", "TreeDump",
]
