"""`python -m jax_flashoverlap.info`: prints `jax_flashoverlap.info()` as JSON."""

import sys

from jax_flashoverlap._info import main

if __name__ == "__main__":
  sys.exit(main())
