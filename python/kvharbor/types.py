"""Typed results of the kvharbor Python client (plain dataclasses)."""

import dataclasses
import enum
from typing import List, Optional, Tuple


class DType(enum.IntEnum):
    BF16 = 1
    FP16 = 2
    FP32 = 3
    FP8_E4M3 = 4

    @property
    def itemsize(self):
        return {1: 2, 2: 2, 3: 4, 4: 1}[int(self)]


class PageLayout(enum.IntEnum):
    UNSPECIFIED = 0
    KV_LAYER_TOKEN_HEAD_DIM = 1  # [2][layer][token][kv_head][head_dim]
    LAYER_KV_TOKEN_HEAD_DIM = 2  # [layer][2][token][kv_head][head_dim]


class FetchFormat(enum.IntEnum):
    RAW = 0
    COMPRESSED = 1  # codec buffers on the wire, decoded to raw by the SDK


class KeyKind(enum.IntEnum):
    """What a namespace is keyed by (docs/engines_api.md)."""
    TOKENS = 0     # token ids, page_size per page
    PAGE_KEYS = 1  # one opaque key per page (1..32 bytes; see kvharbor.engine)


class Tier(enum.IntEnum):
    """Where a cached page is stored, hottest first (docs/tiers.md)."""
    RAW = 0              # raw bytes in the namespace's page pool
    HOST_COMPRESSED = 1  # a codec buffer in the daemon's host memory
    DISK = 2             # a codec buffer in a file of the disk tier


def _tier(value):
    return Tier(value) if value in Tier._value2member_map_ else value


@dataclasses.dataclass(frozen=True)
class Geometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int  # tokens per page
    dtype: DType = DType.BF16
    layout: PageLayout = PageLayout.KV_LAYER_TOKEN_HEAD_DIM
    rope_theta: float = 0.0  # 0 = none

    @property
    def page_bytes(self):
        return (2 * self.num_layers * self.page_size * self.num_kv_heads
                * self.head_dim * DType(self.dtype).itemsize)

    @classmethod
    def from_dict(cls, d):
        layout = d.get("layout", 0)
        return cls(num_layers=d["num_layers"], num_kv_heads=d["num_kv_heads"],
                   head_dim=d["head_dim"], page_size=d["page_size"],
                   dtype=DType(d["dtype"]) if d["dtype"] in DType._value2member_map_ else d["dtype"],
                   layout=PageLayout(layout) if layout in PageLayout._value2member_map_ else layout,
                   rope_theta=d.get("rope_theta") or 0.0)


def _from_dict(cls, d):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclasses.dataclass(frozen=True)
class TierStats:
    tier: Tier
    pages: int = 0
    bytes: int = 0  # raw: page bytes; cold tiers: codec buffer bytes

    @classmethod
    def from_dict(cls, d):
        return cls(tier=_tier(d["tier"]), pages=d.get("pages", 0),
                   bytes=d.get("bytes", 0))


@dataclasses.dataclass(frozen=True)
class NamespaceStats:
    name: str = ""
    capacity_pages: int = 0
    free_pages: int = 0
    cached_pages: int = 0
    evictable_pages: int = 0
    protected_pages: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    inserted_pages: int = 0
    dedup_pages: int = 0
    evicted_pages: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    active_leases: int = 0
    index_nodes: int = 0
    index_memory_bytes: int = 0
    page_bytes: int = 0
    uploads_in_flight: int = 0
    tiers: Tuple[TierStats, ...] = ()  # hottest first
    demoted_pages: int = 0
    promoted_pages: int = 0
    disk_write_errors: int = 0
    corrupt_dropped: int = 0  # disk pages dropped for a bad checksum
    # Page bytes GetHostHandles offered to same-host clients (not in
    # bytes_out: the daemon does not see shared-memory copies).
    host_ipc_bytes: int = 0

    def tier(self, tier) -> TierStats:
        """The stats of one tier (zeros when the daemon does not report it)."""
        for t in self.tiers:
            if t.tier == tier:
                return t
        return TierStats(_tier(int(tier)))

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["tiers"] = tuple(TierStats.from_dict(t) for t in d.get("tiers", ()))
        return _from_dict(cls, d)


@dataclasses.dataclass(frozen=True)
class NamespaceInfo:
    name: str
    geometry: Geometry
    capacity_bytes: int
    codec: str
    stats: NamespaceStats
    calibration_fingerprint: int = 0  # 0 = no calibration
    host_compressed_bytes: int = 0  # 0 = no cold tiers
    disk_dir: str = ""  # "" = no disk tier
    disk_bytes: int = 0  # 0 = unlimited
    key_kind: KeyKind = KeyKind.TOKENS

    @classmethod
    def from_dict(cls, d):
        kind = {"tokens": KeyKind.TOKENS, "page_keys": KeyKind.PAGE_KEYS}
        return cls(name=d["name"], geometry=Geometry.from_dict(d["geometry"]),
                   capacity_bytes=d["capacity_bytes"], codec=d["codec"],
                   stats=NamespaceStats.from_dict(d["stats"]),
                   calibration_fingerprint=d.get("calibration_fingerprint", 0),
                   host_compressed_bytes=d.get("host_compressed_bytes", 0),
                   disk_dir=d.get("disk_dir", ""),
                   disk_bytes=d.get("disk_bytes", 0),
                   key_kind=kind.get(d.get("key_kind", "tokens"),
                                     KeyKind.TOKENS))


@dataclasses.dataclass(frozen=True)
class CreateNamespaceResult:
    info: NamespaceInfo
    created: bool  # False: it existed already (if_not_exists)


@dataclasses.dataclass(frozen=True)
class GlobalStats:
    pool_budget_bytes: int = 0
    pool_reserved_bytes: int = 0
    namespaces: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    cached_pages: int = 0
    active_leases: int = 0
    uptime_seconds: int = 0


@dataclasses.dataclass(frozen=True)
class Stats:
    global_: GlobalStats
    namespaces: List[NamespaceStats]

    def namespace(self, name) -> Optional[NamespaceStats]:
        for n in self.namespaces:
            if n.name == name:
                return n
        return None

    @classmethod
    def from_dict(cls, d):
        return cls(global_=_from_dict(GlobalStats, d["global"]),
                   namespaces=[NamespaceStats.from_dict(n)
                               for n in d["namespaces"]])


@dataclasses.dataclass(frozen=True)
class InsertResult:
    already_present_tokens: int
    pages_stored: int
    pages_evicted: int  # unlocked pages evicted to make room


@dataclasses.dataclass(frozen=True)
class TransferResult:
    """What a fetch into (or insert from) a PagedKvLayout did."""
    # "device_ipc", "host_shm", "compressed_local", "compressed_remote",
    # "raw_remote" or "cpu" for a fetch; "pinned" or "cpu" for an insert;
    # two joined with "+" when raw and cold pages took different paths.
    path: str
    pages: int
    bytes_moved: int  # bytes the path's copy stage moved (wire, PCIe, D2D)
    seconds: float
    stages: dict  # stage name -> seconds ("rpc", "h2d", "decode", "scatter")
    fallbacks: Tuple[str, ...] = ()  # faster paths that could not serve, why

    @classmethod
    def from_dict(cls, d):
        return cls(path=d["path"], pages=d["pages"],
                   bytes_moved=d["bytes_moved"], seconds=d["seconds"],
                   stages=dict(d.get("stages", {})),
                   fallbacks=tuple(d.get("fallbacks", ())))


@dataclasses.dataclass(frozen=True)
class LayoutInsertResult(InsertResult):
    """insert_from_layout: the InsertResult, the path and its transfer."""
    path: str = ""
    transfer: Optional[TransferResult] = None


@dataclasses.dataclass(frozen=True)
class FetchResult:
    num_pages: int
    page_bytes: int
    bytes_written: int


@dataclasses.dataclass(frozen=True)
class EvictResult:
    pages_evicted: int
    bytes_freed: int


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What Client.get_calibration returns: the namespace's codec, its
    canonical calibration bytes (b"" without one; accepted back by
    create_namespace(calibration=...)) and their fingerprint (0 = none)."""
    codec: str
    bytes: bytes
    fingerprint: int


@dataclasses.dataclass(frozen=True)
class TreeDump:
    text: str
    nodes: int


HandleTuple = Tuple[int, ...]
