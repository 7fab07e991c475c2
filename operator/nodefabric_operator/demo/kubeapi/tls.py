"""A self-signed serving certificate for the embedded API on 127.0.0.1, so that it can require a token:
kubectl (client-go) sends a kubeconfig's credentials only over TLS.

The certificate is its own CA (the kubeconfig's `certificate-authority-data`), for 127.0.0.1 and
localhost, valid for 30 days; the key file is 0600.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class ServingCert:
    cert_file: str
    key_file: str
    pem: bytes  # the certificate, which clients trust as their CA

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def self_signed(directory: str, name: str = "apiserver") -> ServingCert:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodefabric embedded API")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(key_file, key_pem, 0o600)
    _write(cert_file, pem, 0o644)
    return ServingCert(cert_file, key_file, pem)


def _write(path: str, data: bytes, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
