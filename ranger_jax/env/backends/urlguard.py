"""The URL guard: every page fetch and image download, on every redirect hop, goes through `UrlGuard.resolve`.

A URL passes only if its scheme is http(s) and every address its host resolves to is a public unicast address.
IP literals are recognised in every spelling a resolver accepts (dotted, decimal `2130706433`, hex `0x7f000001`,
octal `0177.0.0.1`, short `127.1`, bracketed IPv6, IPv4-mapped / 6to4 / Teredo / NAT64 IPv6, trailing dots),
and `localhost` names are refused without a lookup. Hosts listed in `allow_hosts` (`"host:port"` or `"host"`)
skip the address checks; tests use this for their loopback servers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
import urllib.parse

from ranger_jax.env.backends import base

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UrlRefused(base.BackendError):
    """A URL the guard will not fetch; the message names the URL and the reason."""

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"refused to fetch {url}: {reason}")


class HostUnresolved(base.BackendError):
    """A URL whose host name does not resolve (a wrong name or a DNS failure), which is not a refusal."""

    def __init__(self, url: str, host: str, reason: str):
        self.url, self.host, self.reason = url, host, reason
        super().__init__(f"cannot resolve host {host!r} of {url} ({reason}); the name may be wrong or DNS may be "
                         "unavailable")


@dataclasses.dataclass(frozen=True)
class Target:
    """A URL that passed the guard.

    Attributes:
        url: the URL as given.
        scheme: `http` or `https`.
        host: the normalised host name (lower case, no brackets, no trailing dot).
        port: the explicit or default port.
        address: the checked address to connect to, or None for an allowed host (connect by name).
    """

    url: str
    scheme: str
    host: str
    port: int
    address: str | None


def normalise_host(host: str) -> str:
    """Lower case, brackets and IPv6 zone (`%eth0`) removed, trailing dots stripped."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host.split("%", 1)[0]:  # a zone id only follows an IPv6 address; elsewhere "%" stays (and is refused)
        host = host.split("%", 1)[0]
    return host.rstrip(".")


_BAD_HOST_CHARS = frozenset("%\\ \t\r\n/@?#")


def parse_ip(host: str) -> IPAddress | None:
    """The address an IP-literal host denotes in any resolver-accepted spelling, or None for a name."""
    host = normalise_host(host)
    if not host:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not all(c.isalnum() or c == "." for c in host):
        return None
    try:  # inet_aton accepts decimal, hex, octal and short dotted forms, as getaddrinfo does
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: IPAddress) -> str | None:
    """Why `ip` must not be contacted, or None when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None and (problem := address_problem(inner)):
            return f"{problem} (IPv4 {inner} embedded in IPv6 {ip})"
    for flag, name in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_reserved", "reserved"),
        ("is_private", "private"),
    ):
        if getattr(ip, flag):
            return f"{name} address {ip}"
    if not ip.is_global:
        return f"non-public address {ip}"
    return None


def _is_localhost_name(host: str) -> bool:
    return host == "localhost" or host.endswith(".localhost") or host in ("localhost.localdomain", "ip6-localhost")


class UrlGuard:
    """Checks URLs against the address policy above.

    Args:
        allow_hosts: `"host:port"` or `"host"` entries exempt from the address checks (tests only).
    """

    def __init__(self, allow_hosts: tuple[str, ...] | list[str] = ()):
        allowed = set()
        for entry in allow_hosts:
            if not isinstance(entry, str) or not entry.strip():
                raise ValueError(f"allow_hosts entries must be 'host:port' or 'host' strings; got {entry!r}")
            host, sep, port = entry.strip().rpartition(":")
            if sep and port.isdigit() and not host.endswith(":"):
                allowed.add((normalise_host(host), int(port)))
            else:
                allowed.add((normalise_host(entry), None))
        self.allow_hosts = frozenset(allowed)

    def is_allowed(self, host: str, port: int) -> bool:
        """Whether `host:port` is on the explicit allow list (which bypasses the address checks)."""
        return (host, port) in self.allow_hosts or (host, None) in self.allow_hosts

    def check_syntax(self, url: str) -> tuple[Target, IPAddress | None]:
        """Checks what can be known without DNS; returns the target and its IP literal if it has one.

        Raises:
            UrlRefused: naming the URL and the reason.
        """
        if not isinstance(url, str) or not url.strip():
            raise UrlRefused(repr(url), "not a URL")
        try:
            parts = urllib.parse.urlsplit(url.strip())
            port = parts.port
        except ValueError as err:
            raise UrlRefused(url, f"malformed URL ({err})") from err
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise UrlRefused(url, f"scheme {scheme or '(none)'!r} is not http or https")
        host = normalise_host(parts.hostname or "")
        if not host:
            raise UrlRefused(url, "no host")
        if bad := sorted(_BAD_HOST_CHARS & set(host)):
            raise UrlRefused(url, f"host {host!r} contains characters a host name cannot have ({''.join(bad)!r})")
        port = port if port is not None else _DEFAULT_PORTS[scheme]
        if self.is_allowed(host, port):
            return Target(url, scheme, host, port, None), None
        if _is_localhost_name(host):
            raise UrlRefused(url, f"host {host!r} is the local machine")
        ip = parse_ip(host)
        if ip is not None and (problem := address_problem(ip)):
            raise UrlRefused(url, problem)
        return Target(url, scheme, host, port, str(ip) if ip is not None else None), ip

    async def resolve(self, url: str) -> Target:
        """Checks `url`, resolving its host name, and returns the address to connect to.

        Raises:
            UrlRefused: naming the URL and the reason (bad scheme, forbidden address).
            HostUnresolved: the host name does not resolve to any address.
        """
        target, ip = self.check_syntax(url)
        if ip is not None or self.is_allowed(target.host, target.port):
            return target
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as err:
            raise HostUnresolved(url, target.host, str(err)) from err
        addresses = []
        for info in infos:
            address = ipaddress.ip_address(normalise_host(str(info[4][0])))
            if problem := address_problem(address):
                raise UrlRefused(url, f"host {target.host!r} resolves to a {problem}")
            addresses.append(str(address))
        if not addresses:
            raise HostUnresolved(url, target.host, "no addresses")
        return dataclasses.replace(target, address=addresses[0])
