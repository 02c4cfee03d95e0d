"""``python -m symmoe.bench``: the GPU benchmark (``symmoe.bench.gpu``), the same as ``symmoe bench``
with the options of ``symmoe.bench.gpu.main``."""
from .gpu import main

if __name__ == "__main__":
    raise SystemExit(main())
