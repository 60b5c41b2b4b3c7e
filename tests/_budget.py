"""How many examples the property tests draw: CI's full budget, or a quarter of it every day.

Two hypothesis profiles, chosen by the ``HYPOTHESIS_PROFILE`` environment variable
(or hypothesis' own ``--hypothesis-profile`` option):

* ``ci`` (``.ci/run`` sets it): every test's full budget, hypothesis' default of 100
  examples where a test names none, so CI draws what it always drew;
* ``dev``, the default: a quarter of each budget, for the everyday
  ``python -m pytest -q -m "not slow"``.

A test that wants more or fewer examples than the default states its budget through
:func:`examples`, as a number of examples *under CI*, so the profile scales it too::

    @settings(max_examples=examples(150), deadline=None)
"""

from __future__ import annotations

import os

from hypothesis import settings

CI_EXAMPLES = 100  # hypothesis' own default: the budget of a test that names none

settings.register_profile("ci", max_examples=CI_EXAMPLES)
settings.register_profile("dev", max_examples=CI_EXAMPLES // 4)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def examples(ci: int) -> int:
    """``ci`` examples under the ``ci`` profile, the same share of it under the loaded one."""
    return max(1, ci * settings.default.max_examples // CI_EXAMPLES)
