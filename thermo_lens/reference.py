"""Old import path of :mod:`thermo_lens.paper.reference` (the paper's per-model numbers).

``thermo_lens.reference`` *is* ``thermo_lens.paper.reference`` (the same module object), so
everything, including monkeypatching in tests, behaves as before.
"""

import sys

from thermo_lens.paper import reference as _reference

sys.modules[__name__] = _reference
