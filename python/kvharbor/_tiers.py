"""The Client calls of tiers, calibrations, compressed and transformed
fetches and same-host handles (docs/tiers.md, docs/calibration.md), as a
mixin of kvharbor.Client. Every call goes through libkvharbor_c; functions
newer than the loaded library raise UnimplementedError naming them."""

import ctypes
import json

from . import _native
from ._args import _enum, _fetch_source, _str, _timeout_ms, _u64
from ._native import Buffer, check, need, take_string
from .errors import invalid
from .types import (Calibration, CalibrationInfo, CompressedPage,
                    DeviceHandles, FetchTransform, HostFetchStats,
                    HostHandles, Tier, TransformedKv, _tier)


class TiersMixin:
    """Methods of kvharbor.Client; ``self._h()`` is the native handle."""

    # ---- Tiers ----
    def demote(self, namespace, tier, timeout=None) -> int:
        """Moves every unlocked page down to ``tier`` (Tier.HOST_COMPRESSED
        or Tier.DISK); returns how many pages moved."""
        ns = _str(namespace, "namespace")
        t = _enum(tier, Tier, "tier")
        moved = ctypes.c_uint64()
        check(need("kvh_demote")(self._h(), ns, t, ctypes.byref(moved),
                                 _timeout_ms(timeout)))
        return moved.value

    # ---- Calibrations ----
    def get_calibration(self, namespace, fingerprint=0,
                        timeout=None) -> Calibration:
        """The namespace's codec, calibration bytes and fingerprint: the
        active calibration (fingerprint 0), or any one it still has (pages
        encoded with an older one carry its fingerprint)."""
        ns = _str(namespace, "namespace")
        fp = _u64(fingerprint, "fingerprint")
        cal = _native._Calibration()
        if fp == 0:
            check(need("kvh_get_calibration")(self._h(), ns,
                                              _timeout_ms(timeout),
                                              ctypes.byref(cal)))
        else:
            check(need("kvh_get_calibration_fp")(self._h(), ns, fp,
                                                 _timeout_ms(timeout),
                                                 ctypes.byref(cal)))
        try:
            codec = ctypes.string_at(cal.codec).decode() if cal.codec else ""
            data = (ctypes.string_at(cal.bytes, cal.num_bytes) if cal.bytes
                    else b"")
            return Calibration(codec, data, cal.fingerprint)
        finally:
            self._lib.kvh_calibration_free(ctypes.byref(cal))

    def upload_calibration(self, namespace, calibration, pin=False,
                           timeout=None) -> int:
        """Makes ``calibration`` (the canonical bytes of the namespace's
        codec, any buffer; what get_calibration returns) the active one,
        pinned at once with ``pin``; returns its fingerprint."""
        ns = _str(namespace, "namespace")
        if isinstance(calibration, str):
            raise invalid("calibration", "must be bytes (a buffer), not str")
        fp = ctypes.c_uint64()
        with Buffer(calibration, "calibration") as b:
            check(need("kvh_upload_calibration")(
                self._h(), ns, b.ptr, b.nbytes, int(bool(pin)),
                ctypes.byref(fp), _timeout_ms(timeout)))
        return fp.value

    def list_calibrations(self, namespace, timeout=None):
        """The namespace's calibrations (CalibrationInfo), the active one
        first, then newest first."""
        ns = _str(namespace, "namespace")
        out = ctypes.c_void_p()
        check(need("kvh_list_calibrations")(self._h(), ns, _timeout_ms(timeout),
                                            ctypes.byref(out)))
        return [CalibrationInfo(**d) for d in json.loads(take_string(out))]

    def pin_calibration(self, namespace, fingerprint=0, pinned=True,
                        timeout=None):
        """Pins (or with pinned=False unpins) the active calibration; a
        pinned one is never replaced by online recalibration.
        ``fingerprint`` must be the active one's (0 = whichever is)."""
        ns = _str(namespace, "namespace")
        check(need("kvh_pin_calibration")(
            self._h(), ns, _u64(fingerprint, "fingerprint"),
            int(bool(pinned)), _timeout_ms(timeout)))

    # ---- Compressed and transformed fetches ----
    def fetch_compressed(self, namespace, lease=None, start_page=0,
                         page_count=0, handles=None, timeout=None):
        """The pages' codec buffers as the daemon stores them, undecoded
        (CompressedPage each; checksums verified): to keep them compressed
        or decode them elsewhere. decode_page makes a raw page of one."""
        ns = _str(namespace, "namespace")
        src, _keep = _fetch_source(lease, handles, start_page, page_count)
        pages = ctypes.POINTER(_native._CompressedPage)()
        n = ctypes.c_size_t()
        fn = need("kvh_fetch_compressed")
        check(fn(self._h(), ns, ctypes.byref(src), ctypes.byref(pages),
                 ctypes.byref(n), _timeout_ms(timeout)))
        try:
            return [CompressedPage(
                handle=p.handle, tier=_tier(p.tier),
                codec=(p.codec or b"").decode(),
                calibration_fingerprint=p.calibration_fingerprint,
                data=ctypes.string_at(p.data, p.size) if p.size else b"")
                for p in pages[:n.value]]
        finally:
            self._lib.kvh_compressed_pages_free(pages, n.value)

    def decode_page(self, namespace, page, dst=None, timeout=None):
        """Decodes one CompressedPage of ``namespace`` into raw page bytes:
        into ``dst`` (a writable buffer holding a page; returns it) or a new
        bytearray. The calibration is fetched once per client."""
        ns = _str(namespace, "namespace")
        if not isinstance(page, CompressedPage):
            raise invalid("page", f"must be a CompressedPage, got "
                          f"{type(page).__name__}")
        if dst is None:
            dst = bytearray(self.describe_namespace(namespace).stats.page_bytes)
        c = _native._CompressedPage()
        c.handle, c.tier = page.handle, int(page.tier)
        c.codec = page.codec.encode()
        c.calibration_fingerprint = page.calibration_fingerprint
        data = ctypes.create_string_buffer(page.data, len(page.data))
        c.data, c.size = ctypes.cast(data, ctypes.c_void_p), len(page.data)
        written = ctypes.c_uint64()
        with Buffer(dst, "dst", writable=True) as b:
            check(need("kvh_decode_page")(self._h(), ns, ctypes.byref(c),
                                          b.ptr, b.nbytes,
                                          ctypes.byref(written),
                                          _timeout_ms(timeout)))
        return dst

    def fetch_transformed(self, namespace, dst, lease=None, start_page=0,
                          page_count=0, handles=None,
                          transform=FetchTransform.KVCM,
                          timeout=None) -> TransformedKv:
        """The pages run through ``transform`` by the daemon as ONE sequence
        (FetchTransform.KVCM: LOSSY and LENGTH-CHANGING, the namespace's
        KVCM compressor merges tokens) into ``dst``: [2][layer][token]
        [kv_head][head_dim] of TransformedKv.output_tokens tokens. A
        destination of the pages' raw size always suffices."""
        ns = _str(namespace, "namespace")
        t = _enum(transform, FetchTransform, "transform")
        src, _keep = _fetch_source(lease, handles, start_page, page_count)
        r = _native._TransformResult()
        with Buffer(dst, "dst", writable=True) as b:
            check(need("kvh_fetch_transformed")(
                self._h(), ns, ctypes.byref(src), t, b.ptr, b.nbytes,
                ctypes.byref(r), _timeout_ms(timeout)))
        return TransformedKv(r.input_tokens, r.output_tokens, r.bytes_written)

    # ---- Same-host handles ----
    def host_handles(self, namespace, lease, timeout=None) -> HostHandles:
        """Where a lease's pages lie in the daemon's shared host arena (the
        raw GetHostHandles; a RAW fetch of a lease uses it by itself)."""
        return HostHandles.from_dict(self._handles_json(
            "kvh_get_host_handles", namespace, lease, timeout))

    def device_handles(self, namespace, lease, timeout=None) -> DeviceHandles:
        """The CUDA IPC handle of the daemon's GPU arena and where a lease's
        pages lie in it (the raw GetDeviceHandles)."""
        return DeviceHandles.from_dict(self._handles_json(
            "kvh_get_device_handles", namespace, lease, timeout))

    def _handles_json(self, fn, namespace, lease, timeout):
        ns = _str(namespace, "namespace")
        lease_id = _u64(getattr(lease, "id", lease), "lease")
        out = ctypes.c_void_p()
        check(need(fn)(self._h(), ns, lease_id, _timeout_ms(timeout),
                       ctypes.byref(out)))
        return json.loads(take_string(out))

    def host_fetch_stats(self) -> HostFetchStats:
        """What the same-host Fetch path of this client did so far."""
        s = _native._HostFetchStats()
        check(need("kvh_get_host_fetch_stats")(self._h(), ctypes.byref(s)))
        return HostFetchStats(s.shm_fetches, s.shm_pages, s.fallbacks,
                              s.checksum_mismatches, s.connects)
