"""torch tensors where the client takes a buffer, against a real kvharbord:
CPU tensors without a copy, CUDA tensors staged through pinned host memory
(when this torch has a GPU: scripts/gpu_checks.sh), meta and
non-contiguous tensors refused naming the argument. Needs torch
(python3-torch); skipped without it."""

import unittest

import kvharbor
from daemon import Daemon
from test_client import GEOM, NS_BYTES, PB, tokens

try:
    import torch
except ImportError:
    torch = None


@unittest.skipIf(torch is None, "needs torch (python3-torch)")
class TorchBufferTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = kvharbor.Client(cls.daemon.address, timeout=10)
        cls.client.create_namespace("t", GEOM, capacity_bytes=NS_BYTES)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.stop()

    def round_trip(self, device, seed):
        c = self.client
        toks = tokens(3 * GEOM.page_size, seed)
        src = torch.randint(0, 255, (3 * PB,), dtype=torch.uint8).to(device)
        self.assertEqual(c.insert("t", toks, src).pages_stored, 3)
        dst = torch.zeros(3, PB, dtype=torch.uint8, device=device)
        with c.match("t", toks, lock=True) as lease:
            lease.fetch_into(dst)
            pages = [torch.zeros(PB, dtype=torch.uint8, device=device)
                     for _ in range(3)]
            lease.fetch_into(pages)
        self.assertTrue(torch.equal(dst.flatten(), src))
        self.assertTrue(torch.equal(torch.cat(pages), src))

    def test_cpu(self):
        self.round_trip("cpu", 1)

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(),
                         "needs a CUDA torch (the GPU machine)")
    def test_cuda(self):
        self.round_trip("cuda", 2)

    def test_refused(self):
        toks = tokens(GEOM.page_size, 3)
        cases = [
            (lambda: self.client.insert("t", toks, torch.zeros(PB, device="meta")),
             "pages"),
            (lambda: self.client.insert(
                "t", toks, torch.zeros(2 * PB, dtype=torch.uint8)[::2]), "pages"),
            (lambda: self.client.fetch_into(
                "t", torch.zeros(PB, dtype=torch.uint8, device="meta"),
                handles=[1]), "dst"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
                    fn()
                self.assertIn(field, cm.exception.message)


if __name__ == "__main__":
    unittest.main()
