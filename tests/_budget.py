"""How many examples the property tests draw: CI's full budget, or a quarter of it every day.

Two hypothesis profiles, chosen by the ``HYPOTHESIS_PROFILE`` environment variable
(or hypothesis' own ``--hypothesis-profile`` option):

* ``ci`` (``.ci/run`` sets it): every test's full budget, in the settings hypothesis
  picks by itself (its ``default`` profile, or its own ``ci`` one where it detects a
  CI service), so CI draws what it always drew;
* ``dev``, the default: the same settings with a quarter of each budget, for the
  everyday ``python -m pytest -q -m "not slow"``.

A test that wants more or fewer examples than the default states its budget through
:func:`examples`, as a number of examples *under CI*, so the profile scales it::

    @settings(max_examples=examples(150), deadline=None)
"""

from __future__ import annotations

import os

from hypothesis import settings

_FULL = settings()  # what hypothesis would run without this module
settings.register_profile("ci", parent=_FULL)
settings.register_profile("dev", parent=_FULL, max_examples=max(1, _FULL.max_examples // 4))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def examples(ci: int) -> int:
    """``ci`` examples under the ``ci`` profile, the same share of it under the loaded one."""
    return max(1, ci * settings().max_examples // _FULL.max_examples)
