"""`python -m gpudoc ARGS...`: runs the `gpudoc` binary that pip installed beside this package, as if it
had been called by name (for environments whose scripts folder is not on PATH)."""
from __future__ import annotations

import os
import sys
import sysconfig
from typing import List, Optional


def find_gpudoc() -> str:
    """The `gpudoc` binary of this installation: in the scripts folder of the scheme this package was
    installed with (a venv's, the user's, the system's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    schemes: List[Optional[str]] = [None]
    if hasattr(sysconfig, "get_preferred_scheme"):
        schemes.append(sysconfig.get_preferred_scheme("user"))
    else:
        schemes.append(os.name + "_user")
    for scheme in schemes:
        try:
            paths = sysconfig.get_paths(scheme) if scheme else sysconfig.get_paths()
        except KeyError:
            continue
        purelib = os.path.realpath(paths.get("purelib", ""))
        if scheme is None or os.path.realpath(os.path.dirname(here)) == purelib:
            candidate = os.path.join(paths["scripts"], "gpudoc")
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    # Installed with --target or --prefix: the scripts folder sits beside lib/pythonX.Y/site-packages.
    prefix = here
    for _ in range(4):
        prefix = os.path.dirname(prefix)
    candidate = os.path.join(prefix, "bin", "gpudoc")
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    raise FileNotFoundError("the gpudoc binary of this installation was not found beside " + here)


if __name__ == "__main__":
    gpudoc = find_gpudoc()
    os.execv(gpudoc, [gpudoc] + sys.argv[1:])
