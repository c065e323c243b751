"""Hypothesis profiles, all but ``thorough`` derandomized so runs are reproducible: ``default`` (14 examples a
property: the fast suite stays under 10 minutes on 2 cores now that a drawn block has 30 spelling axes and a
float16 one is validated far more often than it was rolled back), ``ci``
(60, run by .ci/run after the fast suite) and ``thorough`` (≥2,000, random):
``HYPOTHESIS_PROFILE=thorough python -m pytest tests/property``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("default", max_examples=14, derandomize=True, **_COMMON)
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=2000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
