# One stub for both implementations of every kernel module (drf, fit, names, scoring).
# The real modules are _native.{drf,fit,names,scoring}_{c,py}; callers import the
# selected ones as `from _native import drf, fit, names, scoring`.
from types import ModuleType

NO_EXTENSIONS: bool
IMPLEMENTATION: str  # "c" or "py"
drf: ModuleType
fit: ModuleType
names: ModuleType
scoring: ModuleType
