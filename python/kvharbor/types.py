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
    # The same keys, each a chained hash naming its page and every page
    # before it: a page is stored and found by its own key alone (no prefix
    # needed; match returns the run of leading keys each present).
    PAGE_HASHES = 2


class Tier(enum.IntEnum):
    """Where a cached page is stored, hottest first (docs/tiers.md)."""
    RAW = 0              # raw bytes in the namespace's page pool
    HOST_COMPRESSED = 1  # a codec buffer in the daemon's host memory
    DISK = 2             # a codec buffer in a file of the disk tier


def _tier(value):
    return Tier(value) if value in Tier._value2member_map_ else value


class FetchTransform(enum.IntEnum):
    """What Client.fetch_transformed asks the daemon to do to the pages."""
    NONE = 0
    # LOSSY and LENGTH-CHANGING: the namespace's KVCM compressor merges
    # tokens; the result is a new, shorter KV sequence, not the pages.
    KVCM = 1


class KvtcRowKind(enum.IntEnum):
    PER_TOKEN = 0
    PER_PAGE = 1


class RopeStyle(enum.IntEnum):
    """How keys were rotated (undone before online calibration)."""
    NONE = 0
    INTERLEAVED = 1  # pairs (2i, 2i+1)
    HALF_SPLIT = 2   # pairs (i, i + head_dim/2)


class CalibrationState(enum.IntEnum):
    NONE = 0         # no online calibration
    SAMPLING = 1     # sampling; evicting with the fallback codec
    CALIBRATING = 2  # queued or running in the background
    READY = 3        # calibrated (or uploaded)


def _enum_or_int(cls, value):
    return cls(value) if value in cls._value2member_map_ else value


@dataclasses.dataclass(frozen=True)
class OnlineCalibration:
    """Online calibration of a kvtc namespace (docs/calibration.md): until
    the daemon has sampled ``min_tokens`` inserted tokens it evicts with the
    fp8 codec, then calibrates KVTC in the background. 0 = the daemon's
    default for each number; ``sink_tokens`` None = the default (4)."""
    min_tokens: int = 0
    max_sample_tokens: int = 0
    target_ratio: float = 0.0
    row_kind: KvtcRowKind = KvtcRowKind.PER_TOKEN
    rope_style: RopeStyle = RopeStyle.NONE
    sink_tokens: Optional[int] = None

    @classmethod
    def from_dict(cls, d):
        """None when the namespace has no online calibration."""
        if not d or not d.get("enabled"):
            return None
        return cls(min_tokens=d.get("min_tokens", 0),
                   max_sample_tokens=d.get("max_sample_tokens", 0),
                   target_ratio=d.get("target_ratio") or 0.0,
                   row_kind=_enum_or_int(KvtcRowKind, d.get("row_kind", 0)),
                   rope_style=_enum_or_int(RopeStyle, d.get("rope_style", 0)),
                   sink_tokens=d.get("sink_tokens"))


@dataclasses.dataclass(frozen=True)
class CalibrationStats:
    """A namespace's calibration now (NamespaceStats.calibration)."""
    state: CalibrationState = CalibrationState.NONE
    tokens_seen: int = 0      # inserted tokens offered to the sampler
    tokens_sampled: int = 0   # tokens in the sample now
    codec: str = ""           # the codec evictions use now
    fingerprint: int = 0      # its calibration (0 = none)
    pinned: bool = False
    # What the active calibration expected when it was made (0 = unknown;
    # docs/calibration.md).
    target_ratio: float = 0.0      # the ratio asked for
    expected_ratio: float = 0.0    # raw / stored bytes, one page per buffer
    keys_rel_error: float = 0.0    # sqrt(squared error / variance), held out
    values_rel_error: float = 0.0

    @classmethod
    def from_dict(cls, d):
        d = dict(d or {})
        d["state"] = _enum_or_int(CalibrationState, d.get("state", 0))
        return _from_dict(cls, d)


@dataclasses.dataclass(frozen=True)
class CalibrationInfo:
    """One calibration of a namespace (Client.list_calibrations)."""
    codec: str
    fingerprint: int
    source: str  # "config", "uploaded" or "online"
    created_unix_ms: int = 0
    active: bool = False
    pinned: bool = False
    pages: int = 0  # cold pages encoded with it


@dataclasses.dataclass(frozen=True)
class CompressedPage:
    """One page of Client.fetch_compressed: the codec buffer as the daemon
    stores it (decode with Client.decode_page)."""
    handle: int
    tier: "Tier"
    codec: str
    calibration_fingerprint: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class TransformedKv:
    """What Client.fetch_transformed returns: ONE KV sequence of
    ``output_tokens`` tokens made from the ``input_tokens`` tokens of the
    pages, in the namespace's dtype, laid out [2 (K then V)][layer][token]
    [kv_head][head_dim] whatever the page layout. Lossy."""
    input_tokens: int
    output_tokens: int
    nbytes: int  # bytes written into the destination


@dataclasses.dataclass(frozen=True)
class HostPage:
    handle: int
    offset: int    # from byte 0 of the arena mapping
    bytes: int     # the namespace's page bytes
    checksum: int  # XXH3-64 of the page, as Fetch sends it


@dataclasses.dataclass(frozen=True)
class HostHandles:
    """Where a lease's pages lie in the daemon's shared host arena
    (Client.host_handles; docs/operations.md "Same-host Fetch")."""
    socket_path: str
    daemon_id: int
    arena_bytes: int
    lease_expires_unix_ms: int
    pages: Tuple[HostPage, ...]

    @classmethod
    def from_dict(cls, d):
        return cls(d["socket_path"], d["daemon_id"], d["arena_bytes"],
                   d["lease_expires_unix_ms"],
                   tuple(HostPage(**p) for p in d["pages"]))


@dataclasses.dataclass(frozen=True)
class DevicePage:
    handle: int
    offset: int  # from the mapped arena's base address
    bytes: int


@dataclasses.dataclass(frozen=True)
class DeviceHandles:
    """Where a lease's pages lie in the daemon's GPU arena (Client.
    device_handles; docs/tiers.md "Same-host zero copy"): the 64-byte
    cudaIpcMemHandle_t, the GPU's ordinal in the daemon and its UUID."""
    ipc_handle: bytes
    device: int
    device_uuid: bytes
    arena_bytes: int
    lease_expires_unix_ms: int
    pages: Tuple[DevicePage, ...]

    @classmethod
    def from_dict(cls, d):
        return cls(bytes.fromhex(d["ipc_handle"]), d["device"],
                   bytes.fromhex(d["device_uuid"]), d["arena_bytes"],
                   d["lease_expires_unix_ms"],
                   tuple(DevicePage(**p) for p in d["pages"]))


class LeasePages:
    """What a matched lease (Lease, ClusterLease) says of its pages, from its
    ``id`` (0: not locked) and ``handles``."""

    @property
    def locked(self):
        return self.id != 0

    @property
    def num_pages(self):
        return len(self.handles)


@dataclasses.dataclass(frozen=True)
class HostFetchStats:
    """What the same-host Fetch path of one Client did so far."""
    shm_fetches: int = 0
    shm_pages: int = 0
    fallbacks: int = 0
    checksum_mismatches: int = 0
    connects: int = 0


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
class CodecStats:
    """The cold pages one codec encoded, over every cold tier."""
    codec: str
    pages: int = 0
    bytes: int = 0  # codec buffer bytes

    def stored_ratio(self, page_bytes) -> float:
        """Raw bytes of these pages over the bytes they take (0: none)."""
        return self.pages * page_bytes / self.bytes if self.bytes else 0.0


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
    # Bytes the namespace holds in the daemon's memory budget.
    memory_bytes: int = 0
    codecs: Tuple[CodecStats, ...] = ()  # cold pages by codec
    calibration: CalibrationStats = CalibrationStats()

    def codec(self, name) -> CodecStats:
        """The cold pages of one codec (zeros when it has none)."""
        for c in self.codecs:
            if c.codec == name:
                return c
        return CodecStats(name)

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
        d["codecs"] = tuple(_from_dict(CodecStats, c) for c in d.get("codecs", ()))
        d["calibration"] = CalibrationStats.from_dict(d.get("calibration"))
        return _from_dict(cls, d)


@dataclasses.dataclass(frozen=True)
class Topology:
    """Which part of which model a namespace's pages hold (proto
    kvharbor.v1.Topology; docs/engines_api.md "Topology").

    ``model``: the engine's model id ("" = not given). Layers
    [``layer_begin``, ``layer_end``) of ``total_layers`` (a pipeline stage)
    and KV heads [``kv_head_begin``, ``kv_head_end``) of ``total_kv_heads``
    (a tensor-parallel rank). 0 for an end = begin + the geometry's
    num_layers / num_kv_heads; 0 for a total = the end. The default
    (all unset) is the whole model. A create_namespace(if_not_exists=True)
    that claims an existing namespace with another topology, geometry or
    key kind raises AlreadyExistsError naming the first differing field
    (``spec.topology.layer_begin``, ``spec.geometry.dtype``, ...).
    """
    model: str = ""
    layer_begin: int = 0
    layer_end: int = 0
    total_layers: int = 0
    kv_head_begin: int = 0
    kv_head_end: int = 0
    total_kv_heads: int = 0

    @classmethod
    def from_dict(cls, d):
        return cls() if not d else _from_dict(cls, d)


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
    kvcm_path: str = ""  # KVCM weights on the daemon's machine; "" = none
    online_calibration: Optional[OnlineCalibration] = None  # None = off
    key_kind: KeyKind = KeyKind.TOKENS
    # Resolved by the daemon (an older daemon or library: all unset).
    topology: Topology = Topology()

    @classmethod
    def from_dict(cls, d):
        kind = {"tokens": KeyKind.TOKENS, "page_keys": KeyKind.PAGE_KEYS,
                "page_hashes": KeyKind.PAGE_HASHES}
        return cls(name=d["name"], geometry=Geometry.from_dict(d["geometry"]),
                   capacity_bytes=d["capacity_bytes"], codec=d["codec"],
                   stats=NamespaceStats.from_dict(d["stats"]),
                   calibration_fingerprint=d.get("calibration_fingerprint", 0),
                   host_compressed_bytes=d.get("host_compressed_bytes", 0),
                   disk_dir=d.get("disk_dir", ""),
                   disk_bytes=d.get("disk_bytes", 0),
                   kvcm_path=d.get("kvcm_path", ""),
                   online_calibration=OnlineCalibration.from_dict(
                       d.get("online_calibration")),
                   key_kind=kind.get(d.get("key_kind", "tokens"),
                                     KeyKind.TOKENS),
                   topology=Topology.from_dict(d.get("topology")))


@dataclasses.dataclass(frozen=True)
class CreateNamespaceResult:
    info: NamespaceInfo
    created: bool  # False: it existed already (if_not_exists)


@dataclasses.dataclass(frozen=True)
class GlobalStats:
    pool_budget_bytes: int = 0
    pool_reserved_bytes: int = 0  # only with a shared arena or a device pool
    memory_used_bytes: int = 0
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
    # "remote_bulk", "raw_remote" or "cpu" for a fetch; "device_ipc", "host_shm",
    # "remote_bulk", "pinned"
    # or "cpu" for an insert;
    # two joined with "+" when raw and cold pages took different paths.
    path: str
    pages: int
    bytes_moved: int  # bytes the path's copy stage moved (wire, PCIe, D2D)
    seconds: float
    stages: dict  # stage name -> seconds ("rpc", "h2d", "decode", "scatter")
    fallbacks: Tuple[str, ...] = ()  # faster paths that could not serve, why
    # Bytes the "h2d" stage copied on a compressed path, which are not
    # bytes_moved (the merged KVTC batches of its gathered copies, the pages
    # it decoded on the CPU); 0 on other paths.
    h2d_bytes: int = 0

    @classmethod
    def from_dict(cls, d):
        return cls(path=d["path"], pages=d["pages"],
                   bytes_moved=d["bytes_moved"], seconds=d["seconds"],
                   stages=dict(d.get("stages", {})),
                   fallbacks=tuple(d.get("fallbacks", ())),
                   h2d_bytes=d.get("h2d_bytes", 0))


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
