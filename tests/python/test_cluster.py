"""kvharbor.ClusterClient against two real kvharbord: the namespace on every
member, prefixes routed to their owner (the same member for every
continuation), match/fetch/lookup/insert, member status with the daemons'
stats, a stopped member turning its prefixes into misses and dropped
inserts (never errors), and bad input naming the field."""

import os
import unittest

import kvharbor
from daemon import Daemon
from test_client import GEOM, NS_BYTES, PB, tokens

P = GEOM.page_size


class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.daemons = [Daemon(), Daemon()]
        self.addCleanup(lambda: [d.stop() for d in self.daemons])
        self.members = [d.address for d in self.daemons]
        self.cluster = kvharbor.ClusterClient(
            members=self.members, member_timeout=2, retry_down_after=60,
            timeout=10)
        self.addCleanup(self.cluster.close)
        self.cluster.create_namespace("clu", GEOM, capacity_bytes=NS_BYTES)

    def test_routing_and_calls(self):
        c = self.cluster
        for addr in self.members:  # created on every member
            with kvharbor.Client(addr) as direct:
                self.assertEqual(direct.describe_namespace("clu").geometry, GEOM)
        owners = {}
        for seed in range(12):
            toks = tokens(3 * P, seed)
            owner = c.owner("clu", toks)
            self.assertIn(owner, self.members)
            # Continuations of a prefix go to the same member.
            self.assertEqual(c.owner("clu", toks + tokens(P, 99)), owner)
            owners[seed] = owner
            data = os.urandom(3 * PB)
            ins = c.insert("clu", toks, data)
            self.assertEqual((ins.member, ins.dropped, ins.result.pages_stored),
                             (owner, False, 3))
            with c.match("clu", toks + [1], lock=True, ttl=5) as lease:
                self.assertEqual((lease.member, lease.matched_tokens,
                                  lease.num_pages), (owner, 3 * P, 3))
                self.assertTrue(lease.locked)
                dst = bytearray(3 * PB)
                self.assertEqual(lease.fetch_into(dst), 3)
                self.assertEqual(dst, data)
            plain = c.match("clu", toks)  # by handle, no lease
            dst = bytearray(3 * PB)
            self.assertEqual(c.fetch_into(plain, dst), 3)
            self.assertEqual(dst, data)
            dst = bytearray(4 * PB)
            got = c.lookup("clu", toks + tokens(P, 7), dst)
            self.assertEqual((got.member, got.matched_tokens, got.num_pages,
                              got.page_bytes), (owner, 3 * P, 3, PB))
            self.assertEqual(dst[:3 * PB], data)
        self.assertEqual(set(owners.values()), set(self.members))  # both used
        source, members = c.status()
        self.assertIn("static", source)
        self.assertEqual(sorted(m.address for m in members), sorted(self.members))
        total = 0
        for m in members:
            self.assertTrue(m.up)
            self.assertGreater(m.calls, 0)
            total += m.stats.namespace("clu").cached_pages
        self.assertEqual(total, 3 * len(owners))
        _, quick = c.status(with_stats=False)
        self.assertTrue(all(m.stats is None for m in quick))

    def test_down_member_is_a_miss(self):
        c = self.cluster
        seeds = {c.owner("clu", tokens(2 * P, s)): s for s in range(20)}
        self.assertEqual(len(seeds), 2)
        down = self.members[1]
        for s in seeds.values():
            c.insert("clu", tokens(2 * P, s), os.urandom(2 * PB))
        self.daemons[1].stop()
        lost = tokens(2 * P, seeds[down])
        lease = c.match("clu", lost)
        self.assertEqual((lease.member, lease.matched_tokens), ("", 0))
        ins = c.insert("clu", lost, os.urandom(2 * PB))
        self.assertTrue(ins.dropped)
        got = c.lookup("clu", lost, bytearray(2 * PB))
        self.assertEqual(got.matched_tokens, 0)
        alive = tokens(2 * P, seeds[self.members[0]])
        self.assertEqual(c.match("clu", alive).matched_tokens, 2 * P)
        status = {m.address: m for m in c.status()[1]}
        self.assertFalse(status[down].up)
        self.assertIsNone(status[down].stats)
        self.assertGreater(status[down].dropped_inserts, 0)

    def test_bad_input_names_the_field(self):
        c = self.cluster
        c.insert("clu", tokens(2 * P, 1), os.urandom(2 * PB))
        cases = [
            (lambda: kvharbor.ClusterClient(), "members"),
            (lambda: kvharbor.ClusterClient(members=self.members, dns="x:1"),
             "members"),
            (lambda: kvharbor.ClusterClient(members=["nohostport"]), "members"),
            (lambda: kvharbor.ClusterClient(members=[]), "members"),
            (lambda: kvharbor.ClusterClient(members="a:1"), "members"),
            (lambda: kvharbor.ClusterClient(members=["a:1,b:2"]), "members[0]"),
            (lambda: kvharbor.ClusterClient(etcd=["http://127.0.0.1:1"],
                                            etcd_prefix=5), "etcd_prefix"),
            (lambda: kvharbor.ClusterClient(members=self.members,
                                            member_timeout=-1), "member_timeout"),
            (lambda: kvharbor.ClusterClient(members=self.members, tlz=True),
             "tlz"),
            (lambda: c.match("clu", []), "tokens"),
            (lambda: c.match("", tokens(P, 1)), "namespace"),
            (lambda: c.insert("clu", tokens(P, 1), b"x" * 3), "pages"),
            (lambda: c.insert("clu", tokens(P, 1), os.urandom(PB), page_bytes=-1),
             "page_bytes"),
            (lambda: c.fetch_into("lease", bytearray(PB)), "lease"),
            (lambda: c.lookup("clu", tokens(2 * P, 1), bytearray(PB)),
             "dst_capacity"),
            (lambda: c.create_namespace("clu2", "geometry"), "geometry"),
        ]
        for fn, field in cases:
            with self.subTest(field=field):
                with self.assertRaises((kvharbor.InvalidArgumentError,
                                        kvharbor.OutOfRangeError)) as cm:
                    fn()
                self.assertIn(field, cm.exception.message)
        with self.assertRaises(kvharbor.NotFoundError):
            c.match("no_such_ns", tokens(P, 1))


if __name__ == "__main__":
    unittest.main()
