"""An in-process gateway on a real engine, for tests that drive it over HTTP with SDKs."""
import contextlib

from actorjet.models import zoo
from actorjet.serving.gateway_app import GatewayApp, local_backend
from actorjet.serving.serve import AppServer
from actorjet.serving.transformers_engine import TransformersEngine


@contextlib.contextmanager
def tiny_gateway(secret: str, default_max_tokens: int = 6, source: str = "tiny-arith", name: str = "tiny"):
    """A zoo model (tiny-arith unless told) behind a gateway on a free port: (GatewayApp, AppServer)."""
    engine = TransformersEngine(zoo.resolve(source))
    gw = GatewayApp(name, engine.tokenizer, local_backend(engine), secret, engine.max_len,
                    default_max_tokens=default_max_tokens)
    server = AppServer(gw.app())
    try:
        yield gw, server
    finally:
        server.stop()
        engine.close()
