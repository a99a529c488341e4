"""Fetch into / insert from engine KV-cache layouts (kvharbor.PagedKvLayout)
against a real kvharbord, with torch CPU tensors in vLLM's, FlashInfer's,
SGLang's (layer-first and page-first) and HF's dense layouts: every byte
lands where the layout says and nothing else changes, layer ranges
included; an insert from a layout stores the blocks' rows; bad input raises
InvalidArgumentError naming the field and writes nothing.

GpuLayoutTest runs only where torch sees a GPU, the library was built with
CUDA and KVHARBORD has the GPU tier (the GPU machine; scripts/gpu_checks.sh
runs it): CUDA tensors through device_ipc, compressed_local, raw_remote,
each equal to the CPU path's result; inserts from CUDA layouts through
device_ipc (DeviceInsert) and pinned, fetched back bit-identical, and the
fallback without a device tier. (The C++ side: tests/cuda/hit_path_e2e.cc.)"""

import os
import tempfile
import unittest

try:
    import torch
except ImportError:  # the package does not need torch; these tests do
    torch = None

import kvharbor
from daemon import Daemon

L, H, D, P = 4, 2, 8, 4  # layers, kv heads, head_dim, page size (tokens)
SENTINEL = 0x5A5A


def _sentinel(*shape, dtype=None):
    t = torch.empty(*shape, dtype=dtype or torch.bfloat16)
    t.view(torch.int16).fill_(SENTINEL)
    return t


def _bits(t):
    return t.view(torch.int16)


@unittest.skipIf(torch is None, "torch is not installed")
class LayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.c = kvharbor.Client(cls.daemon.address)
        cls.geom = kvharbor.Geometry(L, H, D, P)
        cls.c.create_namespace("layout", cls.geom)
        cls.tokens = list(range(100, 100 + 6 * P))
        gen = torch.Generator().manual_seed(1)
        cls.raw = torch.randint(-2**15, 2**15, (6 * cls.geom.page_bytes // 2,),
                                dtype=torch.int16, generator=gen)
        cls.c.insert("layout", cls.tokens, cls.raw.numpy().tobytes())
        # Page i as [2, L, P, H, D] (the namespace's default page layout).
        cls.pages = cls.raw.view(6, 2, L, P, H, D)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def fetch(self, layout, blocks, start_page=1, **kw):
        with self.c.match("layout", self.tokens, lock=True) as lease:
            return lease.fetch_to_layout(layout, blocks, start_page=start_page,
                                         **kw)

    def check_result(self, r, n, layers=L):
        self.assertEqual(r.path, "cpu")
        self.assertEqual(r.pages, n)
        # A layout of some layers fetches only those (a layer-range fetch).
        self.assertEqual(r.bytes_moved, n * self.geom.page_bytes * layers // L)
        self.assertIn("scatter", r.stages)

    def test_vllm(self):
        for begin, n in ((0, L), (1, 2)):
            caches = [_sentinel(2, 8, P, H, D) for _ in range(n)]
            want = [_bits(c).clone() for c in caches]
            layout = kvharbor.PagedKvLayout.from_vllm(caches, layer_begin=begin)
            blocks = [7, 0, 3, 5]
            r = self.fetch(layout, blocks)
            self.check_result(r, 4, n)
            for i, b in enumerate(blocks):
                for j in range(n):
                    want[j][0, b] = self.pages[1 + i, 0, begin + j]
                    want[j][1, b] = self.pages[1 + i, 1, begin + j]
            for j in range(n):
                self.assertTrue(torch.equal(_bits(caches[j]), want[j]), (begin, j))

    def test_flashinfer(self):
        caches = [_sentinel(8, 2, P, H, D) for _ in range(L)]
        want = [_bits(c).clone() for c in caches]
        blocks = torch.tensor([2, 6, 1, 4])  # block ids may be a tensor
        self.fetch(kvharbor.PagedKvLayout.from_vllm_flashinfer(caches), blocks)
        for i, b in enumerate(blocks.tolist()):
            for j in range(L):
                want[j][b, 0] = self.pages[1 + i, 0, j]
                want[j][b, 1] = self.pages[1 + i, 1, j]
        for j in range(L):
            self.assertTrue(torch.equal(_bits(caches[j]), want[j]))

    def test_sglang_layer_first(self):
        ks = [_sentinel(9 * P, H, D) for _ in range(L)]  # a spare page
        vs = [_sentinel(9 * P, H, D) for _ in range(L)]
        want_k = [_bits(t).clone() for t in ks]
        want_v = [_bits(t).clone() for t in vs]
        layout = kvharbor.PagedKvLayout.from_sglang(ks, vs, P)
        self.assertEqual(layout.num_blocks, 9)
        blocks = [8, 2, 4, 0]
        self.fetch(layout, blocks)
        for i, b in enumerate(blocks):
            for j in range(L):
                want_k[j][b * P:(b + 1) * P] = self.pages[1 + i, 0, j]
                want_v[j][b * P:(b + 1) * P] = self.pages[1 + i, 1, j]
        for j in range(L):
            self.assertTrue(torch.equal(_bits(ks[j]), want_k[j]))
            self.assertTrue(torch.equal(_bits(vs[j]), want_v[j]))

    def test_sglang_page_first(self):
        kv = _sentinel(2, 8 * P, L, H, D)
        want = _bits(kv).clone()
        layout = kvharbor.PagedKvLayout.from_sglang_page_first(kv, P, L)
        blocks = [1, 7, 3, 6]
        self.fetch(layout, blocks)
        for i, b in enumerate(blocks):
            for j in range(L):
                want[0, b * P:(b + 1) * P, j] = self.pages[1 + i, 0, j]
                want[1, b * P:(b + 1) * P, j] = self.pages[1 + i, 1, j]
        self.assertTrue(torch.equal(_bits(kv), want))

    def test_dense(self):
        keys = [_sentinel(1, H, 6 * P, D) for _ in range(L)]
        values = [_sentinel(1, H, 6 * P, D) for _ in range(L)]
        want_k = [_bits(t).clone() for t in keys]
        want_v = [_bits(t).clone() for t in values]
        layout = kvharbor.PagedKvLayout.from_dense(keys, values, P)
        # The prompt order: page i of the prefix into block i.
        r = self.fetch(layout, list(range(6)), start_page=0,
                       format=kvharbor.FetchFormat.COMPRESSED)
        self.check_result(r, 6)
        for i in range(6):
            for j in range(L):
                want_k[j][0, :, i * P:(i + 1) * P] = \
                    self.pages[i, 0, j].transpose(0, 1)
                want_v[j][0, :, i * P:(i + 1) * P] = \
                    self.pages[i, 1, j].transpose(0, 1)
        for j in range(L):
            self.assertTrue(torch.equal(_bits(keys[j]), want_k[j]))
            self.assertTrue(torch.equal(_bits(values[j]), want_v[j]))

    def test_insert_from_layout(self):
        gen = torch.Generator().manual_seed(7)
        caches = [torch.randint(-2**15, 2**15, (2, 8, P, H, D), dtype=torch.int16,
                                generator=gen).view(torch.bfloat16)
                  for _ in range(L)]
        layout = kvharbor.PagedKvLayout.from_vllm(caches)
        blocks = [5, 2, 7]
        tokens = list(range(5000, 5000 + 3 * P))
        r = self.c.insert_from_layout("layout", tokens, layout, blocks)
        self.assertIsInstance(r, kvharbor.InsertResult)
        self.assertEqual(r.pages_stored, 3)
        self.assertEqual(r.path, "cpu")
        self.assertEqual(r.transfer.pages, 3)
        with self.c.match("layout", tokens, lock=True) as lease:
            got = torch.frombuffer(lease.fetch(), dtype=torch.int16)
        got = got.view(3, 2, L, P, H, D)
        for i, b in enumerate(blocks):
            for j in range(L):
                self.assertTrue(torch.equal(got[i, 0, j], _bits(caches[j])[0, b]))
                self.assertTrue(torch.equal(got[i, 1, j], _bits(caches[j])[1, b]))

    def test_insert_options(self):
        """device_ipc / ttl of insert_from_layout (ABI 6): a host layout is
        stored on the CPU whatever the client's device_ipc, device_ipc=False
        keeps it there; device_ipc=True needs a GPU layout; bad values are
        refused naming the argument, nothing stored."""
        caches = [_sentinel(2, 8, P, H, D) for _ in range(L)]
        layout = kvharbor.PagedKvLayout.from_vllm(caches)
        tokens = list(range(7000, 7000 + 2 * P))
        r = self.c.insert_from_layout("layout", tokens, layout, [1, 3],
                                      device_ipc=False, ttl=5)
        self.assertEqual((r.pages_stored, r.path), (2, "cpu"))
        self.assertEqual(tuple(r.transfer.fallbacks), ())
        fresh = list(range(7100, 7100 + P))
        for kw, field, err in (
                ({"device_ipc": True}, "device_ipc",
                 kvharbor.InvalidArgumentError),
                ({"device_ipc": "on"}, "device_ipc", kvharbor.InvalidArgument),
                ({"ttl": -1}, "ttl", kvharbor.InvalidArgument)):
            with self.subTest(kw=kw):
                with self.assertRaises(err) as e:
                    self.c.insert_from_layout("layout", fresh, layout, [0], **kw)
                self.assertIn(field, str(e.exception))
        self.assertEqual(self.c.match("layout", fresh).matched_tokens, 0)
        # A GPU layout here (no GPU, or a library without CUDA): refused
        # naming the layout before any path is chosen, forced or not.
        gpu = kvharbor.PagedKvLayout([1 << 40] * L, [1 << 41] * L, 8,
                                     P * H * D, H * D, D, kvharbor.DType.BF16,
                                     device=0)
        for ipc in (None, True, False):
            with self.assertRaises((kvharbor.InvalidArgumentError,
                                    kvharbor.UnimplementedError)) as e:
                self.c.insert_from_layout("layout", fresh, gpu, [0],
                                          device_ipc=ipc)
            self.assertTrue("layout.device" in str(e.exception) or
                            "layout.k[0]" in str(e.exception), str(e.exception))

    def test_c_abi_6_guards(self):
        """What the Python layer never sends, the C ABI (6) still refuses,
        naming the field; the ABI 5 size of kvh_connect_options still
        connects."""
        import ctypes
        lib = kvharbor._native.library()
        self.assertGreaterEqual(lib.kvh_abi_version(), 6)
        handle = ctypes.c_void_p()
        opts = kvharbor._native._ConnectOptions()
        addr = self.daemon.address.encode()
        for size, gemm, ok in (
                (kvharbor._native.CONNECT_OPTIONS_V5_SIZE, 9, True),
                (ctypes.sizeof(opts), 9, False),
                (ctypes.sizeof(opts) + 4, 0, False),
                (ctypes.sizeof(opts), 3, True)):
            opts.struct_size, opts.gpu_decode_gemm = size, gemm
            rc = lib.kvh_connect_with(addr, ctypes.byref(opts),
                                      ctypes.byref(handle))
            if ok:
                self.assertEqual(rc, 0, lib.kvh_last_error_message())
                lib.kvh_close(handle)
            else:
                self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
                self.assertIn(b"options.gpu_decode_gemm" if gemm else
                              b"options.struct_size",
                              lib.kvh_last_error_message())
        caches = [_sentinel(2, 8, P, H, D) for _ in range(L)]
        c_layout, keep = kvharbor.PagedKvLayout.from_vllm(caches)._as_c()
        toks = (ctypes.c_int32 * P)(*range(7200, 7200 + P))
        ids = (ctypes.c_int64 * 1)(0)
        io = kvharbor._native._LayoutInsertOptions()
        for size, mode, field in ((8, 0, b"options.struct_size"),
                                  (ctypes.sizeof(io), 7, b"options.device_ipc")):
            io.struct_size, io.device_ipc = size, mode
            rc = lib.kvh_insert_from_layout_with(
                self.c._h(), b"layout", toks, P, ctypes.byref(c_layout), ids,
                1, ctypes.byref(io), None, 0, None)
            self.assertEqual(rc, kvharbor.StatusCode.INVALID_ARGUMENT)
            self.assertIn(field, lib.kvh_last_error_message())
        del keep
        self.assertEqual(self.c.match("layout", list(toks)).matched_tokens, 0)

    def test_gpu_options(self):
        """stage_cold and gpu_decode_gemm (ABI 6) reach the library; bad
        values are refused naming the option."""
        for kw in ({"stage_cold": True}, {"gpu_decode_gemm": "bf16"},
                   {"gpu_decode_gemm": "fp32", "stage_cold": True}):
            with kvharbor.Client(self.daemon.address, **kw) as c:
                self.assertEqual(c.match("layout", self.tokens).matched_tokens,
                                 len(self.tokens))
        for bad in ({"stage_cold": 1}, {"gpu_decode_gemm": "fp16"}):
            with self.assertRaises(kvharbor.InvalidArgument) as e:
                kvharbor.Client(self.daemon.address, **bad)
            self.assertIn(next(iter(bad)), str(e.exception))

    def test_path_options(self):
        with kvharbor.Client(self.daemon.address, host_fetch="off",
                             device_ipc=False, gpu_decode=False) as c:
            caches = [_sentinel(2, 8, P, H, D) for _ in range(L)]
            with c.match("layout", self.tokens, lock=True) as lease:
                r = lease.fetch_to_layout(
                    kvharbor.PagedKvLayout.from_vllm(caches), [0, 1])
            self.assertEqual(r.path, "cpu")
            self.assertTrue(torch.equal(_bits(caches[0])[0, 1],
                                        self.pages[1, 0, 0]))
        for bad in ({"host_fetch": "sometimes"}, {"device_ipc": 2},
                    {"gpu_decode": None}):
            with self.assertRaises(kvharbor.InvalidArgument) as e:
                kvharbor.Client(self.daemon.address, **bad)
            self.assertIn(next(iter(bad)), str(e.exception))

    def test_bad_input(self):
        caches = [_sentinel(2, 8, P, H, D) for _ in range(L)]
        layout = kvharbor.PagedKvLayout.from_vllm(caches)

        def expect(field, fn):
            with self.assertRaises(kvharbor.InvalidArgumentError) as e:
                fn()
            self.assertIn(field, str(e.exception))
            for c in caches:
                self.assertTrue(bool((_bits(c) == SENTINEL).all()), field)

        expect("block_ids[1]", lambda: self.fetch(layout, [0, 8]))
        expect("block_ids[2]", lambda: self.fetch(layout, [0, 3, 3]))
        expect("block_ids", lambda: self.fetch(layout, []))
        fp16 = [_sentinel(2, 8, P, H, D, dtype=torch.float16) for _ in range(L)]
        expect("layout.dtype", lambda: self.fetch(
            kvharbor.PagedKvLayout.from_vllm(fp16), [0]))
        heads = [_sentinel(2, 8, P, 2 * H, D) for _ in range(L)]
        expect("layout.num_kv_heads", lambda: self.fetch(
            kvharbor.PagedKvLayout.from_vllm(heads), [0]))
        expect("layout.num_layers", lambda: self.fetch(
            kvharbor.PagedKvLayout.from_vllm(caches + caches[:1]), [0]))
        # Layer ranges outside the namespace's L layers (a layer-wise load
        # of a wrong layer), and a negative first layer.
        expect("layout.num_layers", lambda: self.fetch(
            kvharbor.PagedKvLayout.from_vllm(caches[:2], layer_begin=L - 1),
            [0]))
        expect("layout.layer_begin", lambda: self.fetch(
            kvharbor.PagedKvLayout.from_vllm(caches[:1], layer_begin=L), [0]))
        expect("layer_begin", lambda: kvharbor.PagedKvLayout.from_vllm(
            caches[:1], layer_begin=-1))
        expect("kv_caches[0]", lambda: kvharbor.PagedKvLayout.from_vllm(
            [_sentinel(8, P, H, D)]))
        expect("kv_caches[1]", lambda: kvharbor.PagedKvLayout.from_vllm(
            [caches[0], fp16[1]]))
        expect("layout.k[0]", lambda: kvharbor.PagedKvLayout(
            [caches[0]], [caches[0]], 8, P * H * D, H * D, D,
            kvharbor.DType.BF16, device=0))
        # A layout too short for its strides: the library refuses it.
        short = kvharbor.PagedKvLayout.from_vllm(caches)
        short.v_bytes = [b - 2 for b in short.v_bytes]
        expect("layout.v[0]", lambda: self.fetch(short, [0]))
        with self.c.match("layout", self.tokens, lock=False) as unlocked:
            expect("lease", lambda: unlocked.fetch_to_layout(layout, [0]))
        expect("layout.num_layers", lambda: self.c.insert_from_layout(
            "layout", self.tokens[:P],
            kvharbor.PagedKvLayout.from_vllm(caches[1:], layer_begin=1), [0]))
        # GPU memory: without CUDA, UNIMPLEMENTED naming the build; with it
        # (and no GPU here) the device is refused, never dereferenced.
        gpu = kvharbor.PagedKvLayout([1 << 40] * L, [1 << 41] * L, 8,
                                     P * H * D, H * D, D, kvharbor.DType.BF16,
                                     device=0)
        with self.c.match("layout", self.tokens, lock=True) as lease:
            with self.assertRaises((kvharbor.InvalidArgumentError,
                                    kvharbor.UnimplementedError)) as e:
                lease.fetch_to_layout(gpu, [0])
        self.assertTrue("layout.device" in str(e.exception) or
                        "layout.k[0]" in str(e.exception), str(e.exception))


def _gpu_ready():
    return (torch is not None and torch.cuda.is_available()
            and kvharbor.Client.gpu_transfers()
            and os.environ.get("KVHARBOR_GPU_TIER") == "1")


@unittest.skipUnless(_gpu_ready(), "needs a GPU, a CUDA libkvharbor_c and "
                     "KVHARBOR_GPU_TIER=1 (a kvharbord with the GPU tier)")
class GpuLayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        config = os.path.join(cls.dir.name, "gpu.yaml")
        with open(config, "w") as f:
            f.write("store:\n  device_pool_bytes: 64MiB\n  allow_ipc: true\n")
        cls.daemon = Daemon("--config=" + config)
        cls.c = kvharbor.Client(cls.daemon.address)
        cls.geom = kvharbor.Geometry(L, H, 64, 16)
        cls.c.create_namespace("gpu", cls.geom, capacity_bytes=4 << 20,
                               host_compressed_bytes=8 << 20)
        cls.tokens = list(range(1, 1 + 6 * 16))
        gen = torch.Generator().manual_seed(3)
        raw = torch.randint(-2**15, 2**15, (6 * cls.geom.page_bytes // 2,),
                            dtype=torch.int16, generator=gen)
        cls.c.insert("gpu", cls.tokens, raw.numpy().tobytes())

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()
        cls.dir.cleanup()

    def fetch_both(self, client, blocks, ns="gpu", **kw):
        """The pages into a CUDA vLLM cache and a CPU one; both caches."""
        shape = (2, 8, 16, H, 64)
        cuda = [_sentinel(*shape).cuda() for _ in range(L)]
        cpu = [_sentinel(*shape) for _ in range(L)]
        with client.match(ns, self.tokens, lock=True) as lease:
            r = lease.fetch_to_layout(kvharbor.PagedKvLayout.from_vllm(cuda),
                                      blocks, **kw)
            lease.fetch_to_layout(kvharbor.PagedKvLayout.from_vllm(cpu), blocks)
        for g, h in zip(cuda, cpu):
            self.assertTrue(torch.equal(_bits(g.cpu()), _bits(h)), r.path)
        return r

    def test_paths(self):
        blocks = [7, 1, 4, 0, 2, 6]
        r = self.fetch_both(self.c, blocks)
        self.assertEqual(r.path, "device_ipc", r.fallbacks)
        r = self.fetch_both(self.c, blocks, format=kvharbor.FetchFormat.RAW)
        self.assertEqual(r.path, "raw_remote")
        with kvharbor.Client(self.daemon.address, host_fetch="off",
                             device_ipc=False) as remote:
            self.assertEqual(self.fetch_both(remote, blocks).path, "raw_remote")

    def insert_cuda(self, client, ns, first_token, **kw):
        """Three pages from blocks 5, 2, 7 of a CUDA vLLM cache, fetched
        back into a CUDA cache (bit-identical K and V asserted); the
        insert's result."""
        gen = torch.Generator().manual_seed(first_token)
        cache = [torch.randint(-2**15, 2**15, (2, 8, 16, H, 64),
                               dtype=torch.int16, generator=gen)
                 .view(torch.bfloat16).cuda() for _ in range(L)]
        tokens = list(range(first_token, first_token + 3 * 16))
        blocks = [5, 2, 7]
        r = client.insert_from_layout(
            ns, tokens, kvharbor.PagedKvLayout.from_vllm(cache), blocks, **kw)
        self.assertEqual(r.pages_stored, 3)
        back = [_sentinel(2, 8, 16, H, 64).cuda() for _ in range(L)]
        with client.match(ns, tokens, lock=True) as lease:
            lease.fetch_to_layout(kvharbor.PagedKvLayout.from_vllm(back),
                                  blocks)
        for got, want in zip(back, cache):
            self.assertTrue(torch.equal(_bits(got)[:, blocks],
                                        _bits(want)[:, blocks]), r.path)
        return r

    def test_insert_from_cuda_layout(self):
        # The daemon's device tier by CUDA IPC (one gather into its slots).
        r = self.insert_cuda(self.c, "gpu", 9000)
        self.assertEqual(r.path, "device_ipc", r.transfer.fallbacks)
        self.assertEqual(r.transfer.bytes_moved, 3 * self.geom.page_bytes)
        self.assertIn("gather", r.transfer.stages)
        # Turned off per call or per client: pinned staging + Insert.
        r = self.insert_cuda(self.c, "gpu", 9100, device_ipc=False)
        self.assertEqual((r.path, tuple(r.transfer.fallbacks)), ("pinned", ()))
        with kvharbor.Client(self.daemon.address, device_ipc=False) as c:
            self.assertEqual(self.insert_cuda(c, "gpu", 9200).path, "pinned")

    def test_insert_without_device_tier(self):
        # A daemon with host pools only: the insert falls back and says why;
        # forced, FailedPreconditionError naming device_ipc.
        host = Daemon()
        try:
            with kvharbor.Client(host.address) as c:
                c.create_namespace("gpu", self.geom, capacity_bytes=4 << 20)
                r = self.insert_cuda(c, "gpu", 9300)
                self.assertEqual(r.path, "pinned")
                self.assertTrue(r.transfer.fallbacks[0].startswith(
                    "device_ipc: FAILED_PRECONDITION"), r.transfer.fallbacks)
                with self.assertRaises(kvharbor.FailedPreconditionError) as e:
                    self.insert_cuda(c, "gpu", 9400, device_ipc=True)
                self.assertIn("device_ipc", str(e.exception))
        finally:
            host.stop()

    def test_wrong_device_memory(self):
        cpu = [_sentinel(2, 8, 16, H, 64) for _ in range(L)]
        with self.assertRaises(kvharbor.InvalidArgument) as e:
            kvharbor.PagedKvLayout.from_vllm([cpu[0], cpu[1].cuda()])
        self.assertIn("kv_caches[1]", str(e.exception))
        lying = kvharbor.PagedKvLayout(
            [t.data_ptr() for t in cpu], [t.data_ptr() + 2 for t in cpu], 8,
            16 * H * 64, H * 64, 64, kvharbor.DType.BF16, device=0)
        with self.c.match("gpu", self.tokens, lock=True) as lease:
            with self.assertRaises(kvharbor.InvalidArgument) as e:
                lease.fetch_to_layout(lying, [0])
        self.assertIn("layout.k[0]", str(e.exception))

    def test_cold_pages_compressed_local(self):
        self.c.create_namespace("cold", self.geom, capacity_bytes=4 << 20,
                                host_compressed_bytes=8 << 20)
        with self.c.match("gpu", self.tokens, lock=True) as lease:
            self.c.insert("cold", self.tokens, lease.fetch())
        self.assertGreater(self.c.demote("cold", kvharbor.Tier.HOST_COMPRESSED), 0)
        blocks = [3, 5, 0, 1, 2, 4]
        r = self.fetch_both(self.c, blocks, ns="cold")
        self.assertEqual(r.path, "compressed_local", r.fallbacks)
        self.assertIn("decode", r.stages)
        with kvharbor.Client(self.daemon.address, gpu_decode=False) as c:
            self.assertEqual(self.fetch_both(c, blocks, ns="cold").path,
                             "raw_remote")


if __name__ == "__main__":
    unittest.main()
