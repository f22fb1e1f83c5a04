"""The paths a kernel test runs on: every compiled variant, and TensorFlow's ops.

``PATHS`` parametrises a ``use_kernel`` argument: ``True`` once per variant
of the compiled kernels (``avx512``, ``avx2``, ``portable``; the variants the
CPU lacks are skipped, saying so) and ``False`` for the pure-TensorFlow path.
``VARIANTS`` parametrises a ``variant`` argument of tests that compare the
compiled kernels with the fallback themselves; ``variant_marks`` gives the
marks for cases of one variant with other parameters. tests/conftest.py
runs each case inside ``kernels.use_isa`` of its variant (the ``isa`` mark).
"""

import pytest

from tfsparse.ops import kernels


def variant_marks(isa):
    """The marks of a case on variant ``isa``: run under it, skipped where the CPU lacks it."""
    if not kernels.available():
        reason = "compiled kernels not built (python -m tfsparse.ops.build)"
    else:
        reason = (f"this CPU lacks the {isa} variant (it supports "
                  f"{', '.join(kernels.supported_isas())})")
    return [pytest.mark.isa(isa), pytest.mark.skipif(isa not in kernels.supported_isas(), reason=reason)]


PATHS = [pytest.param(True, id=isa, marks=variant_marks(isa)) for isa in kernels.ISAS] + [
    pytest.param(False, id="tensorflow")
]
VARIANTS = [pytest.param(isa, id=isa, marks=variant_marks(isa)) for isa in kernels.ISAS]
