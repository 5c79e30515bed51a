"""Certificates and keys of one dev cluster, made with the ``cryptography`` library.

A fresh CA per run signs: the kube-apiserver serving certificate (loopback IPs,
``localhost``, the in-cluster ``kubernetes.default.svc`` names and the first service
IP), the serving certificate of each local webhook server in WEBHOOK_SERVERS (loopback
only: the API server calls them at ``https://127.0.0.1:<port>``, trusting this CA through
the webhook configuration's ``caBundle``), and client certificates for the admin (group
``system:masters``), the controller manager and the scheduler (their built-in RBAC
identities), kwok and the LWS controller. A separate key signs service-account tokens. All keys are ECDSA P-256: fast to generate, accepted by every
component. Nothing here talks to a process; ``cluster`` passes the file paths on.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Client identities: file stem -> (common name, organisations).
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("sglang-pd-dev-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    # kwok plays every kubelet (nodes, node leases, pod status); it runs as an admin.
    "kwok": ("kwok-controller", ("system:masters",)),
    # The LeaderWorkerSet controller: no group; bound to LWS's own ClusterRole (``lws``).
    "lws-controller": ("lws-controller-manager", ()),
    # Kueue (optional): no group; bound to Kueue's own manager ClusterRole (``kueue``).
    "kueue-controller": ("kueue-controller-manager", ()),
}
#: Webhook servers run on this machine: name -> SANs (DNS names and IPs) of their serving
#: certificate. The files land in ``<pki>/<name>-webhook/tls.crt|tls.key``, the names
#: controller-runtime's webhook server reads from its CertDir.
WEBHOOK_SERVERS: dict[str, tuple[str, ...]] = {"lws": ("localhost", "127.0.0.1"),
                                                "kueue": ("localhost", "127.0.0.1")}
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written by :func:`write_pki` (all under one directory)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        """Service-account token signing key (private, PKCS#8)."""
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        """Service-account token verification key (public)."""
        return self.dir / "sa.pub"

    def client_cert(self, name: str) -> Path:
        """Client certificate of one of CLIENTS, e.g. ``client_cert("admin")``."""
        return self.dir / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def webhook_cert_dir(self, name: str) -> Path:
        """CertDir of webhook server ``name`` (WEBHOOK_SERVERS): holds tls.crt and tls.key."""
        return self.dir / f"{name}-webhook"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(*, subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + _VALIDITY))


def _name(common_name: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name(attrs + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _leaf(*, ca_key, ca_name: x509.Name, key, subject: x509.Name,
          usage: list[x509.ObjectIdentifier], sans: list[x509.GeneralName] | None = None):
    builder = (_builder(subject=subject, issuer=ca_name, public_key=key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _sans(names: tuple[str, ...] | list[str]) -> list[x509.GeneralName]:
    """DNS names and IP addresses (told apart by parsing) as SubjectAlternativeName entries."""
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    return sans


def serving_sans(*, service_ip: str) -> list[x509.GeneralName]:
    """SANs of the apiserver certificate: loopback, localhost, in-cluster names, service IP."""
    return _sans(["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local", "127.0.0.1", "::1", service_ip])


def write_pki(directory: Path, *, service_ip: str) -> Pki:
    """Generate a CA, the serving certs (apiserver, WEBHOOK_SERVERS), the CLIENTS certs and
    the SA key into ``directory``.

    ``service_ip`` is the first IP of the service CIDR (the ``kubernetes`` Service's
    ClusterIP), which in-cluster clients dial. Overwrites existing files. Takes ~50 ms.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(dir=directory)
    ca_key = _key()
    ca_name = _name("sglang-pd-dev-ca")
    ca = (_builder(subject=ca_name, issuer=ca_name, public_key=ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                       content_commitment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca)

    key = _key()
    _write_key(pki.serving_key, key)
    _write_cert(pki.serving_cert, _leaf(
        ca_key=ca_key, ca_name=ca_name, key=key, subject=_name("kube-apiserver"),
        usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=serving_sans(service_ip=service_ip)))

    for name, sans in WEBHOOK_SERVERS.items():
        folder = pki.webhook_cert_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        key = _key()
        _write_key(folder / "tls.key", key)
        _write_cert(folder / "tls.crt", _leaf(
            ca_key=ca_key, ca_name=ca_name, key=key, subject=_name(f"{name}-webhook"),
            usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=_sans(sans)))

    for stem, (common_name, orgs) in CLIENTS.items():
        key = _key()
        _write_key(pki.client_key(stem), key)
        _write_cert(pki.client_cert(stem), _leaf(
            ca_key=ca_key, ca_name=ca_name, key=key, subject=_name(common_name, orgs),
            usage=[ExtendedKeyUsageOID.CLIENT_AUTH]))

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
