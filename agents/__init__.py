"""Example behaviors and task sources (docs/writing-an-agent.md).

Why there is code here: the OpenAI Agents SDK (``pip install openai-agents``) is imported as
``agents`` too, so this package and the SDK would shadow each other, and which one ``import
agents`` finds depends on how Python was started (the repository on ``sys.path`` or not).
Both work side by side instead.  If the SDK is installed, its folder joins this package's
search path, and the first name asked of this package that is none of its own modules
(``from agents import Agent, Runner``) runs the SDK's ``__init__`` in it.  When Python finds
the SDK first, this package's modules load as the SDK's submodules (the editable install's
finder finds them) and the SDK's whole ``__init__`` runs first; importing ``actorjet`` avoids that
by loading this package first (actorjet/__init__.py).  No module here shares a name with one of the SDK's
(tests/test_frameworks.py checks it).
"""
import os as _os
import sys as _sys


def _sdk_folder() -> str | None:
    here = _os.path.dirname(_os.path.abspath(__file__))
    for entry in _sys.path:
        folder = _os.path.join(_os.path.abspath(entry or "."), "agents")
        if folder != here and _os.path.isfile(_os.path.join(folder, "run.py")) \
                and _os.path.isfile(_os.path.join(folder, "__init__.py")):
            return folder
    return None


_SDK = _sdk_folder()
if _SDK is not None:
    __path__.append(_SDK)


def __getattr__(name: str):
    """Load the Agents SDK's names into this package on first use (only then: it is heavy)."""
    if _SDK is None or name.startswith("__"):
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    del globals()["__getattr__"]
    init = _os.path.join(_SDK, "__init__.py")
    with open(init) as f:
        exec(compile(f.read(), init, "exec"), globals())
    if name not in globals():
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    return globals()[name]
