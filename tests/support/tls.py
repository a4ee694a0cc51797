"""A throw-away certificate authority and a server certificate for 127.0.0.1/localhost,
made with the ``openssl`` command (no Python dependency), for a TLS redis-server."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import services

# P-256 keys: generated in milliseconds, unlike RSA.
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA certificate clients trust, and the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path, *, client_auth: bool = False) -> TlsFiles:
    """A fresh CA and a server certificate signed by it, valid for two days; with
    ``client_auth`` the certificate may also identify a client (Redis Cluster nodes present
    theirs to each other on the cluster bus, and verify it)."""
    openssl = services.openssl()
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    ca_key, csr = directory / "ca.key", directory / "server.csr"
    extensions = directory / "server.ext"
    usage = "serverAuth, clientAuth" if client_auth else "serverAuth"
    extensions.write_text(
        _SERVER_EXTENSIONS.replace("extendedKeyUsage = serverAuth", f"extendedKeyUsage = {usage}"),
        "ascii",
    )
    _run(
        openssl, "req", "-x509", *_KEY, "-keyout", ca_key, "-out", files.ca, "-days", "2",
        "-subj", "/CN=convoq throw-away test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    _run(openssl, "req", "-new", *_KEY, "-keyout", files.key, "-out", csr, "-subj", "/CN=localhost")
    _run(
        openssl, "x509", "-req", "-in", csr, "-CA", files.ca, "-CAkey", ca_key,
        "-CAcreateserial", "-out", files.cert, "-days", "2", "-extfile", extensions,
    )  # fmt: skip
    return files


def _run(*command: str | Path) -> None:
    done = subprocess.run([str(c) for c in command], capture_output=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{command[1]} failed: {done.stderr.decode(errors='replace')}")
