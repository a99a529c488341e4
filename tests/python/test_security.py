"""kvharbor.Client against a kvharbord with TLS, mutual TLS and bearer tokens:
the security options of Client (libkvharbor_c ABI 3) reach the daemon, roles
and authentication failures raise their own error classes, and a bad token
argument never appears in an error. Certificates are made at test time with
the openssl CLI (installed by scripts/install_deps.sh)."""

import os
import shutil
import subprocess
import tempfile
import unittest

import kvharbor
from daemon import Daemon

GEOM = kvharbor.Geometry(num_layers=1, num_kv_heads=1, head_dim=16,
                         page_size=4, dtype=kvharbor.DType.FP16)
PB = GEOM.page_bytes
ADMIN = "admin-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"

_PKI = r"""set -e
cd "$1"
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -days 2 -subj "/CN=$1" -keyout "$1.key" -out "$1.crt"
}
cert() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.csr"
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" \
    -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt"
}
ca ca
cert server ca "IP:127.0.0.1,DNS:kvharbor.test" serverAuth
cert client ca "DNS:client.test" clientAuth
"""


@unittest.skipIf(shutil.which("openssl") is None, "openssl is not installed")
class SecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = cls.dir.name
        subprocess.run(["sh", "-c", _PKI, "pki", d], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tokens = os.path.join(d, "tokens.yaml")
        with open(tokens, "w") as f:
            f.write(f"tokens:\n"
                    f"  - token: \"{ADMIN}\"\n    tenant: team-a\n"
                    f"    role: admin\n"
                    f"  - token: \"{READER}\"\n    tenant: team-a\n"
                    f"    role: read\n")
        cls.ca = os.path.join(d, "ca.crt")
        cls.cert = os.path.join(d, "client.crt")
        cls.key = os.path.join(d, "client.key")
        server = [f"--tls_cert={os.path.join(d, 'server.crt')}",
                  f"--tls_key={os.path.join(d, 'server.key')}"]
        cls.daemon = Daemon(*server, f"--tokens_file={tokens}")
        cls.mtls = Daemon(*server, f"--tls_client_ca={cls.ca}",
                          "--tls_require_client_cert")

    @classmethod
    def tearDownClass(cls):
        codes = [cls.daemon.stop(), cls.mtls.stop()]
        cls.dir.cleanup()
        if codes != [0, 0]:
            raise AssertionError(f"kvharbord exited {codes}")

    def client(self, daemon, **kw):
        c = kvharbor.Client(daemon.address, timeout=10, **kw)
        self.addCleanup(c.close)
        return c

    def test_tls_and_token_round_trip(self):
        admin = self.client(self.daemon, tls_ca_file=self.ca, token=ADMIN)
        admin.create_namespace("sec_ns", GEOM, capacity_bytes=1 << 20)
        self.addCleanup(admin.delete_namespace, "sec_ns", True)
        data = os.urandom(2 * PB)
        toks = list(range(1, 9))
        self.assertEqual(admin.insert("sec_ns", toks, data).pages_stored, 2)
        reader = self.client(self.daemon, tls_ca_file=self.ca, token=READER)
        self.assertEqual(reader.match("sec_ns", toks).fetch(), data)
        with self.assertRaises(kvharbor.PermissionDeniedError) as cm:
            reader.insert("sec_ns", list(range(20, 24)), data[:PB])
        self.assertIn("role", cm.exception.message)
        self.assertEqual(cm.exception.code, kvharbor.StatusCode.PERMISSION_DENIED)

    def test_missing_or_unknown_token(self):
        anonymous = self.client(self.daemon, tls_ca_file=self.ca)
        with self.assertRaises(kvharbor.UnauthenticatedError):
            anonymous.list_namespaces()
        stranger = self.client(self.daemon, tls_ca_file=self.ca,
                               token="not-a-known-token-0123456789")
        with self.assertRaises(kvharbor.UnauthenticatedError) as cm:
            stranger.list_namespaces()
        self.assertNotIn("not-a-known-token", str(cm.exception))

    def test_plaintext_client_cannot_talk_to_tls_daemon(self):
        plain = self.client(self.daemon)
        with self.assertRaises(kvharbor.KvHarborError):
            plain.list_namespaces(timeout=2)

    def test_bad_arguments_name_the_field(self):
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            kvharbor.Client(self.daemon.address, token=b"secret-bytes-token")
        self.assertIn("token", cm.exception.message)
        self.assertNotIn("secret", str(cm.exception))
        with self.assertRaises(kvharbor.InvalidArgumentError) as cm:
            kvharbor.Client(self.daemon.address, tls_ca_file="")
        self.assertIn("tls_ca_file", cm.exception.message)
        with self.assertRaises(kvharbor.KvHarborError) as cm:
            kvharbor.Client(self.daemon.address,
                            tls_ca_file=os.path.join(self.dir.name, "nope.crt"))
        self.assertIn("nope.crt", cm.exception.message)

    def test_mutual_tls(self):
        with_cert = self.client(self.mtls, tls_ca_file=self.ca,
                                tls_cert_file=self.cert, tls_key_file=self.key)
        self.assertIsInstance(with_cert.list_namespaces(), list)
        without = self.client(self.mtls, tls_ca_file=self.ca)
        with self.assertRaises(kvharbor.KvHarborError):
            without.list_namespaces(timeout=2)


if __name__ == "__main__":
    unittest.main()
