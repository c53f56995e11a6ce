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
