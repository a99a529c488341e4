"""kvharbor.ClusterClient: several kvharbord daemons used as one cache.

A thin layer over the cluster client of libkvharbor_c (client/
cluster_client.h, docs/cluster.md). Members come from a static list, a DNS
name or etcd. Every prefix is owned by one member (rendezvous hashing of the
namespace and the prefix's first page of tokens), so a match is one round
trip to one daemon. A member that does not answer is marked down for a while
and its prefixes are misses meanwhile: match matches nothing and insert says
``dropped``, never an error; errors that are the caller's (bad input, an
unknown namespace) still raise.

Thread-safe like Client; close() must not race with other calls.
"""

import ctypes
import dataclasses
import json
from typing import List, Optional, Tuple

from . import _native
from ._args import (_Tokens, _fetch_source, _ms, _opt_str, _str, _timeout_ms,
                    _u64)
from ._native import Buffer, NativeHandle, check, library, need, take_string
from .client import Client
from .errors import invalid
from .types import InsertResult, LeasePages, Stats


@dataclasses.dataclass(frozen=True)
class ClusterLease(LeasePages):
    """What ClusterClient.match returns: the matched prefix on ``member``
    (the daemon that answered; "" = a miss because no live member owns it).
    A context manager: leaving the block releases the lease."""
    cluster: "ClusterClient"
    namespace: str
    member: str
    id: int  # 0 without lock or when nothing matched
    handles: Tuple[int, ...]
    matched_tokens: int
    page_bytes: int

    def fetch_into(self, dst, timeout=None):
        """The matched pages into ``dst`` (page i at i * page_bytes), from
        the member that matched. UnavailableError when it went away."""
        return self.cluster.fetch_into(self, dst, timeout=timeout)

    def release(self, timeout=None):
        if self.locked:
            self.cluster.release(self, timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


@dataclasses.dataclass(frozen=True)
class ClusterLookup:
    """ClusterClient.lookup: the longest cached prefix and its pages."""
    member: str
    matched_tokens: int
    page_bytes: int
    num_pages: int


@dataclasses.dataclass(frozen=True)
class ClusterInsertResult:
    member: str
    result: InsertResult
    dropped: bool  # the owner was down: nothing was stored


@dataclasses.dataclass(frozen=True)
class ClusterMemberStatus:
    address: str
    epoch: int
    up: bool
    calls: int
    failures: int
    down_misses: int
    dropped_inserts: int
    stats: Optional[Stats]  # None when it did not answer (or not asked)
    stats_error: str = ""


class ClusterClient(NativeHandle):
    """Several daemons as one cache (see the module docstring)."""

    def __init__(self, *, members: Optional[List[str]] = None,
                 dns: Optional[str] = None, etcd: Optional[List[str]] = None,
                 etcd_prefix: Optional[str] = None, member_timeout=1.0,
                 retry_down_after=2.0, timeout=30.0, **client_options):
        """Exactly one of ``members`` (HOST:PORT list), ``dns`` (NAME:PORT,
        re-resolved every 5 s) or ``etcd`` (endpoints; the daemons'
        registrations under ``etcd_prefix``, None = "/kvharbor/members/").
        ``member_timeout``: longest a call to one member may take (s);
        ``retry_down_after``: how long a failed member stays down (s).
        ``timeout`` and ``client_options`` (tls, tls_ca_file, ..., token)
        configure every member's connection as for Client."""
        self._lib = library()
        self._handle = None
        opts = _native._ClusterOptions()
        opts.struct_size = ctypes.sizeof(_native._ClusterOptions)
        given = [n for n, v in (("members", members), ("dns", dns),
                                ("etcd", etcd)) if v is not None]
        if len(given) != 1:
            raise invalid("members", "give exactly one of members, dns, etcd")
        if members is not None:
            opts.members = _comma_list(members, "members")
        if dns is not None:
            opts.dns = _str(dns, "dns")
        if etcd is not None:
            opts.etcd = _comma_list(etcd, "etcd")
        if etcd_prefix is not None:
            opts.etcd_prefix = _opt_str(etcd_prefix, "etcd_prefix")
        opts.member_timeout_ms = _ms(member_timeout, "member_timeout")
        opts.retry_down_after_ms = _ms(retry_down_after, "retry_down_after")
        conn = Client._connect_options(timeout, client_options, always=True)
        opts.client = ctypes.pointer(conn)
        handle = ctypes.c_void_p()
        check(need("kvh_cluster_connect")(ctypes.byref(opts),
                                          ctypes.byref(handle)))
        self._handle = handle

    # close(), with, _h() (NativeHandle)
    _FREE = "kvh_cluster_close"
    _WHAT = "cluster"

    # ---- Calls ----
    def create_namespace(self, name, geometry, capacity_bytes=0, codec="",
                         timeout=None, **spec_options):
        """Creates the namespace (if it does not exist) on every live member,
        and on members that join later; arguments as Client.create_namespace."""
        spec, keep = Client._namespace_spec(name, geometry, capacity_bytes,
                                            codec, **spec_options)
        try:
            check(self._lib.kvh_cluster_create_namespace(
                self._h(), ctypes.byref(spec), _timeout_ms(timeout)))
        finally:
            if keep is not None:
                keep.release()

    def owner(self, namespace, tokens, timeout=None) -> str:
        """The member owning the prefix ``tokens`` (up or not); "" without
        members or with less than a page of tokens."""
        out = ctypes.c_void_p()
        with _Tokens(tokens) as t:
            check(self._lib.kvh_cluster_owner(
                self._h(), _str(namespace, "namespace"), t.ptr, t.count,
                _timeout_ms(timeout), ctypes.byref(out)))
        return take_string(out)

    def match(self, namespace, tokens, lock=False, ttl=None,
              timeout=None) -> ClusterLease:
        """Longest cached prefix on the owner; a down owner is a miss."""
        ns = _str(namespace, "namespace")
        out = ctypes.c_void_p()
        r = _native._MatchResult()
        with _Tokens(tokens) as t:
            handles = (ctypes.c_uint64 * t.count)()
            check(self._lib.kvh_cluster_match(
                self._h(), ns, t.ptr, t.count, int(bool(lock)),
                _ms(ttl, "ttl"), handles, t.count, ctypes.byref(r),
                ctypes.byref(out), _timeout_ms(timeout)))
        return ClusterLease(self, namespace, take_string(out), r.lease_id,
                            tuple(handles[:r.num_pages]), r.matched_tokens,
                            r.page_bytes)

    def fetch_into(self, lease: ClusterLease, dst, timeout=None):
        """The pages of ``lease`` into ``dst``; returns how many pages."""
        if not isinstance(lease, ClusterLease):
            raise invalid("lease", "must be a ClusterLease from match")
        if not lease.handles:
            return 0
        src, _keep = _fetch_source(None, lease.handles)
        src.lease_id = lease.id
        r = _native._FetchResult()
        with Buffer(dst, "dst", writable=True) as b:
            check(self._lib.kvh_cluster_fetch(
                self._h(), _str(lease.namespace, "namespace"),
                lease.member.encode(), ctypes.byref(src), b.ptr, b.nbytes,
                ctypes.byref(r), _timeout_ms(timeout)))
        return r.num_pages

    def release(self, lease: ClusterLease, timeout=None):
        check(self._lib.kvh_cluster_release(
            self._h(), lease.member.encode(), _u64(lease.id, "lease"),
            _timeout_ms(timeout)))

    def lookup(self, namespace, tokens, dst, timeout=None) -> ClusterLookup:
        """Match and fetch in one call into ``dst``, which must hold every
        whole page of ``tokens``; a member failing in between is a miss."""
        ns = _str(namespace, "namespace")
        out = ctypes.c_void_p()
        r = _native._MatchResult()
        with _Tokens(tokens) as t, Buffer(dst, "dst", writable=True) as b:
            check(self._lib.kvh_cluster_lookup(
                self._h(), ns, t.ptr, t.count, b.ptr, b.nbytes,
                ctypes.byref(r), ctypes.byref(out), _timeout_ms(timeout)))
        return ClusterLookup(take_string(out), r.matched_tokens, r.page_bytes,
                             r.num_pages)

    def insert(self, namespace, tokens, pages, page_bytes=0,
               timeout=None) -> ClusterInsertResult:
        """Stores the pages of ``tokens`` (one buffer, back to back) on the
        prefix's owner; ``dropped`` when the owner was down."""
        ns = _str(namespace, "namespace")
        r = _native._InsertResult()
        dropped = ctypes.c_int()
        out = ctypes.c_void_p()
        with _Tokens(tokens) as t, Buffer(pages, "pages") as b:
            check(self._lib.kvh_cluster_insert(
                self._h(), ns, t.ptr, t.count, b.ptr, b.nbytes,
                _u64(page_bytes, "page_bytes"), ctypes.byref(r),
                ctypes.byref(dropped), ctypes.byref(out),
                _timeout_ms(timeout)))
        return ClusterInsertResult(
            take_string(out),
            InsertResult(r.already_present_tokens, r.pages_stored,
                         r.pages_evicted),
            bool(dropped.value))

    def status(self, with_stats=True):
        """(source description, [ClusterMemberStatus]) of every member."""
        out = ctypes.c_void_p()
        check(self._lib.kvh_cluster_status(self._h(), int(bool(with_stats)),
                                           ctypes.byref(out)))
        d = json.loads(take_string(out))
        members = [ClusterMemberStatus(
            address=m["address"], epoch=m["epoch"], up=m["up"],
            calls=m["calls"], failures=m["failures"],
            down_misses=m["down_misses"],
            dropped_inserts=m["dropped_inserts"],
            stats=Stats.from_dict(m["stats"]) if m["stats"] else None,
            stats_error=m.get("stats_error", "")) for m in d["members"]]
        return d["source"], members


def _comma_list(values, field):
    if isinstance(values, str) or not values:
        raise invalid(field, "must be a non-empty list of str")
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v or "," in v:
            raise invalid(f"{field}[{i}]", f"must be a non-empty str without "
                          f"commas, got {v!r}")
    return ",".join(values).encode()
