"""Installs stand-in modules for an engine package (vllm, sglang) for one
test: the integrations create their engine subclasses from whatever
sys.modules holds, so a test can check that path on a machine without the
engine. The stand-ins hold only what the tests define in them."""

import sys
import types


def install(test, modules, forget=()):
    """Puts ``modules`` (name -> module; parent packages are added empty)
    into sys.modules until the end of ``test``; then restores what was
    there and removes the attributes ``forget`` lists ((module, name)
    pairs: classes made from the stand-ins)."""
    names = set(modules)
    for name in list(modules):
        parts = name.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    mods = {n: modules.get(n) or types.ModuleType(n) for n in names}
    saved = {n: sys.modules.get(n) for n in mods}
    sys.modules.update(mods)

    def restore():
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
        for module, attr in forget:
            module.__dict__.pop(attr, None)

    test.addCleanup(restore)
    for module, attr in forget:
        module.__dict__.pop(attr, None)
