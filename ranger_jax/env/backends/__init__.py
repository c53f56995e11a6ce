"""Search and fetch backends of the tool environment.

Modules: `base` (the `Backend` contract, hit and page records, backend errors), `offline` (the offline world's
corpus), `live` (Serper search plus guarded web fetches), `serper` (`SerperClient`), `web` (`WebFetcher`),
`urlguard` (`UrlGuard`: which URLs may be fetched) and `transport` (the httpx transport that enforces it on every
redirect hop). They are listed in `__all__` but not imported here: the environment imports a backend only when a
config asks for it, so an offline run never loads the web stack and a live one never loads the world renderer.
"""

__all__ = ["base", "live", "offline", "serper", "transport", "urlguard", "web"]
