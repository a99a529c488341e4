#!/usr/bin/python3
"""grpc.health.v1.Health/Check against kvharbord; exit 0 only when SERVING.

The container images' HEALTHCHECK. Debian's (and Ubuntu's) python3-grpcio
ships the gRPC runtime but not the generated grpc_health.v1 stubs, and
grpc_health_probe is not packaged, so this speaks the two tiny messages of
grpc/health/v1/health.proto by hand:

  HealthCheckRequest  { string service = 1; }
  HealthCheckResponse { ServingStatus status = 1; }  // SERVING = 1

kvharbord reports SERVING for "" and "kvharbor.v1.KvHarbor" while it serves
and NOT_SERVING from the moment it gets SIGTERM (server/daemon/daemon.cc).

Usage: kvharbor-healthcheck [--addr=HOST:PORT] [--service=NAME] [--timeout=S]
         [--tls_ca=FILE [--tls_server_name=NAME] [--tls_cert=FILE --tls_key=FILE]]
The address defaults to $KVHARBOR_HEALTH_ADDR, else 127.0.0.1:50051. With
--tls_ca (a daemon with security.tls on; Kubernetes' native gRPC probes cannot
do TLS) it connects over TLS, checking the daemon's certificate against that
CA and for NAME; --tls_cert/--tls_key present a client certificate (mutual
TLS). Health needs no bearer token.
Exit status: 0 SERVING, 1 anything else (printed on stderr), 2 bad usage.
"""
import argparse
import os
import sys

import grpc

_STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING",
                 3: "SERVICE_UNKNOWN"}


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data, pos):
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def encode_request(service):
    """HealthCheckRequest; an empty service is the empty message."""
    name = service.encode("utf-8")
    return b"\x0a" + _varint(len(name)) + name if name else b""


def decode_status(data):
    """ServingStatus of a HealthCheckResponse (0 = UNKNOWN when absent)."""
    status, pos = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if field == 1:
                status = value
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
    if pos != len(data):
        raise ValueError("truncated message")
    return status


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _channel(args):
    if not args.tls_ca:
        return grpc.insecure_channel(args.addr)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(args.tls_ca),
        private_key=_read(args.tls_key) if args.tls_key else None,
        certificate_chain=_read(args.tls_cert) if args.tls_cert else None)
    options = ([("grpc.ssl_target_name_override", args.tls_server_name)]
               if args.tls_server_name else [])
    return grpc.secure_channel(args.addr, creds, options=options)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default=os.environ.get(
        "KVHARBOR_HEALTH_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--service", default="")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--tls_ca", default="")
    parser.add_argument("--tls_server_name", default="")
    parser.add_argument("--tls_cert", default="")
    parser.add_argument("--tls_key", default="")
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls_cert and --tls_key go together")
    if (args.tls_cert or args.tls_server_name) and not args.tls_ca:
        parser.error("--tls_cert and --tls_server_name need --tls_ca")
    with _channel(args) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            reply = check(encode_request(args.service), timeout=args.timeout)
            status = decode_status(reply)
        except grpc.RpcError as e:
            print("kvharbor-healthcheck: %s: %s: %s" % (
                args.addr, e.code().name, e.details()), file=sys.stderr)
            return 1
        except ValueError as e:
            print("kvharbor-healthcheck: %s: bad reply: %s" % (args.addr, e),
                  file=sys.stderr)
            return 1
    name = _STATUS_NAMES.get(status, str(status))
    if status != 1:
        print("kvharbor-healthcheck: %s: %s" % (args.addr, name),
              file=sys.stderr)
        return 1
    print("%s %s" % (args.addr, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
