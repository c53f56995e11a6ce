import asyncio
import ipaddress
import socket

import httpx
import pytest

from ranger_jax.env.backends import transport, urlguard


def resolve(url, allow=()):
    return asyncio.run(urlguard.UrlGuard(allow).resolve(url))


@pytest.mark.parametrize("url, reason", [
    ("http://127.0.0.1/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://0x7f000001/", "loopback"),
    ("http://0177.0.0.1/", "loopback"),
    ("http://127.1/", "loopback"),
    ("http://0x7f.1/", "loopback"),
    ("http://127.0.0.1./admin", "loopback"),
    ("http://[::1]:8080/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://[::ffff:7f00:1]/", "loopback"),
    ("http://[64:ff9b::7f00:1]/", "loopback"),
    ("http://[2002:7f00:1::]/", "loopback"),
    ("http://localhost/", "local machine"),
    ("http://LocalHost./", "local machine"),
    ("http://api.localhost:9000/", "local machine"),
    ("http://user:pw@127.0.0.1/", "loopback"),
    ("http://example.com@127.0.0.1/", "loopback"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://0/", "unspecified"),
    ("http://[::]/", "unspecified"),
    ("http://10.1.2.3/", "private"),
    ("http://172.16.5.4/", "private"),
    ("http://192.168.0.1/", "private"),
    ("http://[fd00::1]/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fe80::1%25eth0]/", "link-local"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://100.64.0.1/", "address 100.64.0.1"),
    ("http://127.000.000.001/", "loopback"),
    ("http://0x7f.0x0.0x0.0x1/", "loopback"),
    ("http://017700000001/", "loopback"),
    ("http://00000177.0.0.1/", "loopback"),
    ("HTTP://127.0.0.1:80/", "loopback"),
    ("http://a:b@127.0.0.1:80/", "loopback"),
    ("http://8.8.8.8\\@127.0.0.1/", "loopback"),
    ("http://[0:0:0:0:0:ffff:127.0.0.1]/", "loopback"),
    ("http://[0000::1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "link-local"),
    ("http://[::ffff:a00:1]/", "private"),
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "loopback"),  # Teredo around 127.0.0.1
    ("http://[::127.0.0.1]/", "reserved"),
    ("http://\uff11\uff12\uff17.0.0.1/", "loopback"),  # fullwidth digits: IDNA maps them to 127.0.0.1
    ("http://127.0.0.1%2f/", "characters a host name cannot have"),
    ("http://example.com%00.127.0.0.1/", "characters a host name cannot have"),
    ("data:text/html,<h1>x</h1>", "scheme 'data'"),
    ("//127.0.0.1/", r"scheme '\(none\)'"),
    ("ftp://example.com/file", "scheme 'ftp'"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("javascript:alert(1)", "scheme 'javascript'"),
    ("example.com/page", "scheme"),
    ("http:///path-only", "no host"),
    ("http://example.com:99999/", "malformed"),
    ("", "not a URL"),
])
def test_forbidden_urls_are_refused_with_url_and_reason(url, reason):
    with pytest.raises(urlguard.UrlRefused, match=reason) as info:
        resolve(url)
    assert url in str(info.value) or not url


def test_names_are_checked_after_resolution():
    host = socket.gethostname()
    addresses = {info[4][0] for info in socket.getaddrinfo(host, 80, type=socket.SOCK_STREAM)}
    if all(ipaddress.ip_address(a).is_global for a in addresses):
        pytest.skip(f"{host} resolves to public addresses here")
    with pytest.raises(urlguard.UrlRefused, match=f"host '{host}' resolves to a"):
        resolve(f"http://{host}/")


def test_a_host_that_does_not_resolve_is_not_a_refused_url():
    with pytest.raises(urlguard.HostUnresolved, match=r"cannot resolve host 'no-such-host.invalid' of "
                                                      r"http://no-such-host.invalid/ \(") as info:
        resolve("http://no-such-host.invalid/")
    assert not isinstance(info.value, urlguard.UrlRefused) and "refused" not in str(info.value)


def test_allowed_hosts_skip_the_address_checks_for_their_port_only():
    target = resolve("http://127.0.0.1:8080/x", allow=("127.0.0.1:8080",))
    assert (target.host, target.port, target.address) == ("127.0.0.1", 8080, None)
    with pytest.raises(urlguard.UrlRefused, match="loopback"):
        resolve("http://127.0.0.1:8081/x", allow=("127.0.0.1:8080",))
    assert resolve("http://[::1]:7/", allow=("[::1]:7",)).host == "::1"
    assert resolve("http://localhost:5/", allow=("localhost",)).port == 5
    with pytest.raises(ValueError, match="allow_hosts entries"):
        urlguard.UrlGuard(("",))


def test_public_literals_pass_and_are_pinned():
    target = resolve("https://93.184.216.34:8443/a?b=1")
    assert target.address == "93.184.216.34"
    pinned_target = urlguard.Target("https://news.example.org/a", "https", "news.example.org", 443, "93.184.216.34")
    request = httpx.Request("GET", "https://news.example.org/a?b=1", headers={"Accept": "text/html"})
    pinned = transport.pinned_request(request, pinned_target)
    assert str(pinned.url) == "https://93.184.216.34/a?b=1"
    assert pinned.headers["Host"] == "news.example.org" and pinned.headers["Accept"] == "text/html"
    assert pinned.extensions["sni_hostname"] == "news.example.org"
    v6 = urlguard.Target("http://v6.example.org/", "http", "v6.example.org", 80, "2606:2800:220:1::1")
    assert transport.pinned_request(httpx.Request("GET", "http://v6.example.org/"), v6).url.host == "2606:2800:220:1::1"


def test_pinning_follows_the_checked_address_not_the_spelling():
    # httpx and urllib may read an odd URL differently; the connection must go where the guard looked
    target = urlguard.Target("http://0x5db8d822/a", "http", "0x5db8d822", 80, "93.184.216.34")
    pinned = transport.pinned_request(httpx.Request("GET", "http://0x5db8d822/a"), target)
    assert pinned.url.host == "93.184.216.34" and pinned.headers["Host"] == "0x5db8d822"
    odd = urlguard.Target("http://evil.example/", "http", "8.8.8.8", 80, "8.8.8.8")
    assert transport.pinned_request(httpx.Request("GET", "http://evil.example/"), odd).url.host == "8.8.8.8"
    same = urlguard.Target("http://8.8.8.8/", "http", "8.8.8.8", 80, "8.8.8.8")
    request = httpx.Request("GET", "http://8.8.8.8/")
    assert transport.pinned_request(request, same) is request
