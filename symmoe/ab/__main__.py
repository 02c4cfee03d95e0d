"""``python -m symmoe.ab SPEC.yaml ...``: the same as ``symmoe ab``."""
import sys

from .cli import main

sys.exit(main())
