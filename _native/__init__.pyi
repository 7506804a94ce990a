# One stub for both implementations of every kernel module (drf, fit, scoring).
# The real modules are _native.{drf,fit,scoring}_{c,py}; callers import the
# selected ones as `from _native import drf, fit, scoring`.
from types import ModuleType

NO_EXTENSIONS: bool
IMPLEMENTATION: str  # "c" or "py"
drf: ModuleType
fit: ModuleType
scoring: ModuleType
