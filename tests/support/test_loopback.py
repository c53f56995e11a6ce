import socket
import struct
import time

import httpx

from support.loopback import LoopbackServer, Reply


def test_routes_faults_and_counts():
    with LoopbackServer() as server:
        server.route("POST", "/echo", lambda req: Reply.json({"got": req.json()}))
        server.fail_next("POST", "/echo", Reply(status=503))
        with httpx.Client(base_url=server.url) as client:
            assert client.post("/echo", json={"a": 1}).status_code == 503
            assert client.post("/echo", json={"a": 1}).json() == {"got": {"a": 1}}
            assert client.get("/missing").status_code == 404
        assert server.count("POST", "/echo") == 2


def _hang_up_with_reset(port: int, request: bytes) -> None:
    """Sends `request` and closes the socket with an RST (SO_LINGER 0), as a client giving up on a reply does."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_that_hangs_up_prints_no_traceback_and_the_server_goes_on(capfd):
    with LoopbackServer() as server:
        server.route("GET", "/slow", lambda req: Reply.text("late", delay_s=0.2))
        server.route("GET", "/broken", lambda req: 1 / 0)
        _hang_up_with_reset(server.port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        _hang_up_with_reset(server.port, b"GET /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        time.sleep(0.5)  # the replies are written into the reset connections
        with httpx.Client(base_url=server.url) as client:
            reply = client.get("/broken")
        assert reply.status_code == 500 and "ZeroDivisionError" in reply.text
        assert server.count("GET", "/slow") == 1  # the second hung up before its body arrived
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
