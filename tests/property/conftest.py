"""Hypothesis profiles: ``default`` (CI: ≥100 examples a property, derandomized so CI is reproducible) and
``thorough`` (≥2,000, random): ``HYPOTHESIS_PROFILE=thorough python -m pytest tests/property``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("default", max_examples=100, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=2000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
